#!/usr/bin/env bash
# Emulate H hosts on one machine: one network namespace per host, joined by a bridge in a switch
# namespace, every host link throttled to RATE (default 1 Gbit/s) in each direction with tc tbf.
# Ranks on the same host talk over that namespace's loopback (unlimited); ranks on different
# hosts cross the throttled links. Runs COMMAND once per host, inside the host's namespace, with
#
#   DMT_NNODES=H  DMT_NODE_RANK=h  DMT_INIT_FILE=<shared rendezvous file>
#   GLOO_SOCKET_IFNAME=<the host's link>   (gloo advertises the host's address)
#
# and removes every namespace, link and qdisc it made when the commands end (or on Ctrl-C).
# Needs root (ip netns, tc). Touches no interface outside the namespaces it creates.
#
# Example (8 ranks, 4 hosts of 2, benchmark reads DMT_* as defaults of --nnodes/--node-rank/--init-file):
#   sudo scripts/netns_throttle.sh --hosts 4 -- \
#       .venv/bin/python benchmarks/bench_sptt.py --world-size 8 --local-world-size 2
set -euo pipefail

HOSTS=2
RATE=1gbit
BURST=512kb
usage() {
    echo "usage: $0 [--hosts H] [--rate RATE] [--burst BURST] -- COMMAND [ARGS...]" >&2
    exit 2
}
# a bad argument: say which and what was expected, exit 2 before anything is made
refuse() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --hosts | --rate | --burst)
            [[ $# -ge 2 && "$2" != -- ]] || refuse "$1 needs a value"
            case "$1" in
                --hosts) HOSTS="$2" ;;
                --rate) RATE="$2" ;;
                --burst) BURST="$2" ;;
            esac
            shift 2
            ;;
        --) shift; break ;;
        *) usage ;;
    esac
done
[[ $# -gt 0 ]] || usage
# (three digits at most: bash's arithmetic cannot wrap a longer number round into the range)
[[ "$HOSTS" =~ ^[1-9][0-9]{0,2}$ ]] && ((HOSTS <= 200)) ||
    refuse "--hosts must be an integer from 1 to 200, got '$HOSTS'"
# tc's forms (tc(8), "PARAMETERS"), units in any case: a rate is a number then bit or bps (bytes
# per second), SI or IEC prefixed (kbit, mbit, gbit, tbit, kibit, ..., kbps, ..., kibps, ...); a
# size is a number, bytes, or with b, k/kb, m/mb, g/gb (bytes), kbit, mbit, gbit (or IEC kib...).
# A rate of 0 makes no link.
[[ "${RATE,,}" =~ ^[0-9]+(\.[0-9]*)?([kmgt]i?)?(bit|bps)$ && "${RATE%%[!0-9.]*}" =~ [1-9] ]] ||
    refuse "--rate must be a rate in tc's form, a number above 0 with a unit (1gbit, 2500mbit," \
        "500kbit, 100mbps), got '$RATE'"
[[ "${BURST,,}" =~ ^[0-9]+(\.[0-9]*)?(b|([kmg]i?)(b|bit)?)?$ && "${BURST%%[!0-9.]*}" =~ [1-9] ]] ||
    refuse "--burst must be a size in tc's form, a number above 0 of bytes or with a unit (512kb," \
        "1mb, 64kbit), got '$BURST'"
[[ $(id -u) -eq 0 ]] || { echo "$0 needs root (ip netns, tc)" >&2; exit 1; }

# unique per invocation: parallel runs do not collide, and the namespaces a killed run (SIGKILL:
# no cleanup) left under a process id now reused are neither taken nor removed
ours() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qE "^$1(sw|h[0-9]+)$"; }
TAG="dmt$$"
while ours "$TAG"; do TAG="dmt$$$RANDOM"; done
SWITCH="${TAG}sw"
RUNDIR="$(mktemp -d /tmp/${TAG}.XXXX)"
INIT_FILE="$RUNDIR/rendezvous"
PIDS=()
MADE=() # the namespaces this run created: the only ones it removes

# every process left in the host namespaces (a command's own children too: the ranks a
# benchmark spawns outlive their parent; ip netns del would leave them a nameless namespace)
host_pids() {
    for ((h = 0; h < HOSTS; h++)); do ip netns pids "${TAG}h$h" 2>/dev/null || true; done
}
cleanup() {
    trap - EXIT INT TERM
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do kill "$pid" 2>/dev/null || true; done
    local left
    left="$(host_pids)"
    [[ -z "$left" ]] || kill $left 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        [[ -n "$(host_pids)" ]] || break
        sleep 0.5
    done
    left="$(host_pids)"
    [[ -z "$left" ]] || kill -KILL $left 2>/dev/null || true
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do wait "$pid" 2>/dev/null || true; done
    # the switch's removes the bridge and the switch-side links
    for ns in ${MADE[@]+"${MADE[@]}"}; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$RUNDIR"
}
trap cleanup EXIT
# after cleaning up, end by the signal itself (not exit 130): a calling script then stops too,
# where a plain exit status would read as a failed command and its loop would go on
trap 'cleanup; kill -INT $$' INT
trap 'cleanup; kill -TERM $$' TERM

ip netns add "$SWITCH"
MADE+=("$SWITCH")
ip -n "$SWITCH" link set lo up
ip -n "$SWITCH" link add br0 type bridge
ip -n "$SWITCH" link set br0 up
for ((h = 0; h < HOSTS; h++)); do
    ns="${TAG}h$h"
    ip netns add "$ns"
    MADE+=("$ns")
    ip -n "$ns" link set lo up
    # host side "eth<h>" in the host's namespace, switch side in the switch's, created from the
    # switch's namespace: kernels before 6.14 check a new link's name in the namespace the
    # command runs in, where this machine's own eth0 would make "File exists"
    ip -n "$SWITCH" link add "sw$h" type veth peer name "eth$h" netns "$ns"
    ip -n "$ns" addr add "10.213.$((h / 250)).$((h % 250 + 1))/16" dev "eth$h"
    ip -n "$ns" link set "eth$h" up
    ip -n "$SWITCH" link set "sw$h" master br0
    ip -n "$SWITCH" link set "sw$h" up
    # host -> switch (egress of the host) and switch -> host (its ingress)
    ip netns exec "$ns" tc qdisc add dev "eth$h" root tbf rate "$RATE" burst "$BURST" latency 100ms
    ip netns exec "$SWITCH" tc qdisc add dev "sw$h" root tbf rate "$RATE" burst "$BURST" latency 100ms
done
echo "emulating $HOSTS hosts at $RATE per link (namespaces ${TAG}h0..${TAG}h$((HOSTS - 1)))" >&2

for ((h = 0; h < HOSTS; h++)); do
    ip netns exec "${TAG}h$h" env DMT_NNODES="$HOSTS" DMT_NODE_RANK="$h" DMT_INIT_FILE="$INIT_FILE" \
        GLOO_SOCKET_IFNAME="eth$h" "$@" &
    PIDS+=("$!")
done
status=0
for pid in ${PIDS[@]+"${PIDS[@]}"}; do wait "$pid" || status=$?; done
PIDS=()
exit "$status"
