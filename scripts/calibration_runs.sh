#!/usr/bin/env bash
# Measured runs for calibrating dmt's step-time model (issue 12, deliverable 4).
#
# Runs benchmarks/bench_sptt.py --json once per grid cell, each emulated host in its own network
# namespace with every host link throttled to RATE (scripts/netns_throttle.sh), and writes one
# JSON per cell to OUT (default benchmarks/results/calibration/), named G<G>_<rate>_B<batch>.json:
#
#   settings   G, L, hosts, rate (tc syntax and bit/s), per-rank batch, modes, runs, iters, ...
#   modes      per mode: median / min / max over runs of each run's median ms per step,
#              cross-host and total MB per step (summed over ranks)
#   records    bench_sptt's records as written (every run's median, every timed step (the slowest rank's;
#              rank 0's in files from before 2026-11-25),
#              traced and CommStats bytes per group)
#   load_before, load_after   /proc/loadavg around the run (the machine is shared)
#   date_utc, command, netns_left (namespaces left after the run: must be empty)
#
# A cell with RATE "none" runs on loopback without namespaces or throttling (hosts still
# emulated by --local-world-size for the byte accounting): the compute-bound reference.
# Cells whose JSON exists are skipped (rerun by deleting it). Needs root for the namespaces.
#
#   scripts/calibration_runs.sh                       # the default grid, in priority order
#   scripts/calibration_runs.sh --cells "4:1gbit:512 8:none:2048" --iters 6 --runs 3
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="$ROOT/benchmarks/results/calibration"
RUNS=3
ITERS=10
WARMUP=3
LOCAL=2
MODES="flat,sptt,dmt"
# G:rate:batch, most wanted first (the fit needs G=4 at two rates and two batches first)
CELLS="4:1gbit:512 4:1gbit:2048 4:2500mbit:512 4:2500mbit:2048 4:none:512 4:none:2048
8:1gbit:512 8:1gbit:2048 8:none:512 8:none:2048 4:500mbit:512 4:500mbit:2048
8:2500mbit:512 8:2500mbit:2048 4:1gbit:1024 8:1gbit:1024"
usage() {
    echo "usage: $0 [--out DIR] [--cells 'G:RATE:BATCH ...'] [--runs N] [--iters N]" \
        "[--warmup N] [--modes M1,M2] [--local-world-size L]" >&2
    exit 2
}
# a bad argument: say which and what was expected, exit 2 before anything is made
refuse() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out | --cells | --runs | --iters | --warmup | --modes | --local-world-size)
            [[ $# -ge 2 ]] || refuse "$1 needs a value"
            case "$1" in
                --out) OUT="$2" ;;
                --cells) CELLS="$2" ;;
                --runs) RUNS="$2" ;;
                --iters) ITERS="$2" ;;
                --warmup) WARMUP="$2" ;;
                --modes) MODES="$2" ;;
                --local-world-size) LOCAL="$2" ;;
            esac
            shift 2
            ;;
        *) usage ;;
    esac
done
[[ -n "$OUT" ]] || refuse "--out must name a directory, got ''"
[[ ! -e "$OUT" || -d "$OUT" ]] || refuse "--out $OUT exists and is not a directory"
# whether $1 is an integer from $2 to $3: digits only, no leading zero, and at most nine of them,
# so that bash's 64-bit arithmetic cannot wrap it round into the range
int_in() { [[ "$1" =~ ^(0|[1-9][0-9]{0,8})$ ]] && (($1 >= $2 && $1 <= $3)); }
int_in "$LOCAL" 1 1024 || refuse "--local-world-size must be an integer from 1 to 1024, got '$LOCAL'"
int_in "$RUNS" 3 1000 ||
    refuse "--runs must be an integer from 3 (a median of fewer is not a result) to 1000, got '$RUNS'"
int_in "$ITERS" 1 1000000 || refuse "--iters must be an integer from 1 to 1000000, got '$ITERS'"
int_in "$WARMUP" 0 1000000 || refuse "--warmup must be an integer from 0 to 1000000, got '$WARMUP'"
[[ "$MODES" =~ ^(flat|sptt|dmt)(,(flat|sptt|dmt))*$ ]] ||
    refuse "--modes must be a comma-separated list of flat, sptt, dmt, got '$MODES'"
[[ -n "${CELLS//[[:space:]]/}" ]] || refuse "--cells must name at least one G:RATE:BATCH cell"
for cell in $CELLS; do
    IFS=: read -r G RATE BATCH <<<"$cell"
    int_in "$G" 1 4096 && int_in "$BATCH" 1 10000000 && (((G % LOCAL) == 0)) &&
        [[ "$RATE" =~ ^(none|[0-9]+(\.[0-9]*)?[kmg]?bit)$ ]] ||
        refuse "bad cell '$cell': want G:RATE:BATCH with G a multiple of L=$LOCAL up to 4096, BATCH" \
            "an integer from 1 to 10000000 and RATE none or tc's rate (1gbit, 2500mbit)"
    # netns_throttle.sh emulates 1 to 200 hosts
    [[ "$RATE" == none || $((G / LOCAL)) -le 200 ]] ||
        refuse "bad cell '$cell': G/L = $((G / LOCAL)) hosts; a throttled cell emulates at most 200"
done
[[ -x "$PYTHON" ]] || { echo "no python at $PYTHON (set PYTHON=...)" >&2; exit 1; }
AS_ROOT=()
[[ $(id -u) -eq 0 ]] || AS_ROOT=(sudo)
# however the script ends: the running cell's command is stopped (and waited for), its temporary
# directory goes, and so do the directories of OUT this run made, if it wrote nothing there
tmp=""
made=() # the directories of OUT that do not exist yet, deepest first: never one that did
dir="$OUT"
while [[ ! -e "$dir" && ! -L "$dir" ]]; do
    made+=("$dir")
    dir="$(dirname "$dir")"
done
child=""    # the running cell's command
starting="" # set while it is being started, before its process id is known
got=""      # the signal (INT, TERM) that stops the script
cleanup() {
    [[ -z "$tmp" ]] || rm -rf "$tmp"
    local d
    for d in ${made[@]+"${made[@]}"}; do rmdir "$d" 2>/dev/null || break; done
}
trap cleanup EXIT
# on Ctrl-C or kill: stop the cell's command with TERM and wait for it, clean up, then end by the
# signal itself (as netns_throttle.sh does: a calling script stops too). An unthrottled cell runs
# in a session of its own (setsid): TERM goes to its whole process group, the ranks the benchmark
# spawned too. A throttled one runs netns_throttle.sh, which on TERM stops every process in its
# namespaces and removes them; under sudo it keeps the terminal (a password prompt), and the TERM
# is sent from a new session, as sudo relays no signal sent from its parent's process group.
on_signal() {
    got="$1"
    [[ -z "$starting" || -n "$child" ]] || return 0 # stopped once its process id is known
    trap - EXIT INT TERM
    if [[ -n "$child" ]]; then
        kill -TERM -- "-$child" 2>/dev/null || setsid -w kill -TERM "$child" 2>/dev/null ||
            kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    cleanup
    kill -s "$1" $$
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1

# (none where ip fails or is missing: under pipefail its status ended the script after a cell)
leftover_netns() {
    { ip netns list 2>/dev/null || true; } | awk '/^dmt[0-9]+(sw|h[0-9]+)/ {print $1}' | tr '\n' ' '
}

failed=0 # a cell that failed makes the exit status 1, once the others ran
for cell in $CELLS; do
    IFS=: read -r G RATE BATCH <<<"$cell" # checked above
    HOSTS=$((G / LOCAL))
    name="G${G}_${RATE}_B${BATCH}"
    dest="$OUT/$name.json"
    if [[ -e "$dest" ]]; then echo "skip $name (exists)" >&2; continue; fi
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/calib.XXXXXX")"
    bench=("$PYTHON" "$ROOT/benchmarks/bench_sptt.py" --world-size "$G" --local-world-size "$LOCAL"
        --modes "$MODES" --pipeline on --comm-precision fp32 --batch "$BATCH" --runs "$RUNS"
        --iters "$ITERS" --warmup "$WARMUP" --json "$tmp/bench.json"
        --peer-permute output)  # Figure 7's step c, as the stored cells were measured
    session=() # how the command starts (on_signal)
    if [[ "$RATE" == none ]]; then
        cmd=("${bench[@]}")
        session=(setsid -w)
    else
        cmd=("${AS_ROOT[@]}" bash "$ROOT/scripts/netns_throttle.sh" --hosts "$HOSTS" --rate "$RATE"
            -- env PYTHONPATH="$PYTHONPATH" OMP_NUM_THREADS=1 "${bench[@]}")
    fi
    load_before="$(cat /proc/loadavg)"
    date_utc="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "[$date_utc] $name: load $load_before" >&2
    start=$(date +%s)
    rc=0
    # in the background, so that a signal to the script is handled at once (on_signal), not
    # once the command has ended
    starting=1
    ${session[@]+"${session[@]}"} "${cmd[@]}" >"$tmp/log" 2>&1 &
    child=$!
    starting=""
    [[ -z "$got" ]] || on_signal "$got"
    wait "$child" || rc=$?
    child=""
    if ((rc != 0)); then
        echo "$name failed (exit status $rc); last lines:" >&2
        tail -n 20 "$tmp/log" >&2
        rm -rf "$tmp"
        tmp=""
        # interrupted (Ctrl-C, kill): stop here rather than go on to the next cell
        ((rc != 130 && rc != 143)) || exit "$rc"
        failed=1
        continue
    fi
    wall=$(($(date +%s) - start))
    load_after="$(cat /proc/loadavg)"
    left="$(leftover_netns)"
    [[ -z "$left" ]] || echo "WARNING: namespaces left after $name: $left" >&2
    # a record that cannot be made keeps the cell's measurements (the trap would remove them)
    keep="$tmp"
    tmp=""
    if ! "$PYTHON" - "$keep/bench.json" "$dest" <<EOF
import json, re, statistics, sys

records = json.load(open(sys.argv[1]))
rate = "$RATE"
units = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
modes = {}
for r in records:
    runs = r["ms_per_step_runs"]
    modes[r["mode"]] = {
        "ms_per_step_median": statistics.median(runs),
        "ms_per_step_min": min(runs),
        "ms_per_step_max": max(runs),
        "cross_host_mb": r["cross_host_mb"],
        "total_mb": r["total_mb"],
    }
out = {
    "settings": {
        "world_size": $G, "local_world_size": $LOCAL, "hosts": $HOSTS, "rate": rate,
        "rate_bit_per_s": float(m[1]) * units[m[2]] if m else None,
        "throttled": rate != "none", "batch_per_rank": $BATCH, "modes": "$MODES".split(","),
        "pipeline": True, "comm_precision": "fp32", "runs": $RUNS, "iters": $ITERS,
        "warmup": $WARMUP, "backend": "gloo (CPU)",
    },
    "modes": modes,
    "records": records,
    "load_before": "$load_before",
    "load_after": "$load_after",
    "date_utc": "$date_utc",
    "wall_s": $wall,
    "command": """${cmd[*]}""",
    "netns_left": "$left".split(),
}
from dmt.results import write_json  # whole or not at all: a later run skips what exists
write_json(sys.argv[2], out, indent=1, replace=False)
print(f"{sys.argv[2]}: " + ", ".join(f"{k} {v['ms_per_step_median']:.1f} ms" for k, v in modes.items()))
EOF
    then
        echo "$name: measured, but its record $dest could not be written; the measurements" \
            "are kept in $keep (bench.json, log)" >&2
        failed=1
        continue
    fi
    rm -rf "$keep"
done
exit "$failed"
