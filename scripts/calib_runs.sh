#!/usr/bin/env bash
# The calibration experiments of docs/reproduction/ding2022.md and calibration.md (the `calib-*` folders
# of docs/reproduction/results/; their commands are listed in its COMMANDS.md), re-run so that every
# cell keeps its predictions and every summary row carries its test against the trivial baseline.
# Each run writes runs/NAME (resumable cell by cell) and then copies its results.json and results.md
# into the results folder; the cells of a run stopped before its end are committed under
# RESULTS/NAME/cells/ (copied from runs/NAME/cells/), and the next run of NAME starts from them.
#   bash scripts/calib_runs.sh [NAME ...] > calib-runs.log 2>&1 &
# Runs one after the other (all of them, cheapest first, when none is named). One single-thread worker
# at normal priority. DING_RESULTS=DIR copies the results elsewhere (as in scripts/ding_grid.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
D=${LMGEOM_DATA:-../shared/data}  # as given: results record it, and a machine's absolute path must not travel
R=${DING_RESULTS:-docs/reproduction/results}
E=$D/UD_English-EWT; C=$D/GLUE/CoLA; M=$D/GLUE/MRPC
METHODS=none,abtt,cie,conceptor,whitening,flow
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
COMMON=(--methods "$METHODS" --seeds 3 --device cpu)
declare -A ARGS=(
  [calib-minilm-pos]="--model minilm --task pos --data $E --max-train 500"
  [calib-smollm2-pos]="--model smollm2 --task pos --data $E --max-train 500"
  [calib-elmo-pos]="--model elmo-brown --task pos --data $E --max-train 500"
  [calib-minilm-cola]="--model minilm --task cola --data $C --regime frozen --max-train 2000"
  [calib-smollm2-cola]="--model smollm2 --task cola --data $C --regime frozen --max-train 2000"
  [calib-elmo-cola]="--model elmo-brown --task cola --data $C --regime frozen --max-train 2000"
  [calib-minilm-mrpc]="--model minilm --task mrpc --data $M --regime frozen --max-train 2000"
  [calib-smollm2-mrpc]="--model smollm2 --task mrpc --data $M --regime frozen --max-train 2000"
  [calib-elmo-mrpc]="--model elmo-brown --task mrpc --data $M --regime frozen --max-train 2000"
  [calib-minilm-cola-full]="--model minilm --task cola --data $C --regime frozen"
  [calib-minilm-cola-ft]="--model minilm --task cola --data $C --regime finetune --max-train 2000 --learning-rate 1e-4 --epochs 3 --methods $METHODS,isobn,istar --num-workers 1"
)
ORDER=(calib-minilm-pos calib-smollm2-pos calib-elmo-pos calib-smollm2-mrpc calib-elmo-cola calib-elmo-mrpc
       calib-minilm-cola-full calib-minilm-cola calib-minilm-mrpc calib-smollm2-cola calib-minilm-cola-ft)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  [ -n "${ARGS[$name]:-}" ] || { echo "unknown run $name; choose from ${!ARGS[*]}"; exit 2; }
  echo "== $name $(date -u +%FT%TZ)"
  if [ -d "$R/$name/cells" ]; then  # the cells an earlier, unfinished run committed: resumed from, not redone
    mkdir -p "runs/$name/cells" && cp -n "$R/$name/cells/"*.json "runs/$name/cells/"
  fi
  # shellcheck disable=SC2086  # ARGS holds several options
  if lmgeom experiment calibration "${COMMON[@]}" ${ARGS[$name]} --out "runs/$name"; then
    mkdir -p "$R/$name"
    cp "runs/$name/results.json" "runs/$name/results.md" "$R/$name/"
  else
    echo "== $name failed (exit $?)"
  fi
done
echo "== done $(date -u +%FT%TZ)"
