#!/usr/bin/env bash
# First checks for a machine with 1-8 NVIDIA GPUs (dmt's CI has none; run this after
# `DMT_VARIANT=gpu bash scripts/setup.sh`). Every step prints PASS, FAIL or SKIP (with the
# reason); the exit status is the number of failures, or 125 when there is nothing to check (no
# GPU, or a CPU build of torch or FBGEMM), or 1 when nvidia-smi lists GPUs that torch cannot use. Logs and the benchmarks' JSON are kept in
# $DMT_ACCEPTANCE_OUT (default gpu_acceptance_out/<date>-<time>); the runs' directories go to a
# temporary directory, removed at the end.
#   bash scripts/gpu_acceptance.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
WORK="$(mktemp -d -t dmt-gpu-acceptance.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
# one copy per machine: in a step of several SLURM tasks every task would run every check
if [[ "${SLURM_STEP_NUM_TASKS:-1}" -gt 1 ]]; then
  echo "run one copy of this script (srun --ntasks=1, or in the sbatch script itself), not one per task" >&2
  exit 125
fi
# its one-process steps are worlds of one: in an sbatch script of several tasks, dmt would refuse
# them as one of the job's tasks (it starts its multi-process steps with torchrun itself)
unset SLURM_NTASKS SLURM_NPROCS
# the CUDA stack: a CPU build of torch sees no GPU, and FBGEMM's CPU build (fbgemm-gpu-cpu, the
# default setup's) has no CUDA kernels
if ! STACK="$("$PY" - <<'PYEOF'
import torch, fbgemm_gpu
variant = getattr(fbgemm_gpu, "__variant__", "unknown")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), fbgemm_gpu {fbgemm_gpu.__version__} ({variant})")
raise SystemExit(0 if torch.version.cuda and variant != "cpu" else 1)
PYEOF
)"; then
  echo "not a CUDA stack: ${STACK:-torch or fbgemm_gpu does not import}" >&2
  echo "install it with: DMT_VARIANT=gpu bash scripts/setup.sh (it replaces a CPU build)" >&2
  exit 125
fi
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
if [[ "$GPUS" -lt 1 ]]; then
  # GPUs the driver lists that torch cannot use (a driver older than the wheels' CUDA, a broken
  # install) are a failure, not a machine without GPUs
  # (unless they are hidden on purpose: CUDA_VISIBLE_DEVICES set and empty)
  if [[ -z "${CUDA_VISIBLE_DEVICES-unset}" ]]; then
    echo "CUDA_VISIBLE_DEVICES is empty: no GPU to check" >&2
    exit 125
  fi
  if LISTED="$(nvidia-smi -L 2>/dev/null)" && [[ -n "$LISTED" ]]; then
    echo "FAIL: nvidia-smi lists GPUs but torch sees none ($STACK):" >&2
    echo "$LISTED" >&2
    "$PY" -c 'import torch; torch.cuda.init()' 2>&1 | tail -3 >&2
    exit 1
  fi
  echo "no CUDA device ($STACK): nothing to check" >&2
  exit 125
fi
OUT="${DMT_ACCEPTANCE_OUT:-$ROOT/gpu_acceptance_out/$(date +%Y%m%d-%H%M%S)}"
if [[ -e "$OUT" && -n "$(ls -A "$OUT" 2>/dev/null)" ]]; then
  echo "$OUT exists and is not empty: set DMT_ACCEPTANCE_OUT to a new directory" >&2; exit 125
fi
mkdir -p "$OUT"
echo "GPUs visible: $GPUS; $STACK; logs in $OUT"
# physical GPU ids as CUDA_VISIBLE_DEVICES gives them (a shared machine may restrict them)
IFS=, read -ra VISIBLE <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((GPUS - 1)))}"
FAILED=0
step() {  # step NAME COMMAND...
  local name="$1"; shift
  echo "== $name"
  if "$@" > "$OUT/$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name (log: $OUT/$name.log)"; tail -40 "$OUT/$name.log"; FAILED=$((FAILED + 1)); fi
}
skip() { echo "SKIP $1 ($2)"; }  # skip NAME REASON
# pytest_step NAME PYTEST-ARGS...: a step that also fails when no selected test ran (all skipped)
pytest_step() {
  local name="$1"; shift
  step "$name" bash -c 'out="$("$0" -m pytest -q -p no:cacheprovider -rs "$@" 2>&1)"; rc=$?
    echo "$out"; [[ $rc == 0 ]] && grep -q " passed" <<< "$out"' "$PY" "$@"
}
TRAIN=(-m dmt.train logger=disabled trainer.progress_bar=false trainer.device=cuda)
step train_one_gpu "$PY" "${TRAIN[@]}" hydra.run.dir="$WORK/one"
step fused_adam "$PY" "${TRAIN[@]}" optim=adam trainer=smoke hydra.run.dir="$WORK/adam"
# SPTT's lookup calls its FBGEMM kernel straight from the KJT: TorchRec's forward's values and
# fused updates on the GPU too (int64 ids there, where TorchRec's forward casts them to int32)
pytest_step sptt_direct_lookup_cuda tests/unit/test_sptt_lookup.py -k cuda
# DLRM interaction: its own backward (one batched product) equals autograd's on the GPU too
pytest_step dot_interaction_backward_cuda tests/unit/test_models.py -k "backward_is and cuda"
# the dense optimizer's fused CUDA kernel (optim.dense_fused, the default) against torch's loop
pytest_step dense_fused_optimizer_cuda tests/unit/test_generalisation_levers.py -k "fused_one and cuda"
# memory budget: tables that miss sharding.hbm_gb are UVM-cached (flat and SPTT), same training
pytest_step uvm_caching tests/integration/test_sharding_plan.py -k cuda_uvm  # not the CPU one
# a resumed run draws the GPU's dropout masks of an uninterrupted one (the CUDA generator is saved)
pytest_step resume_dropout_cuda \
  "tests/integration/test_train.py::test_resume_with_dropout_draws_the_masks_of_an_uninterrupted_run_cpu_and_cuda[cuda]"
# a resumed fused-Adam run continues FBGEMM's bias-correction step (meta.json fused_optimizer_step)
pytest_step resume_fused_adam_cuda tests/integration/test_train.py -k "fused_adam and cuda"
# evaluation leaves fused Adam's bias-correction step to training (same weights, any eval_every)
pytest_step eval_keeps_fused_adam_step_cuda \
  "tests/integration/test_train.py::test_evaluation_leaves_the_fused_optimizer_step_to_training_cpu_and_cuda[cuda-optim=adam]"
step checkpoint_and_eval bash -c "'$PY' ${TRAIN[*]} trainer=smoke trainer.checkpoint=true hydra.run.dir='$WORK/ck' && '$ROOT/.venv/bin/dmt-eval' --checkpoint '$WORK/ck/checkpoints' --data test --device cuda --out '$WORK/ck/eval.json'"
# two ranks on one GPU are refused at start with dmt's message, not NCCL's at the first collective
step shared_gpu_refused bash -c "CUDA_VISIBLE_DEVICES=${VISIBLE[0]} '$PY' -m torch.distributed.run --standalone --nproc-per-node=2 ${TRAIN[*]} trainer=smoke hydra.run.dir='$WORK/shared' > '$OUT/shared.out' 2>&1; grep 'share one GPU' '$OUT/shared.out'"
# one GPU: dmt against the torchrec_dlrm loop on the Criteo sample (figures in the log, not PASS)
SAMPLE="$ROOT/../shared/data/criteo-kaggle-sample/train.tsv"
if [[ -f "$SAMPLE" ]]; then
  step torchrec_dlrm_one_gpu "$PY" benchmarks/bench_torchrec_dlrm.py --device cuda --runs 3 \
    --steps 200 --warmup 20 --override "data.criteo.preprocessed_dir=$WORK/criteo_sample" \
    --json "$OUT/torchrec_dlrm.json"
  tail -6 "$OUT/torchrec_dlrm_one_gpu.log"
else
  skip torchrec_dlrm_one_gpu "no Criteo sample at $SAMPLE"
fi
# pipelined training equals the plain loop on NCCL (world of one here; 2, 4, 8 ranks as GPUs allow)
pytest_step pipeline_exactness_nccl tests/distributed/test_pipeline.py -m "slow or not slow" -k nccl
if [[ "$GPUS" -ge 2 ]]; then
  step torchrun_flat "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" hydra.run.dir="$WORK/flat2"
  step torchrun_sptt "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 hydra.run.dir="$WORK/sptt2"
  # one GPU per task, as SLURM's --gpus-per-task=1 binds them (each rank sees only cuda:0), and
  # sptt.local_world_size=1 (hosts emulated): the plans place each rank's shards on the GPU it uses
  PER_TASK=(-m torch.distributed.run --standalone --nproc-per-node=2 --no-python bash -c
    'IFS=, read -ra V <<< "$DMT_VISIBLE"; CUDA_VISIBLE_DEVICES=${V[$LOCAL_RANK]} exec "$0" "$@"' "$PY")
  export DMT_VISIBLE="${VISIBLE[*]}"; DMT_VISIBLE="${DMT_VISIBLE// /,}"
  step one_gpu_per_task_flat "$PY" "${PER_TASK[@]}" "${TRAIN[@]}" trainer=smoke trainer.checkpoint=true hydra.run.dir="$WORK/pertask_flat"
  step one_gpu_per_task_sptt "$PY" "${PER_TASK[@]}" "${TRAIN[@]}" trainer=smoke trainer.checkpoint=true \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 hydra.run.dir="$WORK/pertask_sptt"
  # a rank SIGKILLed after the first (async) checkpoint: torchrun restarts, the run resumes and
  # ends with the metrics and tables of an uninterrupted run
  pytest_step elastic_restart_checkpoint tests/integration/test_elastic_restart.py -k cuda
else
  skip "torchrun_flat torchrun_sptt one_gpu_per_task_flat one_gpu_per_task_sptt elastic_restart_checkpoint" "needs 2 GPUs"
fi
if [[ "$GPUS" -ge 2 ]]; then
  # SPTT on NCCL equals the single-process model (logits, loss, gradients, weights; fp32), for
  # every case that fits the GPUs here
  pytest_step sptt_equivalence_nccl tests/distributed/test_sptt_dmt.py -k nccl
  # a rank that cannot reach the job's store turns the stuck-rank watchdog off on every rank
  # (one all-reduce of a flag on the ranks' GPUs)
  pytest_step watchdog_agreement_nccl tests/distributed/test_watchdog_agreement.py -k nccl
  # each rank draws its own dropout masks on its GPU, and a 2-rank resume continues every rank's
  pytest_step dropout_ranks_nccl tests/distributed/test_dropout_ranks.py -k nccl
  # async checkpoints of sharded CUDA tables: DCP's staging copies to host memory what it writes,
  # and a save goes synchronous (and says so) where host memory is short or unreadable
  pytest_step async_staging_nccl tests/distributed/test_async_staging.py -k nccl
  # bf16/fp16 all-to-alls on NCCL hand over the wire's values and round the gradient as the
  # cast back does, bit for bit
  pytest_step wire_values_nccl tests/distributed/test_comm_precision.py -k "(wire_values or saturates) and nccl"
  # on NCCL too: a training step makes no host sync of dmt's own and no collective beyond its
  # all-to-alls, and SPTT's step f is in flight while the bottom MLP runs
  pytest_step host_syncs_nccl tests/distributed/test_host_syncs.py -k nccl
  pytest_step step_f_overlap_nccl tests/distributed/test_sptt_overlap.py -k nccl
  # compressed communication: SPTT steps d and f and the flat all-to-alls in bf16 (QCommsConfig)
  step bf16_comms_sptt "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 sptt.comm_precision=bf16 hydra.run.dir="$WORK/bf16sptt"
  step bf16_comms_flat "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    sptt.comm_precision=bf16 hydra.run.dir="$WORK/bf16flat"
  # ... and they train as fp32 does: the same runs' test AUC within 0.005 (torchrun_sptt/flat)
  step bf16_auc_like_fp32 "$PY" - "$WORK" <<'PYEOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
for fp32, bf16 in (("sptt2", "bf16sptt"), ("flat2", "bf16flat")):
    a, b = (json.loads((work / r / "metrics.json").read_text())["test_auc"] for r in (fp32, bf16))
    print(f"{fp32}: test AUC fp32 {a:.4f}, bf16 {b:.4f}, difference {b - a:+.4f}")
    assert abs(a - b) < 0.005, (fp32, a, b)
PYEOF
  # throughput: flat vs SPTT vs DMT, pipelined and not, fp32 and bf16 (the figures are the point
  # here, not PASS). The GPUs are split into 2 emulated hosts (1 with 3 GPUs: a host each) so that
  # there are 2+ towers and step f; on one machine every link is NVLink/PCIe, not a network
  (( GPUS % 2 == 0 )) && BENCH_L=$((GPUS / 2)) || BENCH_L=1
  step throughput_benchmark "$PY" -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
    benchmarks/bench_sptt.py --local-world-size "$BENCH_L" --batch 2048 --modes flat,sptt,dmt \
    --pipeline on,off --comm-precision fp32,bf16 --runs 3 --json "$OUT/bench_sptt.json"
  sed -n '/^G=/,/^dmt compression/p' "$OUT/throughput_benchmark.log"
else
  skip "sptt_equivalence_nccl watchdog_agreement_nccl async_staging_nccl wire_values_nccl host_syncs_nccl step_f_overlap_nccl bf16_comms_sptt bf16_comms_flat bf16_auc_like_fp32 throughput_benchmark" "needs 2 GPUs"
fi
if [[ "$GPUS" -ge 4 ]]; then
  # resharding resume on NCCL (flat and SPTT): the same tests as on gloo, with one GPU per rank,
  # the suite's and the slow tier's
  pytest_step reshard_nccl tests/distributed/test_checkpoint_reshard.py -m "slow or not slow" -k nccl
  # evaluation whose last global batch leaves ranks without rows (padded, pytorch/FBGEMM#3750)
  pytest_step empty_eval_rank_nccl tests/distributed/test_streaming_eval.py -k "empty_batch and nccl"
else
  skip "reshard_nccl empty_eval_rank_nccl" "needs 4 GPUs"
fi
echo "$FAILED failed; logs in $OUT"
exit "$FAILED"
