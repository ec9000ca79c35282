#!/usr/bin/env bash
# dmt's SLURM launch paths, end to end, on a SLURM cluster: your own (GPUs, NCCL across nodes), or
# the local CPU cluster that scripts/slurm_smoke.sh starts for CI-like checks.
#
#   NODES=2 GPUS_PER_NODE=8 SRUN_ARGS="--partition=gpu --account=me" \
#       bash scripts/slurm_acceptance.sh hydra.launcher.partition=gpu \
#       +hydra.launcher.additional_parameters.account=me
#
# Arguments are Hydra overrides for the `hydra/launcher=slurm` jobs (partition, account, ...);
# SRUN_ARGS holds the same for the plain `srun` steps. Settings (environment):
#   NODES (2)            nodes per job
#   GPUS_PER_NODE (0)    0: CPU (gloo), one task per node; G: G tasks per node, one GPU each (NCCL)
#   CPUS_PER_TASK (1)    CPUs per task (on GPUs give each task several, and enough memory: a
#                        CUDA torch process takes several GB; e.g. SRUN_ARGS=--mem-per-gpu=32G
#                        and hydra.launcher.mem_gb=...)
#   TIMEOUT_S (600)      limit of each step, queueing included (raise it on a busy cluster)
#   TOLERANCE            preempted vs uninterrupted metrics (1e-6 on CPU; 2e-3 with GPUs, whose
#                        FBGEMM backward and NCCL reductions are not bitwise deterministic)
#   DMT_SLURM_WORK       directory for the runs (a new one under the checkout by default: every
#                        node must see it; a relative one is taken from where you run the
#                        script); kept at the end, as the evidence
# Checks, in order (the first failure ends the script with a non-zero status):
#   1. A 2-point sweep through hydra-submitit-launcher: each point one SLURM job and one world of
#      NODES x tasks-per-node ranks, with one metrics.json and its own rendezvous.
#   2. `srun dmt-train -m` over 3 points: the points run in turn in the same tasks of one job
#      step, each one world.
#   3. Preemption: SIGUSR2 to a job once its first checkpoint is complete; submitit requeues it,
#      it resumes (trainer.resume_from=auto) and ends with the metrics of the same run without
#      preemption.
#   4. Placement: `srun --distribution=cyclic` (task 1 on the second node) with 2 or more tasks
#      per node trains as one world whose ranks are numbered node by node: rank r on node
#      r / tasks-per-node, whatever SLURM_PROCID it has.
# With GPUs on several nodes check 2 runs last: if TorchRec's planner shards a table
# table-row-wise there, dmt refuses the later points (TorchRec caches those groups for the whole
# process: a known gap, README "Multi-process and multi-host").
# The jobs this script submitted are cancelled if it is interrupted.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRAIN="$ROOT/.venv/bin/dmt-train"
NODES="${NODES:-2}"
GPUS="${GPUS_PER_NODE:-0}"
CPUS="${CPUS_PER_TASK:-1}"
TIMEOUT_S="${TIMEOUT_S:-600}"
# a bad setting: say which and what was expected, exit 2 before anything is made
refuse() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}
# whether $1 is an integer from $2 to $3 (no leading zero, six digits at most: bash's arithmetic
# cannot wrap it round into the range)
int_in() { [[ "$1" =~ ^(0|[1-9][0-9]{0,5})$ ]] && (($1 >= $2 && $1 <= $3)); }
int_in "$NODES" 1 100000 || refuse "NODES must be an integer from 1 to 100000, got '$NODES'"
int_in "$GPUS" 0 1024 ||
    refuse "GPUS_PER_NODE must be an integer from 0 (CPU) to 1024, got '$GPUS'"
int_in "$CPUS" 1 100000 ||
    refuse "CPUS_PER_TASK must be an integer from 1 to 100000, got '$CPUS'"
[[ "$TIMEOUT_S" =~ ^[0-9]+(\.[0-9]+)?[smhd]?$ && "$TIMEOUT_S" =~ [1-9] ]] ||
    refuse "TIMEOUT_S must be a duration above 0 in seconds (or timeout(1)'s 10m, 1h), got '$TIMEOUT_S'"
if [[ "$GPUS" == 0 ]]; then
    TASKS=1
    DEVICE=cpu
    TOLERANCE="${TOLERANCE:-1e-6}"
else
    TASKS="$GPUS"
    DEVICE=cuda
    TOLERANCE="${TOLERANCE:-2e-3}"
fi
WORLD=$((NODES * TASKS))
# batches split evenly over the ranks: 512 (smoke) and 256 (preemption) rounded up to a multiple
round_up() { echo $(( ($1 + WORLD - 1) / WORLD * WORLD )); }
read -r -a SRUN_EXTRA <<<"${SRUN_ARGS:-}"

log() { echo "[dmt-slurm] $*"; }
fail() {
    echo "[dmt-slurm] FAIL: $*" >&2
    exit 1
}

[[ -x "$TRAIN" ]] || fail "$TRAIN not found: run scripts/setup.sh first"
command -v srun >/dev/null || fail "srun not found: run this on a SLURM login node"
WORK="${DMT_SLURM_WORK:-}"
if [[ -z "$WORK" ]]; then
    WORK="$(mktemp -d "$ROOT/slurm-acceptance.XXXXXX")"
elif [[ "$WORK" != /* ]]; then
    WORK="$PWD/$WORK" # from where the script runs: the steps run in WORK and name paths in it
fi
mkdir -p "$WORK/log"
NAME="dmt-acceptance-$$"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE="${WANDB_MODE:-disabled}"

# the SLURM jobs (ids) that submitit's folders (<sweep dir>/.submitit/<job id>/) in sweep
# directories $@ name, but those of EARLIER: a reused DMT_SLURM_WORK keeps an earlier run's, whose
# ids SLURM may since have given to other jobs, not this run's to cancel or signal
our_jobs() {
    local sweep dir job
    for sweep in "$@"; do
        for dir in "$sweep"/.submitit/*/; do
            job="$(basename "$dir")"
            [[ -d "$dir" && " $EARLIER " != *" $job "* ]] && echo "$job"
        done
    done
    return 0
}
EARLIER=
EARLIER="$(our_jobs "$WORK"/*/ | tr '\n' ' ')"

BG=
cleanup() {
    local rc=$? job
    set +e
    if [[ -n "$BG" ]] && kill -0 "$BG" 2>/dev/null; then
        kill "$BG" 2>/dev/null # timeout passes it on
        wait "$BG" 2>/dev/null
    fi
    for job in $(our_jobs "$WORK"/*/); do
        scancel --quiet "$job" 2>/dev/null
    done
    scancel --quiet --name="$NAME" 2>/dev/null
    log "runs and logs kept in $WORK"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "$NODES nodes x $TASKS tasks ($DEVICE), a world of $WORLD; runs in $WORK"

# `dmt-train -m hydra/launcher=slurm` into sweep directory $1 (overrides $2...), in the background
# (BG): one SLURM job of NODES x TASKS tasks per point
submit_sweep() {
    local dir="$1"
    shift
    (
        cd "$WORK"
        exec timeout "$TIMEOUT_S" "$TRAIN" -m hydra/launcher=slurm hydra.sweep.dir="$dir" \
            hydra.launcher.nodes="$NODES" hydra.launcher.tasks_per_node="$TASKS" \
            hydra.launcher.gpus_per_node="$GPUS" hydra.launcher.cpus_per_task="$CPUS" \
            hydra.launcher.mem_gb=null hydra.launcher.timeout_min=60 \
            hydra.launcher.name="$NAME" ${LAUNCHER_EXTRA[@]+"${LAUNCHER_EXTRA[@]}"} "$@"
    ) &
    BG=$!
}

# `srun dmt-train` on NODES x TASKS tasks (arguments: dmt-train's; srun's own before them in
# SRUN_PLACEMENT, e.g. --ntasks-per-node=2 --distribution=cyclic), in the background (BG)
srun_train() {
    local gpus=()
    [[ "$GPUS" == 0 ]] || gpus=(--gpus-per-task=1)
    (
        cd "$WORK"
        exec timeout "$TIMEOUT_S" srun --job-name="$NAME" --nodes="$NODES" \
            --ntasks-per-node="$TASKS" --cpus-per-task="$CPUS" ${gpus[@]+"${gpus[@]}"} --kill-on-bad-exit=1 \
            ${SRUN_PLACEMENT[@]+"${SRUN_PLACEMENT[@]}"} \
            ${SRUN_EXTRA[@]+"${SRUN_EXTRA[@]}"} "$TRAIN" "$@"
    ) &
    BG=$!
}

# waits for BG; on failure shows the tail of log $1 and fails with message $2
finish() {
    local rc=0
    wait "$BG" || rc=$?
    BG=
    [[ $rc == 0 ]] || {
        # (an empty log, or one of those lines only: grep's status 1 must not end the script
        # under pipefail before the FAIL line)
        { grep -v -e "Bypassing sacct error" -e "accounting storage is disabled" "$1" || true; } |
            tail -n 60
        fail "$2 (exit status $rc; log $1)"
    }
}

# run directory $1 (label $2) trained as one world of WORLD ranks under SLURM and wrote one
# metrics.json; prints its rendezvous. Every rank logs to its own file (train.log for rank 0,
# train.rank<r>.log): one writer per file, which NFS keeps whole across nodes
check_world() {
    local dir="$1" what="$2" rank n log
    [[ -f "$dir/train.log" ]] || fail "$what: no $dir/train.log"
    for rank in $(seq 0 $((WORLD - 1))); do
        log="$dir/train.log"
        [[ $rank == 0 ]] || log="$dir/train.rank$rank.log"
        grep -aq "rank $rank of $WORLD (.*launcher slurm" "$log" ||
            fail "$what: no 'rank $rank of $WORLD' (launcher slurm) in $log"
    done
    n="$(find "$dir" -name metrics.json | wc -l)"
    [[ "$n" == 1 ]] || fail "$what: $n metrics.json files under $dir (expected 1)"
    grep -aho "rendezvous [^,]*" "$dir"/train*.log | sort -u
}

LAUNCHER_EXTRA=("$@")
SMOKE=(trainer=smoke "trainer.device=$DEVICE" logger=disabled "data.batch_size=$(round_up 512)")

# 1. Two sweep points, each its own job, world and rendezvous (the port comes from the job id).
check_sweep() {
SWEEP="$WORK/multirun"
log "1. a 2-point sweep through hydra/launcher=slurm (output in $SWEEP)"
start=$SECONDS
submit_sweep "$SWEEP" "${SMOKE[@]}" trainer.seed=0,1 >"$WORK/log/sweep.log" 2>&1
finish "$WORK/log/sweep.log" "dmt-train -m hydra/launcher=slurm failed"
rendezvous=()
for point in 0 1; do
    rdv="$(check_world "$SWEEP/$point" "point $point")"
    [[ "$(wc -l <<<"$rdv")" == 1 ]] || fail "point $point: its ranks met at different places: $rdv"
    rendezvous+=("$rdv")
    grep -ah "rank [0-9]* of $WORLD (" "$SWEEP/$point"/train*.log | sed "s/^/[point $point] /"
done
[[ "${rendezvous[0]}" != "${rendezvous[1]}" ]] || fail "the points shared ${rendezvous[0]}"
log "OK: 2 sweep points, each one world of $WORLD ranks ($((SECONDS - start)) s)"
}

# 2. A multirun inside one job step: the points run one after another in the same tasks, one
#    world for all of them; each point's group must meet apart from the previous point's.
check_step_sweep() {
STEP_SWEEP="$WORK/step-multirun"
log "2. srun dmt-train -m over 3 points in one job step (output in $STEP_SWEEP)"
start=$SECONDS
srun_train -m hydra.sweep.dir="$STEP_SWEEP" "${SMOKE[@]}" trainer.seed=0,1,2 \
    >"$WORK/log/step-sweep.log" 2>&1
finish "$WORK/log/step-sweep.log" "srun dmt-train -m failed"
for point in 0 1 2; do
    check_world "$STEP_SWEEP/$point" "step point $point" >/dev/null
done
log "OK: 3 points in turn in one srun step, each one world of $WORLD ranks ($((SECONDS - start)) s)"
}

# 3. Preemption: SIGUSR2 (what SLURM sends signal_delay_s before the time limit, and on preemption
#    with PreemptParameters=send_user_signal) once the first checkpoint is complete; submitit's
#    rank 0 requeues the job (scontrol requeue); the requeued job resumes from its checkpoint and
#    must end as the same run without preemption. On GPUs the run is longer (2000 steps, a
#    checkpoint every 50): a tiny model's steps take milliseconds there, and this script sees the
#    first checkpoint through the shared file system, which may show it late.
check_preemption() {
if [[ "$GPUS" == 0 ]]; then STEPS=96 EVERY=8; else STEPS=2000 EVERY=50; fi
BATCH="$(round_up 256)"
RESTART=(logger=disabled trainer.progress_bar=false "data.synthetic.num_train=$((STEPS * 2 / 3 * BATCH))"
    data.synthetic.num_val=1024 data.synthetic.num_test=1024 "data.batch_size=$BATCH" trainer.epochs=2
    "trainer.max_steps=$STEPS" "trainer.checkpoint_every=$EVERY" trainer.resume_from=auto
    model.embedding_dim=8 "model.bottom_mlp=[16,8]" "model.top_mlp=[16,1]" "trainer.device=$DEVICE")
PREEMPTED="$WORK/preempted"
log "3. preemption: SIGUSR2 to a job after its first checkpoint (output in $PREEMPTED)"
start=$SECONDS
submit_sweep "$PREEMPTED" "${RESTART[@]}" >"$WORK/log/preempted.log" 2>&1
marker="$PREEMPTED/0/checkpoints/step_$EVERY/meta.json"
until [[ -f "$marker" ]]; do
    kill -0 "$BG" 2>/dev/null || break
    sleep 0.05
done
[[ -f "$marker" ]] || finish "$WORK/log/preempted.log" "preemption: the job ended without $marker"
job="$(our_jobs "$PREEMPTED" | head -n 1)"
[[ -n "$job" ]] || fail "preemption: no job of this run under $PREEMPTED/.submitit"
[[ ! -f "$PREEMPTED/0/metrics.json" ]] || fail "preemption: job $job finished before the signal"
scancel --signal=USR2 "$job" || fail "preemption: could not signal job $job (did it end first?)"
log "sent SIGUSR2 to job $job"
# SLURM holds a requeued batch job for a while (reason BeginTime; about 165 s on the local
# cluster): start it now where this user may
for _ in $(seq 120); do
    if [[ "$(squeue -h -j "$job" -o %r 2>/dev/null || true)" == BeginTime ]]; then
        scontrol update JobId="$job" StartTime=now 2>/dev/null && log "released the requeued job $job"
        break
    fi
    kill -0 "$BG" 2>/dev/null || break
    sleep 0.5
done
finish "$WORK/log/preempted.log" "preemption: the preempted sweep failed"
grep -rqs "this job is preempted" "$PREEMPTED/.submitit" ||
    fail "preemption: submitit did not see the signal (no 'this job is preempted' in $PREEMPTED/.submitit)"
resumed="$(grep -aho "resumed from [^ ]* at step [0-9]*" "$PREEMPTED/0/train.log" | head -n 1)"
[[ -n "$resumed" ]] || fail "preemption: the requeued job did not resume ($PREEMPTED/0/train.log)"
((${resumed##* } < STEPS)) || fail "preemption: the signal came after training ($resumed)"
log "requeued and $resumed ($((SECONDS - start)) s)"

CLEAN="$WORK/uninterrupted"
srun_train hydra.run.dir="$CLEAN" "${RESTART[@]}" >"$WORK/log/uninterrupted.log" 2>&1
finish "$WORK/log/uninterrupted.log" "the uninterrupted run failed"
"$ROOT/.venv/bin/python" - "$PREEMPTED/0/metrics.json" "$CLEAN/metrics.json" "$TOLERANCE" <<'EOF' ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
tol = float(sys.argv[3])
keys = ("val_auc", "test_auc", "test_logloss", "test_ne", "num_steps")
diff = {k: (a[k], b[k]) for k in keys if abs(a[k] - b[k]) > tol}
print(f"[dmt-slurm] preempted vs uninterrupted: {', '.join(f'{k} {a[k]:.6g}' for k in keys)}"
      f"{f'; differ by more than {tol}: {diff}' if diff else f' (equal within {tol})'}")
sys.exit(1 if diff else 0)
EOF
    fail "preemption: the resumed run's metrics differ from the uninterrupted run's"
log "OK: a preempted job was requeued, resumed from its checkpoint and ended as the uninterrupted run"
}

# 4. Placement: under srun's cyclic distribution task t runs on node t % NODES, so SLURM_PROCID
#    as the rank would give each "host" of TorchRec's plans and SPTT's towers ranks on several
#    nodes. dmt numbers the ranks node by node (SLURM_NODEID, SLURM_LOCALID); each rank's log line
#    names its task and node.
check_placement() {
local per_node world rank task node log dir
if [[ "$GPUS" == 0 ]]; then per_node=2; else per_node="$TASKS"; fi
if [[ "$per_node" -lt 2 || "$NODES" -lt 2 ]]; then
    log "4. placement: skipped (needs 2 nodes and 2 tasks per node; GPUS_PER_NODE=$GPUS, NODES=$NODES)"
    return
fi
world=$((NODES * per_node))
dir="$WORK/cyclic"
log "4. srun --distribution=cyclic, $per_node tasks per node: one world of $world (output in $dir)"
start=$SECONDS
SRUN_PLACEMENT=(--ntasks-per-node="$per_node" --distribution=cyclic)
srun_train hydra.run.dir="$dir" trainer=smoke "trainer.device=$DEVICE" logger=disabled \
    "data.batch_size=$(( (512 + world - 1) / world * world ))" >"$WORK/log/cyclic.log" 2>&1
SRUN_PLACEMENT=()
finish "$WORK/log/cyclic.log" "srun --distribution=cyclic dmt-train failed"
[[ -f "$dir/metrics.json" ]] || fail "placement: no $dir/metrics.json"
for rank in $(seq 0 $((world - 1))); do
    node=$((rank / per_node))
    task=$(( (rank % per_node) * NODES + node ))  # where cyclic placed it
    log="$dir/train.log"
    [[ $rank == 0 ]] || log="$dir/train.rank$rank.log"
    grep -aq "rank $rank of $world (local rank $((rank % per_node)) of $per_node, launcher slurm task $task on node $node," "$log" ||
        fail "placement: rank $rank is not local rank $((rank % per_node)) of SLURM task $task on node $node: $(grep -ah "rank [0-9]* of $world (" "$log")"
done
grep -ah "rank [0-9]* of $world (" "$dir"/train*.log | sed "s/^/[cyclic] /"
log "OK: cyclic placement, ranks numbered node by node in one world of $world ($((SECONDS - start)) s)"
}

SRUN_PLACEMENT=()
check_sweep
check_placement
if [[ "$GPUS" != 0 && "$NODES" -gt 1 ]]; then
    check_preemption
    check_step_sweep
else
    check_step_sweep
    check_preemption
fi
