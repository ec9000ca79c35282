#!/usr/bin/env bash
# Real-SLURM smoke test of dmt's SLURM launch (hydra-submitit-launcher), on this one host.
#
#   bash scripts/slurm_smoke.sh [HYDRA_OVERRIDES...]    (root; Debian; no systemd needed)
#
# 1. Installs SLURM and MUNGE from Debian's packages (slurm-wlm, munge) if they are absent.
# 2. Starts a private cluster in a fresh temp directory: munged, slurmctld and two slurmd daemons
#    on this host, one per node (`slurmd -N NODE`, each on its own port), with its own slurm.conf
#    (SLURM_CONF / -f; files in /etc/slurm are never read or written), linuxproc process tracking
#    and no cgroups (works without systemd, in a container). The nodes are named by loopback
#    addresses (127.0.0.1, 127.0.0.2), so the first host of a job's node list, where dmt's ranks
#    meet, resolves without DNS or /etc/hosts entries.
# 3. Submits `dmt-train -m hydra/launcher=slurm ...` as a Hydra sweep of 2 points, each a SLURM job
#    of 2 tasks on 2 nodes (CPU, gloo, loopback only). Extra arguments go to that command.
# 4. Checks that each point trained as one world of 2 (dmt's "rank 0 of 2" and "rank 1 of 2" lines
#    in the point's log, one rendezvous per point, a different one for each point) and wrote
#    exactly one metrics.json.
# 5. Runs `srun -N 2 -n 2 dmt-train -m trainer.seed=0,1,2` (a multirun whose 3 points run in turn
#    in the same 2 tasks of one job step) and checks the same of every point.
# 6. Preempts a job: SIGUSR2 after its first checkpoint; submitit requeues it, it resumes
#    (trainer.resume_from=auto) and must end with the metrics of the same run uninterrupted.
# Every daemon it started, and every process of its cluster, is stopped on exit, and its temp
# directory removed (KEEP=1 keeps the directory for inspection). Exits non-zero when a step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
POINTS=2 # sweep points (trainer.seed=0,1)
NODES=2  # tasks per point: one per node

log() { echo "[slurm_smoke] $*"; }
fail() {
    echo "[slurm_smoke] FAIL: $*" >&2
    exit 1
}

[[ $EUID -eq 0 ]] || fail "needs root (installs packages, runs slurmd as root)"
[[ -x "$PY" ]] || fail "$PY not found: run scripts/setup.sh first"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends slurm-wlm munge
fi
log "$(slurmctld -V), munge $(munged -V 2>&1 | awk '{print $2; exit}')"

TMP="$(mktemp -d /tmp/dmt-slurm-smoke.XXXXXX)"
chmod 700 "$TMP"
PIDS=()
# Every process of this cluster but the daemons started here and their own children (i.e.
# slurmstepd and job tasks): those that inherited this cluster's SLURM_CONF from its slurmd.
cluster_leftovers() {
    local f p ppid
    for f in $(grep -lzx "SLURM_CONF=$TMP/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
        p="${f#/proc/}"
        p="${p%/environ}"
        ppid="$(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' ')"
        [[ -z "$ppid" || " $$ ${PIDS[*]} " == *" $p "* || " ${PIDS[*]} " == *" $ppid "* ]] || echo "$p"
    done
}
cleanup() {
    local rc=$? pid i
    set +e
    if [[ -n "${SWEEP_PID:-}" ]] && kill -0 "$SWEEP_PID" 2>/dev/null; then
        kill "$SWEEP_PID" 2>/dev/null # timeout passes it on to dmt-train
        wait "$SWEEP_PID" 2>/dev/null
    fi
    if [[ -n "${SLURM_CONF:-}" ]] && [[ -f "$SLURM_CONF" ]]; then
        scancel --quiet --user=root >/dev/null 2>&1
        for _ in $(seq 30); do
            [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && [[ -z "$(cluster_leftovers)" ]] && break
            sleep 0.5
        done
    fi
    # Reverse start order (slurmd, slurmctld, munged): each daemon still finds those it talks to.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid="${PIDS[i]}"
        kill "$pid" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null && echo "[slurm_smoke] killed $pid (no exit 10 s after SIGTERM)"
        wait "$pid" 2>/dev/null
    done
    for pid in $(cluster_leftovers); do
        echo "[slurm_smoke] killing leftover $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)"
        kill -9 "$pid" 2>/dev/null
    done
    if [[ $rc -ne 0 ]]; then
        for f in "$TMP"/log/*.log; do
            [[ -f "$f" ]] && { echo "---- $f (tail)"; tail -n 20 "$f"; }
        done
    fi
    if [[ "${KEEP:-0}" == 1 ]]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$TMP"/{munge,log,state,spool,run}
chmod 700 "$TMP/munge"

# Free TCP ports on loopback for slurmctld and the two slurmd.
read -r CTLD_PORT N1_PORT N2_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)

# MUNGE: own key, socket, pid, log and seed.
dd if=/dev/urandom of="$TMP/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$TMP/munge/munge.key"
MUNGE_SOCKET="$TMP/munge/munge.socket"
munged --foreground --force --socket="$MUNGE_SOCKET" --key-file="$TMP/munge/munge.key" \
    --pid-file="$TMP/munge/munged.pid" --log-file="$TMP/log/munged.log" \
    --seed-file="$TMP/munge/munged.seed" >>"$TMP/log/munged.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
    [[ -S "$MUNGE_SOCKET" ]] && break
    sleep 0.1
done
[[ -S "$MUNGE_SOCKET" ]] || fail "munged did not start (see $TMP/log/munged.log)"

CPUS=2 # per node, as configured (SlurmdParameters=config_overrides): both points run at once
export SLURM_CONF="$TMP/slurm.conf"
: >"$TMP/plugstack.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=dmtsmoke
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool/%n
SlurmctldPidFile=$TMP/run/slurmctld.pid
SlurmdPidFile=$TMP/run/slurmd.%n.pid
SlurmctldLogFile=$TMP/log/slurmctld.log
SlurmdLogFile=$TMP/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$TMP/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=127.0.0.1 NodeHostname=localhost Port=$N1_PORT CPUs=$CPUS RealMemory=1000 State=UNKNOWN
NodeName=127.0.0.2 NodeHostname=localhost Port=$N2_PORT CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=smoke Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld -D -i -f "$SLURM_CONF" >>"$TMP/log/slurmctld.out" 2>&1 &
PIDS+=($!)
NODE_NAMES=(127.0.0.1 127.0.0.2)
for node in "${NODE_NAMES[@]}"; do
    mkdir -p "$TMP/spool/$node"
    slurmd -D -N "$node" -f "$SLURM_CONF" >>"$TMP/log/slurmd.$node.out" 2>&1 &
    PIDS+=($!)
done

log "waiting for nodes ${NODE_NAMES[*]} (slurmctld port $CTLD_PORT, slurmd ports $N1_PORT $N2_PORT)"
want="${NODE_NAMES[*]}"
idle=""
for _ in $(seq 60); do
    idle="$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | xargs)"
    [[ "$idle" == "$want" ]] && break
    sleep 1
done
[[ "$idle" == "$want" ]] || { sinfo -N -l || true; fail "nodes $want not idle after 60 s"; }
sinfo -N

# `dmt-train -m hydra/launcher=slurm` into sweep directory $1 with overrides $2...: one job of
# NODES tasks per point, one task per node. Run it in the background (`submit_sweep ... &`): the
# background subshell becomes `timeout`, so SWEEP_PID=$! is the process cleanup() signals.
submit_sweep() {
    local dir="$1"
    shift
    cd "$TMP"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" GLOO_SOCKET_IFNAME=lo WANDB_MODE=disabled
    exec timeout 600 "$ROOT/.venv/bin/dmt-train" -m hydra/launcher=slurm hydra.sweep.dir="$dir" \
        hydra.launcher.nodes=$NODES hydra.launcher.tasks_per_node=1 \
        hydra.launcher.gpus_per_node=0 hydra.launcher.cpus_per_task=1 \
        hydra.launcher.mem_gb=null hydra.launcher.timeout_min=15 "$@"
}

# The sweep: 2 points (trainer.seed=0,1), each a SLURM job of 2 tasks, one on each node. sbatch
# passes this environment on to the jobs: the same interpreter (submitit runs the pickled job with
# the submitting python), this checkout first on the path, gloo on loopback. This cluster keeps no
# accounting (no slurmdbd), so submitit's sacct calls fail; it then waits for the jobs' result
# files instead (those warnings are filtered from the output shown, kept in log/sweep.log).
SWEEP="$TMP/multirun"
log "submitting the sweep (output in $SWEEP)"
start=$SECONDS
submit_sweep "$SWEEP" trainer=smoke trainer.device=cpu logger=disabled trainer.seed=0,1 "$@" \
    >"$TMP/log/sweep.log" 2>&1 &
SWEEP_PID=$!
sweep_rc=0
wait "$SWEEP_PID" || sweep_rc=$?
SWEEP_PID=
grep -v -e "Bypassing sacct error" -e "accounting storage is disabled" "$TMP/log/sweep.log" || true
[[ $sweep_rc == 0 ]] || fail "dmt-train -m hydra/launcher=slurm exited with $sweep_rc"
log "sweep finished in $((SECONDS - start)) s"

# Each point: one world of 2 (both ranks logged it), one metrics.json, its own rendezvous (port
# from its own SLURM job id).
rendezvous=()
for point in $(seq 0 $((POINTS - 1))); do
    dir="$SWEEP/$point"
    [[ -f "$dir/train.log" ]] || fail "point $point: no $dir/train.log"
    for rank in $(seq 0 $((NODES - 1))); do
        grep -q "rank $rank of $NODES (.*launcher slurm" "$dir/train.log" ||
            fail "point $point: no 'rank $rank of $NODES' (launcher slurm) in $dir/train.log"
    done
    if grep -q "rank [0-9]* of 1 " "$dir/train.log"; then
        fail "point $point: a world of one in $dir/train.log"
    fi
    n="$(find "$dir" -name metrics.json | wc -l)"
    [[ "$n" == 1 ]] || fail "point $point: $n metrics.json files under $dir (expected 1)"
    rdv="$(grep -ho "rendezvous [^,]*" "$dir/train.log" | sort -u)"
    [[ "$(wc -l <<<"$rdv")" == 1 ]] || fail "point $point: its ranks met at different places: $rdv"
    rendezvous+=("$rdv")
    grep -h "rank [0-9]* of $NODES (" "$dir/train.log" | sed "s/^/[point $point] /"
done
n="$(printf '%s\n' "${rendezvous[@]}" | sort -u | wc -l)"
[[ "$n" == "$POINTS" ]] || fail "sweep points shared a rendezvous: ${rendezvous[*]}"
n="$(find "$SWEEP" -name metrics.json | wc -l)"
[[ "$n" == "$POINTS" ]] || fail "$n metrics.json files under $SWEEP (expected $POINTS)"
log "OK: $POINTS sweep points, each one world of $NODES ranks on SLURM nodes ${NODE_NAMES[*]}"

# 5. A multirun inside one job step: `srun dmt-train -m ...` runs the sweep's points one after
#    another in the same tasks, one world of NODES for all of them; each point's group must meet
#    apart from the previous point's.
STEP_SWEEP="$TMP/step-multirun"
log "srun -N $NODES -n $NODES dmt-train -m (points in turn in one step; output in $STEP_SWEEP)"
start=$SECONDS
(
    cd "$TMP"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" GLOO_SOCKET_IFNAME=lo WANDB_MODE=disabled
    exec timeout 600 srun --nodes=$NODES --ntasks=$NODES --ntasks-per-node=1 --cpus-per-task=1 \
        --kill-on-bad-exit=1 "$ROOT/.venv/bin/dmt-train" -m hydra.sweep.dir="$STEP_SWEEP" \
        trainer=smoke trainer.device=cpu logger=disabled trainer.seed=0,1,2 "$@"
) >"$TMP/log/step-sweep.log" 2>&1 &
SWEEP_PID=$!
sweep_rc=0
wait "$SWEEP_PID" || sweep_rc=$?
SWEEP_PID=
[[ $sweep_rc == 0 ]] || { tail -n 60 "$TMP/log/step-sweep.log"; fail "srun dmt-train -m exited with $sweep_rc"; }
log "step sweep finished in $((SECONDS - start)) s"
for point in 0 1 2; do
    dir="$STEP_SWEEP/$point"
    [[ -f "$dir/train.log" ]] || fail "step point $point: no $dir/train.log"
    for rank in $(seq 0 $((NODES - 1))); do
        grep -q "rank $rank of $NODES (.*launcher slurm" "$dir/train.log" ||
            fail "step point $point: no 'rank $rank of $NODES' (launcher slurm) in $dir/train.log"
    done
    n="$(find "$dir" -name metrics.json | wc -l)"
    [[ "$n" == 1 ]] || fail "step point $point: $n metrics.json files under $dir (expected 1)"
done
log "OK: 3 points in turn in one srun step, each one world of $NODES ranks"
# 6. Preemption: a job of NODES tasks with periodic checkpoints and trainer.resume_from=auto gets
#    SIGUSR2 once its first checkpoint is complete (what SLURM sends before it preempts or times
#    out a job that asked for it: submitit's --signal), submitit requeues it (scontrol requeue),
#    and the requeued job resumes from its last checkpoint. The same run without preemption must
#    end with the same metrics.
STEPS=96
RESTART=(logger=disabled trainer.progress_bar=false data.synthetic.num_train=16384
    data.synthetic.num_val=1024 data.synthetic.num_test=1024 data.batch_size=256 trainer.epochs=2
    "trainer.max_steps=$STEPS" trainer.checkpoint_every=8 trainer.resume_from=auto
    model.embedding_dim=8 "model.bottom_mlp=[16,8]" "model.top_mlp=[16,1]" trainer.device=cpu)
PREEMPTED="$TMP/preempted"
log "preemption: a job of $NODES tasks, SIGUSR2 after its first checkpoint (output in $PREEMPTED)"
start=$SECONDS
submit_sweep "$PREEMPTED" "${RESTART[@]}" >"$TMP/log/preempted.log" 2>&1 &
SWEEP_PID=$!
marker="$PREEMPTED/0/checkpoints/step_8/meta.json"
for _ in $(seq 2400); do
    [[ -f "$marker" ]] && break
    kill -0 "$SWEEP_PID" 2>/dev/null || break
    sleep 0.05
done
[[ -f "$marker" ]] || { tail -n 40 "$TMP/log/preempted.log"; fail "preemption: no checkpoint $marker"; }
job="$(squeue -h -o %i | head -n 1)"
[[ -n "$job" ]] || fail "preemption: the job ended before its checkpoint could be acted on"
[[ ! -f "$PREEMPTED/0/metrics.json" ]] || fail "preemption: the job finished before the signal"
scancel --signal=USR2 "$job"
log "sent SIGUSR2 to job $job"
# SLURM holds a requeued batch job for a while (reason BeginTime; about 165 s here): start it now
for _ in $(seq 600); do
    reason="$(squeue -h -j "$job" -o %r 2>/dev/null || true)"
    if [[ "$reason" == BeginTime ]]; then
        scontrol update JobId="$job" StartTime=now && log "released the requeued job $job"
        break
    fi
    kill -0 "$SWEEP_PID" 2>/dev/null || break
    sleep 0.1
done
sweep_rc=0
wait "$SWEEP_PID" || sweep_rc=$?
SWEEP_PID=
[[ $sweep_rc == 0 ]] || { tail -n 60 "$TMP/log/preempted.log"; fail "preempted sweep exited with $sweep_rc"; }
grep -rqs "this job is preempted" "$PREEMPTED/.submitit" ||
    fail "preemption: submitit did not see the signal (no 'this job is preempted' under $PREEMPTED/.submitit)"
resumed="$(grep -ho "resumed from [^ ]* at step [0-9]*" "$PREEMPTED/0/train.log" | head -n 1)"
[[ -n "$resumed" ]] || fail "preemption: the requeued job did not resume ($PREEMPTED/0/train.log)"
(( ${resumed##* } < STEPS )) || fail "preemption: the signal came after training ($resumed)"
log "requeued and $resumed in $((SECONDS - start)) s"

CLEAN="$TMP/uninterrupted"
(
    cd "$TMP"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" GLOO_SOCKET_IFNAME=lo WANDB_MODE=disabled
    exec timeout 600 srun --nodes=$NODES --ntasks=$NODES --ntasks-per-node=1 --cpus-per-task=1 \
        --kill-on-bad-exit=1 "$ROOT/.venv/bin/dmt-train" hydra.run.dir="$CLEAN" "${RESTART[@]}"
) >"$TMP/log/uninterrupted.log" 2>&1 || {
    tail -n 40 "$TMP/log/uninterrupted.log"
    fail "the uninterrupted run failed"
}
"$PY" - "$PREEMPTED/0/metrics.json" "$CLEAN/metrics.json" <<'EOF' ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
keys = ("val_auc", "test_auc", "test_logloss", "test_ne", "num_steps")
diff = {k: (a[k], b[k]) for k in keys if abs(a[k] - b[k]) > 1e-6}
print(f"[slurm_smoke] preempted vs uninterrupted: {', '.join(f'{k} {a[k]:.6g}' for k in keys)}"
      f"{f'; differ: {diff}' if diff else ' (equal)'}")
sys.exit(1 if diff else 0)
EOF
    fail "preemption: the resumed run's metrics differ from the uninterrupted run's"
log "OK: a preempted job was requeued, resumed from its checkpoint and ended as the uninterrupted run"
