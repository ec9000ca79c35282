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
