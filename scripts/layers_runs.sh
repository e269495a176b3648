#!/usr/bin/env bash
# The layer experiments of docs/reproduction/elmo.md (the `layers-*` and `peters-*` folders of
# docs/reproduction/results/; their commands are listed in its COMMANDS.md), re-run so that every
# comparison carries the crossed seeds x examples bootstrap. Each run writes runs/NAME (resumable
# cell by cell; a feature cache of the same model and task in another run folder is reused by copying
# it) and then copies its results.json and results.md into the results folder.
#   bash scripts/layers_runs.sh [NAME ...] > layers-runs.log 2>&1 &
# Runs one after the other (all of them, cheapest first, when none is named). One single-thread worker
# at normal priority. LAYERS_RESULTS=DIR copies the results elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
D=${LMGEOM_DATA:-../shared/data}  # as given: results record it, and a machine's absolute path must not travel
R=${LAYERS_RESULTS:-docs/reproduction/results}
E=$D/UD_English-EWT; C=$D/GLUE/CoLA; M=$D/GLUE/MRPC
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
COMMON=(--seeds 10 --device cpu)  # seeds 0-9: the probes are cheap once the features are cached, and the layer
# comparisons are tested with the seed spread (a crossed seeds x examples bootstrap), which three seeds understate
T2="--features top,mix --mix-l2 1,0.001 --mix-layer-norm off,on --raw"
declare -A ARGS=(
  [layers-minilm-pos]="--model minilm --task pos --data $E --max-train 300 --max-eval 300"
  [layers-minilm-pos-full]="--model minilm --task pos --data $E"
  [layers-elmo-pos]="--model elmo-brown --task pos --data $E"
  [layers-smollm2-pos]="--model smollm2 --task pos --data $E"
  [layers-minilm-cola]="--model minilm --task cola --data $C"
  [layers-elmo-cola]="--model elmo-brown --task cola --data $C"
  [layers-smollm2-cola]="--model smollm2 --task cola --data $C"
  [layers-minilm-mrpc]="--model minilm --task mrpc --data $M"
  [layers-elmo-mrpc]="--model elmo-brown --task mrpc --data $M"
  [layers-smollm2-mrpc]="--model smollm2 --task mrpc --data $M"
  [peters-elmo-pos]="--model elmo-brown --task pos --data $E $T2"
  [peters-minilm-pos]="--model minilm --task pos --data $E $T2"
  [peters-elmo-mrpc]="--model elmo-brown --task mrpc --data $M $T2 --max-train 1000 --max-eval 500"
  [peters-minilm-mrpc]="--model minilm --task mrpc --data $M $T2 --max-train 1000 --max-eval 500"
)
# the run whose feature cache a run can start from (same model, task and examples)
declare -A CACHE=(
  [peters-elmo-pos]=layers-elmo-pos [peters-minilm-pos]=layers-minilm-pos-full
)
ORDER=(layers-elmo-pos peters-elmo-pos layers-minilm-pos layers-minilm-pos-full peters-minilm-pos layers-minilm-cola
       layers-minilm-mrpc peters-minilm-mrpc layers-elmo-cola layers-elmo-mrpc peters-elmo-mrpc
       layers-smollm2-pos layers-smollm2-cola layers-smollm2-mrpc)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  [ -n "${ARGS[$name]:-}" ] || { echo "unknown run $name; choose from ${!ARGS[*]}"; exit 2; }
  echo "== $name $(date -u +%FT%TZ)"
  source_run=${CACHE[$name]:-}
  if [ -n "$source_run" ] && [ -d "runs/$source_run/features" ] && [ ! -d "runs/$name/features" ]; then
    mkdir -p "runs/$name" && cp -r "runs/$source_run/features" "runs/$name/"
  fi
  # shellcheck disable=SC2086  # ARGS holds several options
  if lmgeom experiment layers "${COMMON[@]}" ${ARGS[$name]} --out "runs/$name"; then
    mkdir -p "$R/$name"
    cp "runs/$name/results.json" "runs/$name/results.md" "$R/$name/"
  else
    echo "== $name failed (exit $?)"
  fi
done
echo "== done $(date -u +%FT%TZ)"
