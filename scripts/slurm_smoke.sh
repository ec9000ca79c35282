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
# 3.-6. Runs scripts/slurm_acceptance.sh's checks on that cluster, on CPU (gloo, loopback only;
#    extra arguments go to its `hydra/launcher=slurm` jobs):
#    - a Hydra sweep of 2 points through hydra-submitit-launcher, each a SLURM job of 2 tasks on 2
#      nodes: each point one world of 2 (dmt's "rank 0 of 2" and "rank 1 of 2" lines in its log),
#      its own rendezvous, exactly one metrics.json;
#    - `srun -N 2 --ntasks-per-node=2 --distribution=cyclic dmt-train`: one world of 4 whose
#      ranks are numbered node by node (task 1, on the second node, is rank 2);
#    - `srun -N 2 dmt-train -m trainer.seed=0,1,2`: 3 points in turn in the same 2 tasks of one
#      job step, each one world of 2;
#    - preemption: SIGUSR2 after a job's first checkpoint; submitit requeues it, it resumes
#      (trainer.resume_from=auto) and must end with the metrics of the same run uninterrupted.
# Every daemon it started, and every process of its cluster, is stopped on exit, and its temp
# directory removed (KEEP=1 keeps the directory for inspection). Exits non-zero when a step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
NODES=2 # tasks per job: one per node

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
    # only this cluster's jobs: a SLURM_CONF of the caller's (a real cluster) is not this one
    if [[ "${SLURM_CONF:-}" == "$TMP/slurm.conf" ]] && [[ -f "$SLURM_CONF" ]]; then
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

# 3.-6. The checks of scripts/slurm_acceptance.sh (what a user runs on a real cluster), on CPU: one
# task per node, gloo on loopback. sbatch and srun pass this environment on to the tasks: the same
# interpreter (submitit runs the pickled job with the submitting python) and this checkout first
# on the path. This cluster keeps no accounting (no slurmdbd), so submitit's sacct calls fail; it
# then waits for the jobs' result files instead.
export GLOO_SOCKET_IFNAME=lo
NODES=$NODES GPUS_PER_NODE=0 CPUS_PER_TASK=1 DMT_SLURM_WORK="$TMP/runs" \
    bash "$ROOT/scripts/slurm_acceptance.sh" "$@" &
SWEEP_PID=$!
wait "$SWEEP_PID" || fail "scripts/slurm_acceptance.sh failed on the local cluster (above)"
SWEEP_PID=
log "OK: all checks passed on SLURM nodes ${NODE_NAMES[*]}"
