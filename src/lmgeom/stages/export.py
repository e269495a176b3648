"""Export a sentence-transformers model with a fitted calibrator inside it (`lmgeom export sentence-transformers`).

The calibrator is fitted on the output of the model's own Pooling module over the fit corpus, then
inserted right after that Pooling module (so before a Normalize module, when the model has one):
what is fitted is exactly what the exported model transforms. The folder written is an ordinary
sentence-transformers model plus `lmgeom_export.json` (what was fitted on what, and the isotropy of
the fit corpus's vectors before and after).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.calibrate import Calibrator, make_calibrator
from lmgeom.corpus import Corpus, load_corpus, require_count
from lmgeom.device import resolve_device
from lmgeom.encoders.named import NAMED_MODELS
from lmgeom.encoders.registry import minilm_path
from lmgeom.metrics.contextuality import average_cosine
from lmgeom.metrics.isotropy import isoscore
from lmgeom.progress import NoProgress, Progress
from lmgeom.rundir import write_json

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EXPORT_RECORD = "lmgeom_export.json"
# Sentences per encode call: the progress bar moves between calls.
ENCODE_CHUNK_SENTENCES = 256


@dataclass(frozen=True)
class ExportResult:
    out: Path
    method: str
    calibrator: Calibrator  # as fitted; the saved module holds the same state
    modules: list[str]  # the exported model's modules, in order
    n_fit_sentences: int
    isotropy: dict[str, dict[str, float]] = field(default_factory=dict)  # fit vectors: {"before"|"after": {measure: value}}
    paths: list[Path] = field(default_factory=list)


def sentence_transformers_folder(model: str) -> Path:
    """The local folder of a sentence-transformers model: `minilm` or a folder holding modules.json."""
    if model == "minilm":
        return minilm_path()
    folder = Path(model)
    if model in NAMED_MODELS or (folder.is_dir() and not (folder / "modules.json").is_file()):
        raise InputError(
            f"{model} is not a sentence-transformers model (a folder with modules.json, as SentenceTransformer.save "
            "writes); give minilm or such a folder"
        )
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model {model} is neither minilm nor an existing folder; give a sentence-transformers model folder "
            "(download a Hub model first, e.g. SentenceTransformer(ID).save(DIR))"
        )
    return folder


def load_sentence_transformer(model: str, *, device: str = "auto") -> "SentenceTransformer":
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(sentence_transformers_folder(model)), device=str(resolve_device(device)), local_files_only=True)


def pooling_index(model: "SentenceTransformer") -> int:
    """Position of the model's one top-level Pooling module."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    found = [index for index, module in enumerate(model) if isinstance(module, Pooling)]
    if len(found) != 1:
        names = ", ".join(type(module).__name__ for module in model)
        raise InputError(
            f"the model has {len(found)} top-level Pooling modules ({names}); the calibrator goes after exactly one, "
            "so export a model with a single Pooling module"
        )
    return found[0]


def pooled_sentence_vectors(
    model: "SentenceTransformer", texts: Sequence[str], *, batch_size: int = 32, progress: Progress | None = None
) -> np.ndarray:
    """The output of the model's Pooling module for each text, (n, dim) float32: the model's own
    modules up to Pooling, with its prompts, batched by `encode`."""
    from sentence_transformers import SentenceTransformer

    upto_pooling = list(model)[: pooling_index(model) + 1]
    prompts = {name: text or "" for name, text in model.prompts.items()}
    pooled = SentenceTransformer(modules=upto_pooling, device=str(model.device), prompts=prompts, default_prompt_name=model.default_prompt_name)
    reporter = progress or NoProgress()
    reporter.start("encode fit corpus", len(texts), unit="sentences")
    chunks = []
    for start in range(0, len(texts), ENCODE_CHUNK_SENTENCES):
        chunk = list(texts[start : start + ENCODE_CHUNK_SENTENCES])
        chunks.append(np.asarray(pooled.encode(chunk, batch_size=batch_size, convert_to_numpy=True), dtype=np.float32))
        reporter.advance("encode fit corpus", len(chunk))
    return np.concatenate(chunks)


def _isotropy(X: np.ndarray) -> dict[str, float]:
    return {"average_cosine": average_cosine(X), "isoscore": isoscore(X)}


def _prepare_out(out: Path, *, overwrite: bool) -> None:
    if out.exists() and (out.is_file() or any(out.iterdir())):
        if not overwrite:
            raise InputError(f"{out} already exists; pass `overwrite=True` to replace it, or choose another `out`",
                             param=("overwrite", "out"))
        if not (out / "modules.json").is_file():
            raise InputError(f"{out} is not a sentence-transformers model folder, so `overwrite=True` will not delete it; choose another `out`",
                             param=("overwrite", "out"))


def export_sentence_transformer(
    model: str,
    *,
    method: str,
    fit_on: str | Corpus,
    out: str | os.PathLike[str],
    seed: int = 0,
    limit: int | None = None,
    sample: int | None = None,
    field: str = "text",
    batch_size: int = 32,
    device: str = "auto",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Fit `method` (any name of `lmgeom.calibrate.METHODS`) on the pooled sentence vectors of
    `fit_on` (a corpus spec as `load_corpus` takes, or a `Corpus`; `limit`/`sample` as there) and
    write the model with the calibrator after its Pooling module to `out` (refused when it holds
    anything, unless `overwrite` and it is a sentence-transformers model folder)."""
    out = Path(out)
    calibrator = make_calibrator(method, seed=seed)  # an unknown method fails before any model loads
    require_count(limit, "limit")
    require_count(sample, "sample")
    # Imported here: sentence-transformers is the optional `st` extra, and this import's error names it.
    from lmgeom.stages.st_calibration import CalibrationModule

    _prepare_out(out, overwrite=overwrite)
    if isinstance(fit_on, Corpus):  # the same selection load_corpus makes for a spec
        corpus = fit_on.select(limit=limit, sample=sample, seed=seed)
    else:
        corpus = load_corpus(fit_on, field=field, limit=limit, sample=sample, seed=seed)
    st_model = load_sentence_transformer(model, device=device)
    pooled = pooled_sentence_vectors(st_model, [sentence.text for sentence in corpus], batch_size=batch_size, progress=progress)
    calibrator.fit(pooled)
    st_model.insert(pooling_index(st_model) + 1, CalibrationModule(calibrator))
    isotropy = {"before": _isotropy(pooled), "after": _isotropy(calibrator.transform(pooled))}

    # Written beside `out` and renamed into place: a failed export leaves no half-written model.
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    st_model.save(str(staging), create_model_card=False)
    settings: dict[str, Any] = {
        "method": method,
        "params": calibrator.get_params(),
        "seed": seed,
        "fit_on": {"name": corpus.name, "source": corpus.source, "n_sentences": len(corpus)},
        "fitted_on": "the output of the model's Pooling module",
        "modules": [type(module).__name__ for module in st_model],
        "isotropy_of_fit_vectors": isotropy,
        "load_with": f"SentenceTransformer({str(out)!r}, trust_remote_code=True)",
    }
    write_json(staging / EXPORT_RECORD, "sentence_transformers_export", settings,
               store_meta={"model_id": model, "corpus_fingerprint": corpus.fingerprint})
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return ExportResult(
        out=out, method=method, calibrator=calibrator, modules=settings["modules"], n_fit_sentences=len(corpus),
        isotropy=isotropy, paths=[out, out / EXPORT_RECORD],
    )
