#!/usr/bin/env bash
# The fine-tuning grid of docs/reproduction/ding2022.md, resumable cell by cell: the pre-check of
# `none` (learning rate x epochs per task), then each informative task's grid (methods x 3 seeds),
# with the core methods of every task first and all-but-the-top and conceptor negation after them
# (skipped for a task whose `none` beats no trivial baseline on dev in its core grid: unreadable).
# SICK-E replaces RTE, whose `none` the grid found uninformative (GLUE's QQP and QNLI are not here).
# Every finished cell is written under docs/reproduction/results/ at once (commit them as they come).
#   bash scripts/ding_grid.sh > ding-grid.log 2>&1 &
# Two single-thread workers at normal priority (DING_WORKERS=1: one, beside another long job); leave
# them the cores (no suite or benchmark beside).
# DING_RESULTS=DIR writes the results elsewhere (e.g. a checkout being edited while this code runs
# from a fixed one: PYTHONPATH=FIXED/src DING_RESULTS=EDITED/docs/reproduction/results).
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${LMGEOM_DATA:-../shared/data}  # as given: results record it, and a machine's absolute path must not travel
GLUE=$DATA/GLUE
R=${DING_RESULTS:-docs/reproduction/results}
PRE=$R/ding-precheck-minilm
CORE=none,whitening,cie,flow,isobn,istar
ALL=$CORE,abtt,conceptor
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
declare -A FOLDER=([cola]=$GLUE/CoLA [sst2]=$GLUE/SST-2 [mrpc]=$GLUE/MRPC [rte]=$GLUE/RTE [sicke]=$DATA/SICK)
TASKS="cola sst2 mrpc rte sicke"

# true when the task's grid results exist and its `none` beats no trivial baseline on dev
uninformative() {
  python - "$R/ding-grid-minilm-$1/results.json" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit(1)
rows = [s for s in json.load(open(sys.argv[1]))["summaries"] if s.get("method") == "none" and s.get("split") == "dev"]
sys.exit(0 if rows and not any((s.get("trivial") or {}).get("beats") for s in rows) else 1)
PY
}

echo "== pre-check $(date -u +%FT%TZ)"
lmgeom experiment finetune-precheck --model minilm --data "$GLUE" --tasks sst2,cola,mrpc,rte,sicke --out "$PRE" --device cpu \
  --num-workers "${DING_WORKERS:-2}"

for pass in "$CORE" "$ALL"; do
  for task in $TASKS; do
    methods=$pass
    if [ "$pass" = "$ALL" ] && uninformative "$task"; then
      echo "== $task: \`none\` beats no trivial baseline on dev in the core grid; the second pass is skipped"; continue
    fi
    # a task whose grid already holds the second pass's methods is summarised with all of them, never
    # with the first pass's subset (its results.json would lose their rows until the second pass)
    if grep -q '"method": "abtt"' "$R/ding-grid-minilm-$task/results.json" 2>/dev/null; then methods=$ALL; fi
    echo "== $task: $methods $(date -u +%FT%TZ)"
    # --precheck refuses a task whose pre-check is unfinished or uninformative; the loop goes on.
    lmgeom experiment calibration --model minilm --task "$task" --data "${FOLDER[$task]}" --regime finetune \
      --methods "$methods" --seeds 3 --precheck "$PRE" --device cpu --num-workers "${DING_WORKERS:-2}" \
      --out "$R/ding-grid-minilm-$task" \
      || echo "== $task not run (exit $?)"
  done
done
echo "== done $(date -u +%FT%TZ)"
