#!/usr/bin/env bash
# Create .venv/ in the repo root and install dmt with its dependencies. Idempotent: a second run
# checks a stamp (hash of the requirement files) and returns at once when nothing changed.
#   DMT_VARIANT=cpu | gpu                which torch/fbgemm stack to install (unset: the stack an
#                                        existing .venv holds, else cpu); switching removes the other
#   PYTHON=python3.11                    interpreter used to create the venv (3.11 or newer)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
# the stack installed now: "gpu" (fbgemm-gpu and a CUDA torch), "cpu" (fbgemm-gpu-cpu), "other",
# or "" (none, or no .venv)
installed_stack() {
  [[ -x "$VENV/bin/python" ]] || return 0
  "$VENV/bin/python" - <<'PYEOF' 2>/dev/null || true
import importlib.metadata as m
names = {d.metadata["Name"].lower().replace("_", "-") for d in m.distributions()}
if "fbgemm-gpu-cpu" in names and "fbgemm-gpu" not in names:
    print("cpu")
elif "fbgemm-gpu" in names and "fbgemm-gpu-cpu" not in names:
    import torch
    print("gpu" if torch.version.cuda else "other")
elif names & {"torch", "fbgemm-gpu", "fbgemm-gpu-cpu"}:
    print("other")
PYEOF
}
INSTALLED="$(installed_stack)"
if [[ -n "${DMT_VARIANT:-}" ]]; then
  VARIANT="$DMT_VARIANT"
elif [[ "$INSTALLED" == cpu || "$INSTALLED" == gpu ]]; then
  VARIANT="$INSTALLED"  # e.g. scripts/test.sh on a GPU machine keeps its CUDA stack
else
  VARIANT=cpu
fi
if [[ "$VARIANT" != cpu && "$VARIANT" != gpu ]]; then
  echo "DMT_VARIANT must be cpu or gpu, got '$VARIANT'" >&2; exit 2
fi
STAMP="$VENV/.dmt-setup-$VARIANT"
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements/"*.txt | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]] && "$VENV/bin/python" -c "import dmt, torchrec" 2>/dev/null; then
  exit 0
fi
# the oldest Python dmt runs on: pyproject.toml's requires-python (the pinned numpy, scipy,
# scikit-learn and matplotlib of requirements/common.txt need it too)
MIN_PYTHON=3.11
# refuse interpreter $1 (named $2) older than MIN_PYTHON before pip fails on the first pin it has
# no wheel for; $3: what to do instead (an interpreter that does not run is left to the steps below)
check_python() {
  local version
  version="$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || return 0
  [[ "$version" =~ ^([0-9]+)\.([0-9]+)$ ]] || return 0
  if (( BASH_REMATCH[1] * 1000 + BASH_REMATCH[2] < ${MIN_PYTHON%.*} * 1000 + ${MIN_PYTHON#*.} )); then
    echo "$2 is Python $version; dmt needs Python $MIN_PYTHON or newer: $3" >&2
    exit 2
  fi
}
if [[ -x "$VENV/bin/python" ]]; then
  check_python "$VENV/bin/python" "$VENV" \
    "remove it, then run PYTHON=python$MIN_PYTHON (or newer) bash scripts/setup.sh"
fi
# a venv without pip (python3 -m venv fails at ensurepip without Debian's python3-venv, after
# making bin/python) is made again, not taken for a working one on every later run
has_pip() { "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }
# (a working venv without pip, e.g. uv's, gets it from ensurepip rather than made again)
if [[ -x "$VENV/bin/python" ]] && ! has_pip; then
  "$VENV/bin/python" -m ensurepip --upgrade >/dev/null 2>&1 || true
fi
if ! [[ -x "$VENV/bin/python" ]] || ! has_pip; then
  check_python "$PY" "PYTHON=$PY" "set PYTHON=python$MIN_PYTHON (or a newer interpreter)"
  if ! "$PY" -m venv --clear "$VENV"; then
    echo "cannot create $VENV with $PY (on Debian/Ubuntu: apt-get install python3-venv, or" \
      "python3.X-venv for PYTHON=python3.X)" >&2
    exit 1
  fi
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip
# pip keeps torch 2.13.0+cpu for a "torch==2.13.0" requirement and would put fbgemm-gpu beside
# fbgemm-gpu-cpu, so a switch starts from neither
if [[ -n "$INSTALLED" && "$INSTALLED" != "$VARIANT" ]]; then
  echo "switching .venv from the $INSTALLED stack to the $VARIANT one"
  "$VENV/bin/python" -m pip uninstall --disable-pip-version-check -q -y torch fbgemm-gpu fbgemm-gpu-cpu || true
  rm -f "$VENV"/.dmt-setup-*
fi
case "$VARIANT" in
  cpu) "${PIP[@]}" -r "$ROOT/requirements/cpu.txt" ;;
  gpu) "${PIP[@]}" -r "$ROOT/requirements/gpu.txt" --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}" ;;
esac
"${PIP[@]}" --no-deps -r "$ROOT/requirements/torchrec.txt"
"${PIP[@]}" -r "$ROOT/requirements/common.txt"
"${PIP[@]}" --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import torch, torchrec, fbgemm_gpu, dmt" >/dev/null
echo "$HASH" > "$STAMP"
echo "dmt installed in $VENV ($VARIANT)"
