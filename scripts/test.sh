#!/usr/bin/env bash
# Set up (if needed) and run the test suite (not the `slow` tests; `bash scripts/test.sh -m slow` runs those).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
