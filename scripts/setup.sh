#!/usr/bin/env bash
# Create .venv/ in the repo root and install dmt with its dependencies. Idempotent: a second run
# checks a stamp (hash of the requirement files) and returns at once when nothing changed.
#   DMT_VARIANT=cpu (default) | gpu     which torch/fbgemm stack to install
#   PYTHON=python3.11                    interpreter used to create the venv
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VARIANT="${DMT_VARIANT:-cpu}"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
STAMP="$VENV/.dmt-setup-$VARIANT"
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements/"*.txt | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]] && "$VENV/bin/python" -c "import dmt, torchrec" 2>/dev/null; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip
case "$VARIANT" in
  cpu) "${PIP[@]}" -r "$ROOT/requirements/cpu.txt" ;;
  gpu) "${PIP[@]}" -r "$ROOT/requirements/gpu.txt" --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}" ;;
  *) echo "DMT_VARIANT must be cpu or gpu, got '$VARIANT'" >&2; exit 2 ;;
esac
"${PIP[@]}" --no-deps -r "$ROOT/requirements/torchrec.txt"
"${PIP[@]}" -r "$ROOT/requirements/common.txt"
"${PIP[@]}" --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import torch, torchrec, fbgemm_gpu, dmt" >/dev/null
echo "$HASH" > "$STAMP"
echo "dmt installed in $VENV ($VARIANT)"
