#!/usr/bin/env bash
# Set up (if needed) and run the default job: DLRM on dmt's planted synthetic data.
# Extra arguments are Hydra overrides, e.g. `bash scripts/quickstart.sh model=dcn`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/dmt-train" "$@"
