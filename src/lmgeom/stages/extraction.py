"""Extraction: corpus -> encoder -> store, chunk by chunk, resumable; and "a store, or a model to extract first"."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmgeom.errors import InputError
from lmgeom.corpus import load_corpus
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import Encoder
from lmgeom.progress import NoProgress, Progress
from lmgeom.store import RepresentationStore, StoreWriter, layout
from lmgeom.store.location import Location, is_url
from lmgeom import rundir
from lmgeom.stages.extraction_options import ExtractionOptions, split_options

if TYPE_CHECKING:
    from lmgeom.encoders.options import EncoderOptions


def extract(
    encoder: Encoder,
    corpus: Corpus,
    out: str | os.PathLike[str],
    options: ExtractionOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    **keywords: Any,
) -> RepresentationStore:
    """Encode `corpus` into a store at `out`; re-running the same call resumes an interrupted run.

    The corpus is cut into windows of `sort_window` sentences, each encoded at once, so its forward
    batches are sorted by length across the window (the whole corpus, where its vectors fit the
    memory budget), and committed in corpus order in chunks of `chunk_sentences` (the unit of
    resuming: a resumed run encodes the window of its next chunk again whole, so its batches, and
    vectors, are those of an uninterrupted run). The layers' zarr chunks fit the corpus
    (`layout.chunk_rows`).

    Parameters
    ----------
    encoder : Encoder
        The loaded model that encodes the sentences (`lmgeom.encoders.registry.load_encoder`).
    corpus : Corpus
        The sentences to encode.
    out : str or os.PathLike
        The store's folder, or an fsspec URL: a store on an object store is written in shards
        committed by manifests (`lmgeom.stages.distributed.extract_sharded`).
    options : ExtractionOptions or None, default None
        What is stored and how (None: the defaults); the corpus-selection fields do not apply
        (`corpus` is given). `compress` ("zstd") compresses the layers' chunks. A resumed run given
        no `sort_window` keeps the chunk size and sort window of the run it resumes (unless given
        another `chunk_sentences`).
    overwrite : bool, default False
        Remove a store already at `out` (complete or interrupted, whatever its settings) with what
        lmgeom wrote next to it, and extract afresh. Without it, a store of other settings there is
        refused and one of the same settings is resumed.
    progress : Progress or None, default None
        Told of each committed chunk, in sentences, with sentences and words per second (`words` are
        the corpus words stored; special tokens kept with `keep_special` are not counted). None:
        `NoProgress`.
    **keywords : Any
        Fields of `ExtractionOptions` by name, replacing those of `options`. `control="shuffled"`
        shuffles each sentence's words (`Corpus.shuffle_words(control_seed)`) before encoding;
        `control="random-init"` takes an encoder loaded with random weights of `control_seed`
        (`load_encoder(model, random_init=control_seed)`, as `extract_model` does); the store records
        either (`lmgeom.controlspec`).

    Returns
    -------
    RepresentationStore
        The finished store at `out`, opened.

    Raises
    ------
    InputError
        An unknown keyword or a bad option value (`ExtractionOptions`); a `control` with an `out` that is
        not a local folder; `control='random-init'` with an encoder not loaded with
        `random_init=control_seed`, or an encoder of random weights without that control; a store of
        other settings at `out` without `overwrite`, or files lmgeom did not write there
        (`StoreExistsError`).
    """
    progress = progress or NoProgress()
    options = ExtractionOptions.of(options, **keywords)
    location = Location.of(out)
    if options.captures_sites and not location.is_local:
        raise _sharded_sites(options)
    if options.control is not None and not location.is_local:
        raise _sharded_control(options)
    corpus = _controlled(encoder, corpus, options)
    if not location.is_local:  # object stores have no atomic rename: shards committed by manifests
        from lmgeom.stages.distributed import extract_sharded

        return extract_sharded(encoder, corpus, location, options, overwrite=overwrite, progress=progress)
    out = location.local_path
    if options.sort_window is None and not overwrite and (Path(out) / layout.META).exists():
        options = _resumed_windows(Path(out), options)
    options = options.resolve(encoder.n_layers, encoder.dim, len(corpus))
    layers = [int(layer) for layer in options.store_layers or ()]
    subset: dict[str, Any] = {"layers": layers} if len(layers) < encoder.n_layers else {}  # asked for some only
    sites: dict[str, Any] = {}
    if options.captures_sites:
        site_settings = getattr(encoder, "site_settings", None)
        if site_settings is None:
            raise InputError(f"`sites`: {encoder.model_id} is encoded without forward hooks, so it stores resid_post only; "
                             "leave `sites` out", param="sites")
        sites = site_settings(options.sites, layers)
        subset = {"layers": layers, "sites": options.sites}
    chunk, window = int(options.chunk_sentences or 0), int(options.sort_window or 0)
    settings = {
        **encoder.settings(),
        "corpus_name": corpus.name,
        "corpus_source": corpus.source,
        "corpus_fingerprint": corpus.fingerprint,
        "n_corpus_sentences": len(corpus),
        "pretokenized": corpus.pretokenized,
        **options.to_settings(),
        **sites,
    }
    with StoreWriter(Path(out), settings=settings, overwrite=overwrite, foreign=rundir.foreign_entries,
                     expected_rows=layout.expected_rows(corpus.sentences),
                     layer_note=getattr(encoder, "layer_note", layout.LAYER_NOTE)) as writer:  # its lock is released however this ends
        stage = f"extract {corpus.name}"
        progress.start(stage, len(corpus), unit="sentences")
        if writer.complete:
            progress.advance(stage, len(corpus), note="already extracted")
            return RepresentationStore.open(out)
        if writer.sentences_done:
            progress.advance(stage, writer.sentences_done, note="resumed")
        rate = _Rate()
        # Each chunk is written in a background thread while the next window is encoded; a chunk counts
        # (and is reported) only once its commit has finished.
        # A window's chunks are queued at once; if anything stops the run, those not started are dropped.
        with ThreadPoolExecutor(max_workers=1) as background:
            pending: list[tuple[Future[None], int, int]] = []
            try:
                for start in range(writer.sentences_done - writer.sentences_done % window, len(corpus), window):
                    sentences = corpus.sentences[start : start + window]
                    encoded = encoder.encode(sentences, first_index=start, **subset)
                    while pending:
                        _finish(pending.pop(0), progress, stage, rate)
                    for first in range(max(start, writer.sentences_done), start + len(sentences), chunk):
                        part = encoded[first - start : first - start + chunk]
                        n_words = sum(int((~e.is_special).sum()) for e in part)
                        texts = [s.text for s in sentences[first - start : first - start + chunk]]
                        pending.append((background.submit(writer.commit, part, texts), len(part), n_words))
                    del encoded  # the window's vectors are held by its pending commits only
                while pending:
                    _finish(pending.pop(0), progress, stage, rate)
            except BaseException:
                for commit, _, _ in pending:
                    commit.cancel()
                raise
        writer.finalize()
    return RepresentationStore.open(out)


def _controlled(encoder: Encoder, corpus: Corpus, options: ExtractionOptions) -> Corpus:
    """The corpus the extraction encodes under `options.control`, once the encoder is checked
    against it: a `random-init` control needs an encoder loaded with random weights of its seed
    (`load_encoder(..., random_init=seed)`), and an encoder of random weights is never extracted as the
    model (a store of it without the control recorded could be taken for the trained model's)."""
    seed = getattr(encoder, "random_init_seed", None)
    if options.control == "random-init" and seed != options.control_seed:
        raise InputError(f"`control='random-init'` with `control_seed={options.control_seed}`: the encoder given holds "
                         + ("its loaded weights" if seed is None else f"the random weights of seed {seed}")
                         + f"; load it with `load_encoder(model, random_init={options.control_seed})` (as `extract_model` "
                         "does), or leave `control` out", param=("control", "control_seed"))
    if options.control != "random-init" and seed is not None:
        raise InputError(f"the encoder given holds random weights (seed {seed}), not the model's; extract it with "
                         f"`control='random-init'`, `control_seed={seed}` so that the store records it, or load the "
                         "model without `random_init`", param="control")
    if options.control == "shuffled":
        return corpus.shuffle_words(options.control_seed)
    return corpus


def _sharded_control(options: ExtractionOptions) -> InputError:
    return InputError(f"`control` {options.control}: a control is extracted by a local extraction only (`engine='local'` "
                      "into a local folder); extract it locally, or leave `control` out",
                      param=("control", "engine", "out"))


def _sharded_sites(options: ExtractionOptions) -> InputError:
    return InputError(f"`sites` {','.join(options.sites or ())}: sites besides resid_post are stored by a local extraction only "
                      "(`engine='local'` into a local folder); leave `sites` out of a sharded one",
                      param=("sites", "engine", "out"))


def _resumed_windows(out: Path, options: ExtractionOptions) -> ExtractionOptions:
    """A resumed extraction keeps the chunks and sort windows of the run it resumes (a store written
    before sort windows were recorded sorted each chunk on its own)."""
    try:
        recorded = layout.read_store_json(out / layout.META).get("settings", {})
    except InputError:
        return options
    if not recorded.get("chunk_sentences") or (options.chunk_sentences and options.chunk_sentences != recorded["chunk_sentences"]):
        return options
    return replace(options, chunk_sentences=int(recorded["chunk_sentences"]),
                   sort_window=int(recorded.get("sort_window") or recorded["chunk_sentences"]))


class _Rate:
    """Sentences and words per second since extraction (re)started."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.sentences = 0
        self.words = 0

    def add(self, sentences: int, words: int) -> str:
        self.sentences += sentences
        self.words += words
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return f"{self.sentences / elapsed:,.0f} sentences/s, {self.words / elapsed:,.0f} words/s"


def _finish(pending: tuple[Future[None], int, int], progress: Progress, stage: str, rate: _Rate) -> None:
    commit, n_sentences, n_words = pending
    commit.result()
    progress.advance(stage, n_sentences, note=rate.add(n_sentences, n_words))


def default_run_dir(model: str, corpus: str, *, limit: int | None = None, sample: int | None = None,
                    seed: int = 0, control: str | None = None, control_seed: int = 0) -> Path:
    """runs/<model>-<corpus>: the model's folder name and the corpus name (a file's stem), slugged, with
    -limitN for the first N sentences and -sampleN (-sampleN-seedS for a seed other than 0) for a sample,
    so that runs on different sentences never share a folder, and -<control>-seedS for a control (never
    the model's own folder)."""
    name = f"{Path(model).name}-{Path(corpus.split(':')[0]).stem}"
    if limit is not None:
        name += f"-limit{limit}"
    if sample is not None:
        name += f"-sample{sample}" + (f"-seed{seed}" if seed else "")
    if control is not None:
        name += f"-{control}-seed{control_seed}"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
    return Path("runs") / slug


def extract_model(
    model: str,
    corpus: str = "lee",
    *,
    out: str | os.PathLike[str] | None = None,
    options: ExtractionOptions | None = None,
    encoder: EncoderOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    **keywords: Any,
) -> RepresentationStore:
    """`lmgeom extract`: load the corpus `corpus` and `model`, and extract its layers into `out`.

    An interrupted run is resumed. `engine="ray"` (or an object-store `out`) encodes shards of a
    stream of the corpus (`lmgeom.stages.distributed.extract_model_sharded`), with `engine="ray"` on
    `num_workers` Ray actors, each loading the model.

    Parameters
    ----------
    model : str
        A named model (`lmgeom.encoders.named.NAMED_MODELS`), a Hugging Face id or a local model
        folder, loaded by `load_encoder`.
    corpus : str, default "lee"
        The corpus spec, as `load_corpus` reads it: lee, brown[:DIR], sts[:DIR],
        hf:NAME:SPLIT:COLUMN, a .txt (one sentence per line) or .jsonl file.
    out : str or os.PathLike or None, default None
        The store's folder or an fsspec URL. None: `default_run_dir`,
        runs/<model>-<corpus>[-limitN][-sampleN[-seedS]].
    options : ExtractionOptions or None, default None
        What is extracted and stored and how (None: the defaults).
    encoder : EncoderOptions or None, default None
        How the model is loaded and run, for `load_encoder` (None: the defaults).
    overwrite : bool, default False
        Remove a store already at `out` (complete or interrupted, whatever its settings) with what
        lmgeom wrote next to it, and extract afresh. Without it, a store of other settings there is
        refused and one of the same settings is resumed.
    progress : Progress or None, default None
        Told of each committed chunk (None: `NoProgress`).
    **keywords : Any
        Fields of `ExtractionOptions` or `EncoderOptions`, by name, replacing those of `options` and
        `encoder` (`extract_model("minilm", limit=100, store_layers="0,3,6", device="cpu")`).

    Returns
    -------
    RepresentationStore
        The finished store at `out`, opened.

    Raises
    ------
    InputError
        A keyword that is neither an extraction nor an encoder option, or a bad option value;
        `num_workers`, `gpus_per_worker` or `shard_sentences` without `engine="ray"` (for a local
        `out`); a corpus spec that does not read (before the model loads); a store of other settings
        at `out` without `overwrite`, or files lmgeom did not write there (`StoreExistsError`).
    FileNotFoundError
        A corpus spec that names neither a built-in corpus nor an existing file (or a corpus folder
        that is not there).
    """
    from lmgeom.encoders.options import EncoderOptions
    from lmgeom.encoders.registry import load_encoder  # torch: only where a model is loaded

    extraction_keywords, encoder_keywords = split_options(keywords)
    options = ExtractionOptions.of(options, **extraction_keywords)
    encoder_options = EncoderOptions.of(encoder, **encoder_keywords)
    if out is None:
        out = default_run_dir(model, corpus, limit=options.limit, sample=options.sample, seed=options.seed,
                              control=options.control, control_seed=options.control_seed)
    if options.engine != "local" or not Location.of(out).is_local:
        if options.captures_sites:
            raise _sharded_sites(options)
        if options.control is not None:
            raise _sharded_control(options)
        from lmgeom.stages.distributed import extract_model_sharded

        # shards cut from a stream of the corpus: the driver never holds it whole
        return extract_model_sharded(model, corpus, str(out), options, encoder_options, overwrite=overwrite, progress=progress)
    if options.num_workers != 1 or options.gpus_per_worker or options.shard_sentences:
        raise InputError("`num_workers`, `gpus_per_worker` and `shard_sentences` apply to `engine='ray'`; "
                         "add `engine='ray'` or leave them out",
                         param=("num_workers", "gpus_per_worker", "shard_sentences", "engine"))
    # a bad corpus spec fails before the model loads
    sentences = load_corpus(corpus, field=options.field, pretokenized=options.pretokenized, limit=options.limit,
                            sample=options.sample, seed=options.seed)
    random_init = options.control_seed if options.control == "random-init" else None
    return extract(load_encoder(model, encoder_options, random_init=random_init), sentences, out, options,
                   overwrite=overwrite, progress=progress)


def open_or_extract(store_or_model: str, *, corpus: str = "lee", device: str = "auto",
                    progress: Progress | None = None) -> RepresentationStore:
    """Open the store at `store_or_model`; anything else names a model, extracted on `corpus` into
    runs/<model>-<corpus> first (or resumed from there). An existing folder that is neither a store
    nor a model folder is refused (a named model wins over a folder of its name)."""
    if layout.is_store(store_or_model):
        return RepresentationStore.open(store_or_model)
    from lmgeom.encoders.named import NAMED_MODELS
    from lmgeom.encoders.registry import is_model_folder  # torch: only where a model may be loaded

    folder = Path(store_or_model)
    if store_or_model not in NAMED_MODELS and not is_url(store_or_model) and folder.is_dir() and not is_model_folder(folder):
        raise FileNotFoundError(
            f"{store_or_model} is neither a store (it has no {layout.META}: write one with `lmgeom extract MODEL "
            f"--out {store_or_model}`) nor a model folder (no config.json, GGUF file, or ELMo options and weights); "
            "give a store, a model folder, a Hugging Face id or a named model"
        )
    return extract_model(store_or_model, corpus, device=device, progress=progress)
