#!/usr/bin/env bash
# The diagnostic of docs/reproduction/ding2022.md ("The flow inside fine-tuning: what was tried"):
# MiniLM on CoLA, seed 0, a 2,000-sentence training subsample, lr 1e-4, 3 epochs; `none` and the
# flow as in the grid, then the flow (and whitening) with each way of keeping the layer fitted
# (`--calibration-options`, `--recalibrate-every`; CalibrationOptions in docs/finetune.md). One folder
# per variant under docs/reproduction/results/ding-flow-fixes-minilm-cola/; `none`'s cell has the
# same configuration in every folder, so it is computed once (in flow-grid) and copied into the
# others, where the store finds it instead of running it again.
#   bash scripts/ding_flow_fixes.sh [VARIANT ...] > ding-flow-fixes.log 2>&1 &
# Variants run one after the other (all of them, in the order below, when none is named); each is
# resumable cell by cell. One single-thread worker at normal priority.
set -uo pipefail
cd "$(dirname "$0")/.."
COLA=${LMGEOM_DATA:-../shared/data}/GLUE/CoLA  # as given: results record it, and a machine's absolute path must not travel
R=${DING_RESULTS:-docs/reproduction/results}/ding-flow-fixes-minilm-cola
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
declare -A ARGS=(
  [flow-grid]="--methods flow"
  [flow-joint]="--methods flow --calibration-options flow_training=joint"
  [flow-guard]="--methods flow --calibration-options guard_isoscore=0.5"
  [flow-penalty]="--methods flow --calibration-options variance_penalty=1"
  [flow-joint-encoder]="--methods flow --calibration-options flow_training=joint,flow_nll_into_encoder=true"
  [flow-refit10]="--methods flow --recalibrate-every 10"
  [whitening-grid]="--methods whitening"
  [whitening-batch]="--methods whitening --recalibrate-every 1 --calibration-options refit_on=batch"
  [whitening-penalty]="--methods whitening --calibration-options variance_penalty=1"
  [abtt-grid]="--methods abtt"
  [abtt-batch]="--methods abtt --recalibrate-every 1 --calibration-options refit_on=batch"
  [conceptor-grid]="--methods conceptor"
  [conceptor-batch]="--methods conceptor --recalibrate-every 1 --calibration-options refit_on=batch"
  [cie-grid]="--methods cie"
  [cie-guard]="--methods cie --calibration-options guard_isoscore=0.5"
)
ORDER=(flow-grid flow-joint flow-guard flow-penalty flow-joint-encoder flow-refit10 whitening-grid whitening-batch whitening-penalty
       abtt-grid abtt-batch conceptor-grid conceptor-batch cie-grid cie-guard)
[ $# -gt 0 ] && ORDER=("$@")

copy_none() {  # none's finished cell from flow-grid into folder $1
  mkdir -p "$1/cells"
  for cell in "$R"/flow-grid/cells/*.json; do
    [ -e "$cell" ] || continue
    python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["config"]["method"] != "none")' "$cell" \
      && cp -n "$cell" "$1/cells/"
  done
}

for variant in "${ORDER[@]}"; do
  [ -n "${ARGS[$variant]:-}" ] || { echo "unknown variant $variant; choose from ${!ARGS[*]}"; exit 2; }
  echo "== $variant $(date -u +%FT%TZ)"
  [ "$variant" = flow-grid ] || copy_none "$R/$variant"
  # shellcheck disable=SC2086  # ARGS holds several options
  lmgeom experiment calibration --model minilm --task cola --data "$COLA" --regime finetune --seeds 1 \
    --max-train 2000 --learning-rate 1e-4 --epochs 3 --num-workers 1 --device cpu --out "$R/$variant" \
    ${ARGS[$variant]} || echo "== $variant failed (exit $?)"
  rm -rf "$R/$variant/features" "$R/$variant"/*.png "$R/$variant"/*.svg  # keep results.json, results.md, cells/
done
echo "== done $(date -u +%FT%TZ)"
