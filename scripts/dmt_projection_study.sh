#!/usr/bin/env bash
# What DMT-DLRM's tower modules cost on the forward protocol (issue 13): the base DLRM against
# DMT-DLRM with TP towers (4 and 8) at D = 8, 16 (criteo_forward_dmt_dlrm's), 32 (N = 32:
# compression ratio 4, 2, 1), with the projections initialised to keep dot products
# (model.tower.init=isometric, D = 16), and at D = N with the square projection left out
# (model.tower.skip_square=true: the towers then only regroup the features, the model is the base
# DLRM's). Then the projection's training: without its bias (model.tower.bias=false, D = 16 and
# 32), at a tenth, 0.3 and 3 times the dense LR (optim.tower_lr_scale), and frozen at an
# isometric init (optim.tower_lr_scale=0: a fixed random orthogonal projection). Every row sets
# model.tower.bias (criteo_forward_dmt_dlrm's default is false since 2026-12-02; the rows
# without "nobias" in their name keep the bias, as before); the *_nobias_iso rows are those
# without the bias with an isometric init. K seeds each (default 9), AUC on validation (rows
# 80-90%) and test (90-100%).
#
#   OMP_NUM_THREADS=1 bash scripts/dmt_projection_study.sh [OUT_DIR] [SEEDS]   # study/dmt_projection 9
#   ONLY="base tp4_d16_nobias tp4_d32_skip" bash scripts/dmt_projection_study.sh study/gap 0-26
#
# SEEDS is scripts/seeds.py's --seeds (K, LO-HI or a list), checked first; ONLY keeps the named
# configs (and the comparisons between them), in the order below. A relative OUT_DIR is taken
# from the directory you run the script in (the default is in the repository).
#
# 1. trains the base DLRM once (seed 0) with a checkpoint (a rerun resumes an interrupted one:
#    trainer.resume_from=auto) and partitions its embeddings' affinity
#    into 4 and 8 towers (as scripts/criteo_sample_study.sh does);
# 2. scripts/seeds.py, two processes on disjoint configs (2 cores), then the tables of val_auc
#    (OUT/val_auc.txt, OUT/seeds_val_auc.json / .png) and test_auc (OUT/test_auc.txt, and
#    OUT/seeds.json / seeds.png) with
#    Mann-Whitney U against the base and between variants. Finished runs are read back.
# 3. with ROWS=1 (0 or unset: not): every run trains with trainer.checkpoint=true (the same AUCs;
#    another OUT_DIR than a study without it), dmt-eval scores its checkpoint on val and test
#    with --predictions (SEED_DIR/pred_{val,test}.npz; a rerun reads those it finds back, and
#    refuses, before training, one that its eval_{val,test}.json does not record as the run's
#    last checkpoint on the whole split), and scripts/row_bootstrap.py compares every config with
#    the base over resampled rows (OUT/rows_{val,test}.json and .txt; README, Forward in time;
#    two configs or more):
#    ROWS=1 ONLY="base tp4_d16_nobias tp8_d16_nobias" bash scripts/dmt_projection_study.sh study/rows 9
# Needs ../shared/data/criteo-kaggle-sample/train.tsv (preprocessed on first use into data_cache/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT=${1:-}
SEEDS=${2:-9}
# the caller's OUT_DIR, made absolute before the cd into the repository (the default is there)
if [[ -z "$OUT" ]]; then OUT=study/dmt_projection; elif [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi
cd "$ROOT"
case "${ROWS:-}" in  # ROWS=0 is a study without the row tables, as an unset ROWS
  "" | 0) ROWS="" ;;
  1) ;;
  *) echo "ROWS='$ROWS': expected 1 (the row tables) or 0 (none, as unset)" >&2; exit 2 ;;
esac
if [[ "$OUT" =~ [[:space:]] ]]; then  # seeds.py splits each config's overrides at whitespace
  echo "OUT_DIR '$OUT' has whitespace; the study's configs name paths in it: choose one without" >&2
  exit 2
fi
PY=.venv/bin/python
DATA="data=criteo_sample_forward"
DMT="experiment=criteo_forward_dmt_dlrm $DATA"
tp() {  # towers, D, bias, further overrides
  echo "$DMT partition=tp model.partition.path=$OUT/tp$1/partition.yaml model.partition.num_towers=$1 model.tower.dim=$2 model.bottom_mlp=[64,$2] model.tower.bias=$3 ${4:-}"
}
frozen="optim.tower_lr_scale=0 model.tower.init=isometric"
configs=(
  --config base "experiment=criteo_forward_dlrm $DATA"
  --config tp4_d8 "$(tp 4 8 true)" --config tp4_d16 "$(tp 4 16 true)" --config tp4_d32 "$(tp 4 32 true)"
  --config tp8_d16 "$(tp 8 16 true)" --config tp8_d32 "$(tp 8 32 true)"
  --config tp4_d16_iso "$(tp 4 16 true model.tower.init=isometric)"
  --config tp8_d16_iso "$(tp 8 16 true model.tower.init=isometric)"
  --config tp4_d32_skip "$(tp 4 32 true model.tower.skip_square=true)"
  --config tp8_d32_skip "$(tp 8 32 true model.tower.skip_square=true)"
  --config tp4_d16_nobias "$(tp 4 16 false)" --config tp4_d32_nobias "$(tp 4 32 false)"
  --config tp8_d16_nobias "$(tp 8 16 false)" --config tp8_d32_nobias "$(tp 8 32 false)"
  --config tp4_d16_nobias_iso "$(tp 4 16 false model.tower.init=isometric)"
  --config tp8_d16_nobias_iso "$(tp 8 16 false model.tower.init=isometric)"
  --config tp4_d16_lr0.1 "$(tp 4 16 true optim.tower_lr_scale=0.1)"
  --config tp4_d16_lr0.3 "$(tp 4 16 true optim.tower_lr_scale=0.3)"
  --config tp4_d16_lr3 "$(tp 4 16 true optim.tower_lr_scale=3)"
  --config tp4_d16_lr0iso "$(tp 4 16 true "$frozen")" --config tp8_d16_lr0iso "$(tp 8 16 true "$frozen")"
  --config tp4_d16_nobias_lr0iso "$(tp 4 16 false "$frozen")"
  --config tp4_d32_nobias_lr0iso "$(tp 4 32 false "$frozen")"
)
if [[ -n "${ONLY:-}" ]]; then
  declare -A keep=()
  for name in $ONLY; do keep[$name]=1; done
  kept=()
  for ((i = 0; i < ${#configs[@]}; i += 3)); do
    if [[ -n "${keep[${configs[i + 1]}]:-}" ]]; then kept+=("${configs[@]:i:3}"); unset "keep[${configs[i + 1]}]"; fi
  done
  if (( ${#keep[@]} )); then
    echo "ONLY names configs this study does not have: ${!keep[*]}" >&2
    exit 2
  fi
  configs=("${kept[@]}")
fi
# a bad SEEDS (or one seed for two configs or more) ends the study here, not after the base
# training and the partitions
"$PY" -c 'import sys; from dmt.seeds import check_seeds_argument; check_seeds_argument(sys.argv[1:])' \
  "$(basename "$0")" "$SEEDS" "$(( ${#configs[@]} / 3 ))" || exit 2
if [[ -n "${ROWS:-}" ]]; then
  # row_bootstrap.py compares configs: one would train and be scored, then stop there
  if (( ${#configs[@]} / 3 < 2 )); then
    echo "ROWS=1 compares configs over the rows (scripts/row_bootstrap.py); ONLY='$ONLY'" \
      "names one: name two or more" >&2
    exit 2
  fi
  # the predictions a rerun finds are read, not scored again: only those of their run as it
  # ended, on the whole split (a file of other rows or another checkpoint is refused)
  scored=()
  for ((i = 0; i < ${#configs[@]}; i += 3)); do scored+=("${configs[i + 1]}"); done
  "$PY" -c 'import sys; from dmt.seeds import check_scored_runs; check_scored_runs(sys.argv[1:])' \
    "$(basename "$0")" "$OUT" "$SEEDS" "${scored[@]}" || exit 2
fi
if [[ ! -f "$OUT/base_ckpt/metrics.json" ]]; then
  "$PY" -m dmt.train experiment=criteo_forward_dlrm "$DATA" logger=disabled trainer.progress_bar=false \
    trainer.checkpoint=true trainer.resume_from=auto "hydra.run.dir=$OUT/base_ckpt"
fi
for T in 4 8; do
  if [[ ! -f "$OUT/tp$T/partition.yaml" ]]; then
    .venv/bin/dmt-partition --checkpoint "$OUT/base_ckpt/checkpoints" --data train --max-batches 40 \
      --batch-size 512 --num-towers "$T" --out "$OUT/tp$T"
  fi
done
quiet="logger=disabled trainer.progress_bar=false"
[[ -n "${ROWS:-}" ]] && quiet+=" trainer.checkpoint=true"
# --overwrite: the summaries below are of every run in OUT, read back; a rerun that adds seeds
# or configs writes them again
common=(--seeds "$SEEDS" --out "$OUT" --common "$quiet" --overwrite)
# two processes, every other config each, each with its own summary (train_a/b.json); the
# tables of every config follow below
half=(); other=()
for ((i = 0; i < ${#configs[@]}; i += 3)); do
  if (( (i / 3) % 2 == 0 )); then half+=("${configs[@]:i:3}"); else other+=("${configs[@]:i:3}"); fi
done
pids=()
# background jobs of a script ignore Ctrl-C: end them with the script, however it ends
trap '((${#pids[@]} == 0)) || kill "${pids[@]}" 2>/dev/null || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$PY" scripts/seeds.py "${common[@]}" --name train_a "${half[@]}" > "$OUT/train_a.log" 2>&1 &
pids+=("$!")
if (( ${#other[@]} )); then
  "$PY" scripts/seeds.py "${common[@]}" --name train_b "${other[@]}" > "$OUT/train_b.log" 2>&1 &
  pids+=("$!")
fi
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done  # a bare wait returns 0 whatever failed
pids=()
if (( failed )); then
  echo "training failed: see $OUT/train_a.log and $OUT/train_b.log" >&2
  tail -n 5 "$OUT"/train_*.log >&2
  exit 1
fi
pairs=()
for ((i = 3; i < ${#configs[@]}; i += 3)); do pairs+=(--pair "${configs[i + 1]}" base); done
pairs+=(--pair tp4_d32 tp4_d16 --pair tp8_d32 tp8_d16 --pair tp4_d16_iso tp4_d16 --pair tp8_d16_iso tp8_d16 --pair tp4_d32_skip tp4_d32 --pair tp8_d32_skip tp8_d32)
for c in tp4_d16 tp4_d32 tp8_d16 tp8_d32; do pairs+=(--pair "${c}_nobias" "$c"); done
for c in tp4_d16_nobias tp8_d16_nobias; do pairs+=(--pair "${c}_iso" "$c"); done
for c in lr0.1 lr0.3 lr3 lr0iso; do pairs+=(--pair "tp4_d16_$c" tp4_d16); done
pairs+=(--pair tp8_d16_lr0iso tp8_d16 --pair tp4_d32_nobias_lr0iso tp4_d32_skip)
for c in tp4_d16_nobias tp8_d16_nobias; do pairs+=(--pair "$c" tp4_d32_skip); done
# the comparisons whose two configs both run
names=" "
for ((i = 0; i < ${#configs[@]}; i += 3)); do names+="${configs[i + 1]} "; done
kept=()
for ((i = 0; i < ${#pairs[@]}; i += 3)); do
  if [[ "$names" == *" ${pairs[i + 1]} "* && "$names" == *" ${pairs[i + 2]} "* ]]; then kept+=("${pairs[@]:i:3}"); fi
done
pairs=("${kept[@]}")
"$PY" scripts/seeds.py "${common[@]}" --no-train --metric val_auc "${configs[@]}" "${pairs[@]}" | tee "$OUT/val_auc.txt"
"$PY" scripts/seeds.py "${common[@]}" --no-train --metric test_auc "${configs[@]}" "${pairs[@]}" | tee "$OUT/test_auc.txt"
if [[ -n "${ROWS:-}" ]]; then
  names=()
  for ((i = 0; i < ${#configs[@]}; i += 3)); do names+=("${configs[i + 1]}"); done
  read -ra seeds <<< "$("$PY" -c "import sys; from dmt.seeds import parse_seeds; print(*parse_seeds(sys.argv[1]))" "$SEEDS")"
  for name in "${names[@]}"; do
    for seed in "${seeds[@]}"; do
      run="$OUT/$name/seed_$seed"
      for split in val test; do
        [[ -f "$run/pred_$split.npz" ]] || .venv/bin/dmt-eval --checkpoint "$run/checkpoints" \
          --data "$split" --out "$run/eval_$split.json" --predictions "$run/pred_$split.npz" \
          --no-progress > /dev/null
      done
    done
  done
  for split in val test; do
    groups=()
    for name in "${names[@]}"; do
      groups+=(--group "$name")
      for seed in "${seeds[@]}"; do groups+=("$OUT/$name/seed_$seed/pred_$split.npz"); done
    done
    "$PY" scripts/row_bootstrap.py "${groups[@]}" --resamples 2000 --out "$OUT/rows_$split.json" \
      --overwrite | tee "$OUT/rows_$split.txt"
  done
fi
