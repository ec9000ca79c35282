#!/usr/bin/env bash
# Set up (if needed) and run the test suite (not the `slow` tests; `bash scripts/test.sh -m slow` runs those).
#   DMT_TEST_WORKERS=N   pytest-xdist workers (default: 2 for the suite, whole files per worker;
#                        0 runs in this process; `-m ...` runs, a `-n` of your own, --pdb, --trace,
#                        -s, -p no:xdist and machines with a GPU default to 0: the CUDA/NCCL tests
#                        take every GPU, one at a time)
# One torch thread per process unless OMP_NUM_THREADS says otherwise: the workers and the ranks
# the tests start share the cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
workers=2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  workers=0
fi
for arg in "$@"; do
  case "$arg" in
    # the slow / cluster tests run one at a time; a debugger, -s and -p no:xdist need one process
    -m|-m*|-n|-n*|--numprocesses*|--pdb|--trace|-s|--capture=no|no:xdist|-pno:xdist) workers=0 ;;
  esac
done
# the slow tier's packet-level tests (tests/unit/test_ns3_sim.py) need ns-3's Python package,
# dmt's `sim` extra (about 300 MB, 2 minutes): installed here once, not by setup.sh for everyone
prev=""
for arg in "$@"; do
  marks=""
  [[ "$prev" == -m ]] && marks="$arg"
  [[ "$arg" == -m?* ]] && marks="${arg#-m}"
  if [[ "$marks" == *slow* && "$marks" != "not slow"* ]] && ! "$ROOT/.venv/bin/python" -c "import ns" 2>/dev/null; then
    echo "installing ns-3's Python package for the slow tier (dmt's sim extra: pip install ns3)" >&2
    "$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check -q ns3 ||
      echo "could not install ns3: the slow tier's two ns-3 cases skip" >&2
  fi
  prev="$arg"
done
workers="${DMT_TEST_WORKERS:-$workers}"
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "DMT_TEST_WORKERS must be a number of workers (0: none), got '$workers'" >&2; exit 2
fi
if (( workers > 0 )); then
  # files in the order collected (tests/distributed, integration, then unit: the long ones first),
  # not xdist's default of the files with the most tests first, which left the few-but-long
  # integration files to the end and one worker idle meanwhile
  exec "$ROOT/.venv/bin/python" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
exec "$ROOT/.venv/bin/python" -m pytest "$@"
