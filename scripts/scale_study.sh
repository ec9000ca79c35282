#!/usr/bin/env bash
# The paper's scale study (Figures 10-13), predicted by dmt-plan's model: V100/A100/H100 clusters,
# 16-512 GPUs, DLRM and DCN. Writes results.json, table.md and four PNGs into a new directory
# (default outputs/scale_study/<date>-<time>). Extra arguments go to benchmarks/scale_study.py
# (e.g. --flat-search uniform for a fast run, --presets h100, --gpus 64,512).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
out="outputs/scale_study/$(date +%Y-%m-%d-%H%M%S)"
exec .venv/bin/python benchmarks/scale_study.py --out "$out" "$@"
