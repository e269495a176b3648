#!/usr/bin/env bash
# The full-size check of the batch-moment re-fits of docs/reproduction/ding2022.md ("The flow inside
# fine-tuning: what was tried"): whitening, all-but-the-top and conceptor negation re-fitted every
# step from running batch moments (`--recalibrate-every 1 --calibration-options refit_on=batch`), at
# the grid's settings (its pre-check's learning rate and epochs, all training data, 3 seeds), on the
# informative tasks cheapest first. `none`'s cells have the grid's configuration, so they are copied
# from the grid's folder, where the store finds them instead of running them again. Resumable cell
# by cell; every finished cell is written under docs/reproduction/results/ at once.
#   bash scripts/ding_batch_refits.sh [TASK ...] > ding-batch-refits.log 2>&1 &
# DING_VARIANT=cie-guard runs the other fix at the grid's size the same way: CIE with the guard
# (`--calibration-options guard_isoscore=0.5`: a re-fit wherever the fit in use gives IsoScore below 0.5
# at a check), into ding-cie-guard-minilm-TASK.
# Two single-thread workers at normal priority (DING_WORKERS=1: one); DING_RESULTS as in ding_grid.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${LMGEOM_DATA:-../shared/data}  # as given: results record it, and a machine's absolute path must not travel
GLUE=$DATA/GLUE
R=${DING_RESULTS:-docs/reproduction/results}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
declare -A FOLDER=([cola]=$GLUE/CoLA [sst2]=$GLUE/SST-2 [mrpc]=$GLUE/MRPC [sicke]=$DATA/SICK)
VARIANT=${DING_VARIANT:-batch-refits}
case $VARIANT in
  batch-refits) METHODS=none,whitening,abtt,conceptor; OPTIONS=(--recalibrate-every 1 --calibration-options refit_on=batch) ;;
  cie-guard) METHODS=none,cie; OPTIONS=(--calibration-options guard_isoscore=0.5) ;;
  *) echo "unknown DING_VARIANT $VARIANT; choose batch-refits or cie-guard"; exit 2 ;;
esac
TASKS=("$@")
[ ${#TASKS[@]} -gt 0 ] || TASKS=(cola sicke sst2 mrpc)

for task in "${TASKS[@]}"; do
  [ -n "${FOLDER[$task]:-}" ] || { echo "unknown task $task; choose from ${!FOLDER[*]}"; exit 2; }
  out=$R/ding-$VARIANT-minilm-$task
  mkdir -p "$out/cells"
  for cell in "$R/ding-grid-minilm-$task"/cells/*.json; do
    [ -e "$cell" ] || continue
    python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["config"]["method"] != "none")' "$cell" \
      && cp -n "$cell" "$out/cells/"
  done
  echo "== $task $(date -u +%FT%TZ)"
  lmgeom experiment calibration --model minilm --task "$task" --data "${FOLDER[$task]}" --regime finetune \
    --methods "$METHODS" "${OPTIONS[@]}" \
    --seeds 3 --precheck "$R/ding-precheck-minilm" --device cpu --num-workers "${DING_WORKERS:-2}" --out "$out" \
    || echo "== $task not run (exit $?)"
done
echo "== done $(date -u +%FT%TZ)"
