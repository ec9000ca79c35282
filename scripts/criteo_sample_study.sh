#!/usr/bin/env bash
# DMT on the real Criteo Kaggle sample (paper Table 6 protocol, CPU-sized): base DLRM (and DCN)
# against DMT 2T/4T/8T-DLRM with Tower Partitioner (TP) towers and with naive strided towers, K
# seeds each. PROTOCOL=forward (default): the forward-in-time protocol, train on rows 0-80%,
# validate on 80-90%, report 90-100% (data=criteo_sample_forward, experiments criteo_forward_*,
# tuned by hparams_search=criteo_forward_*); PROTOCOL=refit: the same settings trained again on
# rows 0-90% (data=criteo_sample_forward_refit), reported on the same 90-100%; PROTOCOL=holdout:
# train on the first 85%, test on the last 15% (data=criteo_sample_holdout, experiments
# criteo_sample_*), the former protocol.
#
#   bash scripts/criteo_sample_study.sh [OUT_DIR] [SEEDS]   # defaults: study/criteo_<PROTOCOL> 9
#
# A relative OUT_DIR is taken from the directory you run the script in (the default is in the
# repository); SEEDS is scripts/seeds.py's --seeds (K, LO-HI or a list), checked first.
#
# 1. trains the base DLRM once (seed 0) with a checkpoint (a rerun resumes an interrupted one);
# 2. dmt-partition --checkpoint: the feature affinity of its embeddings over 40 training batches
#    (20k rows; no test rows), partitioned into 2, 4 and 8 towers (OUT/tp{2,4,8}/partition.yaml,
#    affinity_heatmap.png, affinity.npy);
# 3. scripts/seeds.py: 8 configs x SEEDS seeds; median/std of test AUC and Mann-Whitney U of TP
#    against naive at each tower count (OUT/seeds.json). Finished runs are read back, not rerun.
# Needs ../shared/data/criteo-kaggle-sample/train.tsv (preprocessed on first use into data_cache/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROTOCOL=${PROTOCOL:-forward}
case "$PROTOCOL" in
  forward) DATA="data=criteo_sample_forward"; EXP=criteo_forward ;;
  refit) DATA="data=criteo_sample_forward_refit"; EXP=criteo_forward ;;
  holdout) DATA="data=criteo_sample_holdout"; EXP=criteo_sample ;;
  *) echo "PROTOCOL=$PROTOCOL: expected forward, refit or holdout" >&2; exit 2 ;;
esac
OUT=${1:-}
SEEDS=${2:-9}
# the caller's OUT_DIR, made absolute before the cd into the repository (the default is there)
if [[ -z "$OUT" ]]; then OUT="study/criteo_$PROTOCOL"; elif [[ "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi
cd "$ROOT"
if [[ "$OUT" =~ [[:space:]] ]]; then  # seeds.py splits each config's overrides at whitespace
  echo "OUT_DIR '$OUT' has whitespace; the study's configs name paths in it: choose one without" >&2
  exit 2
fi
PY=.venv/bin/python
# a bad SEEDS ends the study here, not after the base training and the partitions
"$PY" -c 'import sys; from dmt.seeds import check_seeds_argument; check_seeds_argument(sys.argv[1:])' \
  "$(basename "$0")" "$SEEDS" || exit 2

# trainer.resume_from=auto: a rerun after an interrupted base training goes on from its latest
# checkpoint (or afresh without one), where dmt-train refuses a directory holding its history
if [[ ! -f "$OUT/base_ckpt/metrics.json" ]]; then
  "$PY" -m dmt.train "experiment=${EXP}_dlrm" "$DATA" logger=disabled trainer.progress_bar=false \
    trainer.checkpoint=true trainer.resume_from=auto "hydra.run.dir=$OUT/base_ckpt"
fi
for T in 2 4 8; do
  if [[ ! -f "$OUT/tp$T/partition.yaml" ]]; then
    .venv/bin/dmt-partition --checkpoint "$OUT/base_ckpt/checkpoints" --data train --max-batches 40 \
      --batch-size 512 --num-towers "$T" --out "$OUT/tp$T"
  fi
done

DMT="experiment=${EXP}_dmt_dlrm $DATA"
# --overwrite: seeds.json and seeds.png summarize every run in OUT (finished runs are read back,
# not rerun), so a rerun that adds seeds writes them again
args=(--seeds "$SEEDS" --out "$OUT" --common "logger=disabled trainer.progress_bar=false" --overwrite)
args+=(--config base "experiment=${EXP}_dlrm $DATA" --config dcn "experiment=${EXP}_dcn $DATA")
for T in 2 4 8; do
  args+=(--config "tp${T}" "$DMT partition=tp model.partition.path=$OUT/tp$T/partition.yaml model.partition.num_towers=$T")
  args+=(--config "naive${T}" "$DMT model.partition.num_towers=$T")
done
for T in 2 4 8; do args+=(--pair "tp$T" "naive$T"); done
for T in 2 4 8; do args+=(--pair "tp$T" base); done
args+=(--pair dcn base)
"$PY" scripts/seeds.py "${args[@]}"
