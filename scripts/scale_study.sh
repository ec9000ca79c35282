#!/usr/bin/env bash
# The paper's scale study (Figures 10-13), predicted by dmt-plan's model: V100/A100/H100 clusters,
# 16-512 GPUs, DLRM and DCN. Writes results.json, table.md and four PNGs into a new directory
# (default outputs/scale_study/<date>-<time> in the repository; a relative --out DIR is taken
# from the directory you run the script in). Extra arguments go to benchmarks/scale_study.py
# (e.g. --flat-search uniform for a fast run, --presets h100, --gpus 64,512).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# the caller's --out, made absolute here: the study runs in the repository
out=""
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out | --out=*)
      if [[ "$1" == --out ]]; then
        [[ $# -ge 2 ]] || { echo "scale_study.sh: --out needs a value (a new directory)" >&2; exit 2; }
        out="$2"
        shift 2
      else
        out="${1#--out=}"
        shift
      fi
      [[ -n "$out" ]] || { echo "scale_study.sh: --out must name a directory, got ''" >&2; exit 2; }
      [[ "$out" == /* ]] || out="$PWD/$out"
      ;;
    *) args+=("$1"); shift ;;
  esac
done
cd "$ROOT"
[ -x .venv/bin/python ] || bash scripts/setup.sh
[[ -n "$out" ]] || out="outputs/scale_study/$(date +%Y-%m-%d-%H%M%S)"
exec .venv/bin/python benchmarks/scale_study.py --out "$out" ${args[@]+"${args[@]}"}
