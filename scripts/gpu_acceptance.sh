#!/usr/bin/env bash
# First checks for a machine with 1-8 NVIDIA GPUs (dmt's CI has none; run this after
# `DMT_VARIANT=gpu bash scripts/setup.sh`). Every step prints PASS or FAIL; the exit status is the
# number of failures. Outputs go to a fresh temporary directory, removed at the end.
#   bash scripts/gpu_acceptance.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
WORK="$(mktemp -d -t dmt-gpu-acceptance.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
echo "GPUs visible: $GPUS ($("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'))"
if [[ "$GPUS" -lt 1 ]]; then echo "no CUDA device: nothing to check" >&2; exit 1; fi
FAILED=0
step() {  # step NAME COMMAND...
  local name="$1"; shift
  echo "== $name"
  if "$@" > "$WORK/$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name (log below)"; tail -40 "$WORK/$name.log"; FAILED=$((FAILED + 1)); fi
}
TRAIN=(-m dmt.train logger=disabled trainer.progress_bar=false trainer.device=cuda)
step train_one_gpu "$PY" "${TRAIN[@]}" hydra.run.dir="$WORK/one"
step fused_adam "$PY" "${TRAIN[@]}" optim=adam trainer=smoke hydra.run.dir="$WORK/adam"
# memory budget: tables that miss sharding.hbm_gb are UVM-cached (flat and SPTT), same training
step uvm_caching "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_sharding_plan.py -k cuda
# a resumed run draws the GPU's dropout masks of an uninterrupted one (the CUDA generator is saved)
step resume_dropout_cuda "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_train.py -k "dropout and cuda"
# a resumed fused-Adam run continues FBGEMM's bias-correction step (meta.json fused_optimizer_step)
step resume_fused_adam_cuda "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_train.py -k "fused_adam and cuda"
step checkpoint_and_eval bash -c "'$PY' ${TRAIN[*]} trainer=smoke trainer.checkpoint=true hydra.run.dir='$WORK/ck' && '$ROOT/.venv/bin/dmt-eval' --checkpoint '$WORK/ck/checkpoints' --data test --device cuda --out '$WORK/ck/eval.json'"
# two ranks on one GPU are refused at start with dmt's message, not NCCL's at the first collective
step shared_gpu_refused bash -c "CUDA_VISIBLE_DEVICES=0 '$PY' -m torch.distributed.run --standalone --nproc-per-node=2 ${TRAIN[*]} trainer=smoke hydra.run.dir='$WORK/shared' > '$WORK/shared.out' 2>&1; grep 'share one GPU' '$WORK/shared.out'"
# one GPU: dmt against the torchrec_dlrm loop on the Criteo sample (figures in the log, not PASS)
SAMPLE="$ROOT/../shared/data/criteo-kaggle-sample/train.tsv"
if [[ -f "$SAMPLE" ]]; then
  step torchrec_dlrm_one_gpu "$PY" benchmarks/bench_torchrec_dlrm.py --device cuda --runs 3 \
    --steps 200 --warmup 20 --override "data.criteo.preprocessed_dir=$WORK/criteo_sample" \
    --json "$WORK/torchrec_dlrm.json"
  tail -6 "$WORK/torchrec_dlrm_one_gpu.log"
fi
if [[ "$GPUS" -ge 2 ]]; then
  step torchrun_flat "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" hydra.run.dir="$WORK/flat2"
  step torchrun_sptt "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 hydra.run.dir="$WORK/sptt2"
  # one GPU per task, as SLURM's --gpus-per-task=1 binds them (each rank sees only cuda:0), and
  # sptt.local_world_size=1 (hosts emulated): the plans place each rank's shards on the GPU it uses
  PER_TASK=(-m torch.distributed.run --standalone --nproc-per-node=2 --no-python bash -c
    'CUDA_VISIBLE_DEVICES=$LOCAL_RANK exec "$0" "$@"' "$PY")
  step one_gpu_per_task_flat "$PY" "${PER_TASK[@]}" "${TRAIN[@]}" trainer=smoke trainer.checkpoint=true hydra.run.dir="$WORK/pertask_flat"
  step one_gpu_per_task_sptt "$PY" "${PER_TASK[@]}" "${TRAIN[@]}" trainer=smoke trainer.checkpoint=true \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 hydra.run.dir="$WORK/pertask_sptt"
  step elastic_restart_checkpoint "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=1 \
    "${TRAIN[@]}" trainer.checkpoint_every=20 trainer.checkpoint_async=true trainer.resume_from=auto hydra.run.dir="$WORK/elastic"
fi
if [[ "$GPUS" -ge 2 ]]; then
  # SPTT on NCCL equals the single-process model (logits, loss, gradients, weights; fp32), for
  # every case that fits the GPUs here; pipelined training equals the plain loop, flat and SPTT
  step sptt_equivalence_nccl "$PY" -m pytest -q -p no:cacheprovider tests/distributed/test_sptt_dmt.py -k nccl
  step pipeline_exactness_nccl "$PY" -m pytest -q -p no:cacheprovider tests/distributed/test_pipeline.py -m "slow or not slow" -k nccl
  # compressed communication: SPTT steps d and f and the flat all-to-alls in bf16 (QCommsConfig)
  step bf16_comms_sptt "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    experiment=dmt_4t_dlrm model.partition.num_towers=2 sptt=on sptt.local_world_size=1 sptt.comm_precision=bf16 hydra.run.dir="$WORK/bf16sptt"
  step bf16_comms_flat "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 "${TRAIN[@]}" \
    sptt.comm_precision=bf16 hydra.run.dir="$WORK/bf16flat"
  # throughput: flat vs SPTT vs DMT, pipelined and not, fp32 and bf16, all GPUs as one host
  # (the figures are the point here, not PASS: read them in the log)
  step throughput_benchmark "$PY" -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
    benchmarks/bench_sptt.py --local-world-size "$GPUS" --batch 2048 --modes flat,sptt,dmt \
    --pipeline on,off --comm-precision fp32,bf16 --runs 3 --json "$WORK/bench_sptt.json"
  tail -30 "$WORK/throughput_benchmark.log"
fi
if [[ "$GPUS" -ge 4 ]]; then
  # resharding resume on NCCL (flat and SPTT): the same tests as on gloo, with one GPU per rank
  step reshard_nccl "$PY" -m pytest -q -p no:cacheprovider tests/distributed/test_checkpoint_reshard.py -k nccl
fi
echo "$FAILED failed"
exit "$FAILED"
