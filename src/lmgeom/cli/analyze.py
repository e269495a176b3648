"""`lmgeom analyze` (contextuality per layer) and `lmgeom static-embeddings` (export + word benchmarks)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.table import Table

from lmgeom.cli.common import (
    BOOTSTRAP_HELP,
    CONFIDENCE_HELP,
    COUNT_BY_HELP,
    MIN_CONTEXTS_HELP,
    MIN_COVERAGE_HELP,
    PROTOCOL_HELP,
    ROWS_HELP,
    DATA_DIR_HELP,
    SITES_READ_HELP,
    RichProgress,
    above,
    console,
    cli_text,
    interval_cell,
    old_spellings,
    shown,
    split_list,
    url_form,
    user_errors,
)

STATISTICS_HELP = ("more registered statistics to compute beside the contextuality set, comma-separated (e.g. "
                   "word_effective_rank; docs/architecture.md lists them)")
DEVICE_HELP = "cpu (numpy), cuda, cuda:N, auto (cuda when present) or torch:cpu; MEV runs on the CPU"

if TYPE_CHECKING:
    import pandas as pd

    from lmgeom.stages import ContextualityResult


METRIC_NAMES = {"spearman": "Spearman", "accuracy_3cosadd": "3CosAdd", "mean_spearman": "mean ρ", "purity": "purity"}


def print_static_benchmarks(scores: pd.DataFrame, title: str, min_coverage: str) -> None:
    """One table per vector set, the two protocols side by side with the coverage (fits 80 columns);
    a covered-items score on fewer items than `min_coverage` reads "too few items"."""
    from lmgeom.evaluate.wordbench import covered_score_text
    from lmgeom.report.labels import number

    console.print(f"{title}. covered = items whose words all have vectors (matched lowercase); "
                  "score on covered items only (the headline), and on all items with out-of-vocabulary words "
                  f"as the mean unit vector; a score on fewer covered items than {min_coverage} (items, "
                  "share of the benchmark) reads 'too few items'", highlight=False)
    for label, rows in scores.groupby("vectors", sort=False):
        table = Table(title=str(label))
        longest = max(len(str(name)) for name in rows["benchmark"])  # a benchmark's name is never cut
        for column in ("benchmark", "metric", "covered", "%", "covered only", "all (OOV mean)"):
            table.add_column(column, justify="left" if column in ("benchmark", "metric") else "right",
                             min_width=longest if column == "benchmark" else None)
        for record in rows.to_dict("records"):
            table.add_row(record["benchmark"], METRIC_NAMES[record["metric"]],
                          f"{record['covered']:,}/{record['total']:,}", f"{record['coverage']:.0%}",
                          covered_score_text(record, lambda value: number(value, 3)),
                          number(record["score_oov_mean"], 3))
        console.print(table)


def print_benchmark_headlines(records: pd.DataFrame | None, min_coverage: str) -> None:
    """`lmgeom run`'s word-benchmark table: the first-PC vectors' covered-items score per benchmark and
    distilled layer, with covered/total beside (one column when every layer covers the same items); a
    score on fewer covered items than `min_coverage` reads "too few items"."""
    from lmgeom.evaluate.wordbench import coverage_text, too_few_items_text
    from lmgeom.report.labels import number

    if records is None or records.empty:
        return
    first_pc = records.loc[records["vectors"].astype(str).str.startswith("first_pc")]
    if first_pc.empty:
        return
    layers = sorted(int(layer) for layer in first_pc["layer"].unique())
    table = Table(title="Static embeddings (first principal component) on word benchmarks: covered items only")
    table.add_column("benchmark", min_width=max(len(str(name)) for name in first_pc["benchmark"]))
    table.add_column("metric")
    same_coverage = first_pc.groupby("benchmark", sort=False)[["covered", "total"]].nunique().le(1).all(axis=None)
    if same_coverage:
        table.add_column("covered", justify="right")
    for layer in layers:
        table.add_column(f"layer {layer}", justify="right")
    for benchmark, rows in first_pc.groupby("benchmark", sort=False):
        by_layer = {int(record["layer"]): record for record in rows.to_dict("records")}
        first = next(iter(by_layer.values()))
        cells = []
        for layer in layers:
            record = by_layer.get(layer)
            if record is None:
                cells.append("")
            elif not record.get("enough_items", True):  # the covered column beside says how few
                cells.append("too few" if same_coverage else too_few_items_text(record["covered"], record["total"]))
            else:
                cells.append(number(record["score"], 3) if same_coverage
                             else f"{number(record['score'], 3)} ({coverage_text(record['covered'], record['total'])})")
        table.add_row(str(benchmark), METRIC_NAMES.get(first["metric"], str(first["metric"])),
                      *([coverage_text(first["covered"], first["total"])] if same_coverage else []), *cells)
    console.print(table)
    console.print(f"too few: fewer covered items than {min_coverage} (items, share of the benchmark; "
                  "--min-coverage); every vector set and the all-items (OOV mean) protocol are in "
                  "static/<layer>.benchmarks.csv and the report", highlight=False, soft_wrap=False)


def print_contextuality(result: ContextualityResult) -> None:
    from lmgeom.engine.registry import measures
    from lmgeom.report.figures import DRAWN
    from lmgeom.report.labels import number

    variants = result.settings.get("mev_variants", [])
    summary = result.summary()
    title = f"{result.store_meta.get('model_id')}: contextuality per layer (layer 0 = embedding output; adjusted = raw − baseline)"
    cosines = Table(title=title)
    columns = [("anisotropy_exact", "baseline exact"), ("anisotropy_sampled", f"baseline sampled (n={result.settings['n_samples']})"),
               ("self_similarity", "SelfSim"), ("self_similarity_adjusted", "SelfSim adj"),
               ("intra_sentence_similarity", "IntraSim"), ("intra_sentence_similarity_adjusted", "IntraSim adj")]
    cosines.add_column("layer", justify="right")
    for _, header in columns:
        cosines.add_column(header, justify="right")
    for _, row in summary.iterrows():
        cosines.add_row(str(row["layer"]), *(number(row[c]) for c, _ in columns))
    console.print(cosines)

    extra = [m for m in measures() if m.name in summary and m.name not in DRAWN]  # asked for with --statistics
    if extra:
        others = Table(title="more statistics")
        others.add_column("layer", justify="right")
        shown_columns = [(m.name, m.label) for m in extra] + [(f"{m.name}_adjusted", m.adjusted) for m in extra if m.baseline]
        for _, header in shown_columns:
            others.add_column(header, justify="right")
        for _, row in summary.iterrows():
            others.add_row(str(row["layer"]), *(number(row[c]) for c, _ in shown_columns))
        console.print(others)

    mev = Table(title="MEV: share of a word's variance explained by its first principal direction (baseline = sampled occurrences)")
    mev.add_column("layer", justify="right")
    for variant in variants:
        mev.add_column(f"{variant}", justify="right")
        mev.add_column(f"{variant} adj", justify="right")
    for _, row in summary.iterrows():
        cells = [number(row[f"mev_{v}{suffix}"]) for v in variants for suffix in ("", "_adjusted")]
        mev.add_row(str(row["layer"]), *cells)
    console.print(mev)
    print_intervals(result)
    zero = {layer: n for layer, n in result.counts["zero_vectors_excluded_by_layer"].items() if n}
    console.print(
        f"{result.counts['words_analysed']:,} words of ≥ {result.settings['min_contexts']} "
        f"{result.settings.get('count_by', 'sentences')} "
        f"({result.counts['words_below_min_contexts']:,} below), {result.counts['rows_analysed']:,} tokens analysed, "
        f"{result.counts['rows_punctuation_excluded']:,} punctuation and {result.counts['rows_special_excluded']:,} special "
        f"tokens excluded; zero vectors excluded: {zero or 'none'}"
    )
    if result.settings.get("protocol"):
        print_released(result)
    console.print("[bold]Findings[/]")
    for statement in result.statements:
        console.print(f"  • {shown(statement)}")


RELEASED_COLUMNS = (("anisotropy_released", "raw", "baseline"), ("self_similarity_released", "adjusted", "SelfSim*"),
                    ("intra_sentence_similarity_released", "adjusted", "IntraSim*"), ("mev_svd_ratio_released", "raw", "MEV"),
                    ("mev_svd_ratio_released", "baseline", "MEV base"), ("mev_svd_ratio_released", "adjusted", "MEV*"))


def print_released(result: ContextualityResult) -> None:
    """The released code's sampled statistics (`--protocol ethayarajh2019`), adjusted = raw − its baseline."""
    from lmgeom.report.labels import number

    table = Table(title=f"the released code's statistics ({result.settings['protocol']}: {result.settings['n_samples']:,} "
                        "sampled sentences and pairs; * = minus baseline)")
    table.add_column("layer", justify="right")
    for _, _, header in RELEASED_COLUMNS:
        table.add_column(header, justify="right")
    records = result.layers.set_index(["layer", "metric"])
    for layer in sorted(result.layers["layer"].unique()):
        table.add_row(str(layer), *(number(records.at[(layer, metric), field], 3) if (layer, metric) in records.index else "—"
                                    for metric, field, _ in RELEASED_COLUMNS))
    console.print(table)


def print_intervals(result: ContextualityResult) -> None:
    """The key columns with their bootstrap intervals (nothing when the analysis had no bootstrap)."""
    from lmgeom.report.labels import MEV_ADJ_COLUMN

    # the key columns whose intervals the terminal shows: (summary column, header)
    interval_columns = [("anisotropy_exact", "baseline exact"), ("self_similarity_adjusted", "SelfSim adj"),
                        ("intra_sentence_similarity_adjusted", "IntraSim adj"), (MEV_ADJ_COLUMN, "MEV svd_ratio adj")]
    intervals = result.intervals()
    if intervals.empty or not result.bootstrap:
        return
    design = result.bootstrap
    summary = result.summary().set_index("layer")
    intervals = intervals.set_index("layer")
    rough = " — rough, fewer than 100 resamples" if design.get("rough") else ""
    table = Table(title=f"{design['level']:.0%} intervals: percentile bootstrap, B={design['B']:,}{rough}, seed {design['seed']} "
                        "(cosines: sentences resampled; MEV: words)")
    table.add_column("layer", justify="right")
    columns = [(column, header) for column, header in interval_columns if column in summary]
    for _, header in columns:
        table.add_column(header, justify="right")
    for layer, row in summary.iterrows():
        table.add_row(str(layer), *(interval_cell(row[c], intervals.loc[layer, f"{c}_lo"], intervals.loc[layer, f"{c}_hi"])
                                    for c, _ in columns))
    console.print(table)
    if design.get("rough"):
        console.print(f"note: {shown(cli_text(design['rough'], ('bootstrap',)))}", soft_wrap=True, highlight=False)


def one_site(sites: str, command: str = "analyze") -> str:
    """The one capture site of `--sites` that `command` reads (its results are of one site)."""
    from lmgeom.errors import InputError

    names = split_list(sites)
    if len(names) != 1:
        raise InputError(f"`site`: {command} reads one site at a time; got {', '.join(names) or 'none'}; run it once per "
                         "site (each site's results go to a folder of their own, STORE/site_results/<site>/)", param="site")
    return names[0]


def register(app: typer.Typer) -> None:
    @app.command("analyze", cls=old_spellings({"--samples": "--rows"}))
    def analyze_command(
        store_path: str = typer.Argument(..., metavar="STORE", help="a store written by `lmgeom extract` (a folder or an fsspec URL)"),
        min_contexts: Optional[int] = typer.Option(None, min=1, metavar="<int>", help=MIN_CONTEXTS_HELP),
        count_by: Optional[str] = typer.Option(None, metavar="<unit>", help=COUNT_BY_HELP),
        protocol: Optional[str] = typer.Option(None, metavar="ethayarajh2019", help=PROTOCOL_HELP),
        include_punct: bool = typer.Option(False, "--include-punct", help="also analyse punctuation (the paper left it out)"),
        exclude_first_word: bool = typer.Option(False, "--exclude-first-word", help="leave out each sentence's first word (decoders without BOS put outliers there)"),
        include_special: bool = typer.Option(False, "--include-special", help="also analyse special tokens (CLS/SEP/BOS) the store kept"),
        seed: int = typer.Option(0, min=0, metavar="<int>", help="seed for the sampled baselines"),
        rows: Optional[int] = typer.Option(None, min=2, metavar="<int>", help=f"{ROWS_HELP} for the anisotropy and MEV baselines (default 1000)"),
        out: Optional[str] = typer.Option(None, callback=url_form, help="folder or fsspec URL for the result files (default: the store; another site's: STORE/site_results/<site>/)"),
        mev_memory_mb: float = typer.Option(512, callback=above(0), help="memory (MB) for per-word occurrence matrices; the rest wait in scratch files (TMPDIR)"),
        device: str = typer.Option("auto", help=DEVICE_HELP),
        engine: str = typer.Option("auto", help="local (one task after another here), processes (worker processes), "
                                                "ray (tasks on a Ray cluster), auto (processes with more than one worker)"),
        ray_address: Optional[str] = typer.Option(None, envvar="RAY_ADDRESS", help="Ray cluster to join (default: a local one)"),
        num_workers: int = typer.Option(2, min=1, metavar="<int>", help="tasks at once: layers in worker processes, or Ray tasks (see docs/performance.md)"),
        bootstrap: int = typer.Option(1000, min=0, metavar="<int>", help=BOOTSTRAP_HELP),
        confidence: float = typer.Option(0.95, help=CONFIDENCE_HELP),
        statistics: Optional[str] = typer.Option(None, metavar="<names>", help=STATISTICS_HELP),
        sites: str = typer.Option("resid_post", "--sites", metavar="<site>", help=SITES_READ_HELP),
    ) -> None:
        """Self-similarity, intra-sentence similarity, MEV and anisotropy baselines for every layer."""
        from lmgeom import rundir
        from lmgeom.stages.analysis import analyze_store
        from lmgeom.stages.contextuality import write_contextuality
        from lmgeom.engine import AnalysisOptions
        from lmgeom.engine.options import CONTEXTUALITY_STATISTICS, protocol_options
        from lmgeom.store import RepresentationStore

        with user_errors(), RichProgress() as progress:
            chosen = protocol_options(protocol, min_contexts=min_contexts, count_by=count_by, n_samples=rows,
                                      include_punct=include_punct or None, include_special=include_special or None,
                                      exclude_first_word=exclude_first_word or None,
                                      statistics=(*CONTEXTUALITY_STATISTICS, *split_list(statistics)) if statistics else None)
            options = AnalysisOptions(**chosen, seed=seed, mev_memory_mb=mev_memory_mb, device=device, engine=engine,
                                      num_workers=num_workers, ray_address=ray_address, bootstrap=bootstrap,
                                      confidence=confidence, site=one_site(sites))
            store = RepresentationStore.open(store_path)
            if options.site != "resid_post":
                store.site_layers(options.site)  # a site the store lacks is refused before anything runs
                out = out or str(rundir.site_results(store.url, options.site))
            result = analyze_store(store, options, progress=progress)
            written = write_contextuality(result, store, out)
        if options.site != "resid_post":
            console.print(f"site {shown(options.site)}: layers {', '.join(map(str, store.site_layers(options.site)))}")
        print_contextuality(result)
        console.print("wrote " + ", ".join(map(shown, written)))

    @app.command("static-embeddings")
    def static_embeddings_command(
        store_path: Path = typer.Argument(..., metavar="STORE", help="a store written by `lmgeom extract`"),
        layer: int = typer.Option(..., min=0, help="layer to distil (0 = embedding output)"),
        out: Optional[Path] = typer.Option(None, callback=url_form, help="word2vec text file to write (default STORE/static/<layer>.txt; another site's: STORE/site_results/<site>/static/<layer>.txt)"),
        benchmark: List[Path] = typer.Option([], help="extra benchmark: word pairs, Google-format analogies, a CSV laid out as msr.csv or bless.csv, or the SemEval2012-2 folder (repeatable)"),
        static_vectors: List[Path] = typer.Option([], help="static vectors to compare (word2vec .bin, word2vec/GloVe text; repeatable)"),
        trust_pickle: bool = typer.Option(False, "--trust-pickle", help=(
            "also load gensim .kv files given to --static-vectors: a .kv is a Python pickle, and loading one can "
            "run arbitrary code, so pass this only for files you made yourself (word2vec format needs no trust)")),
        min_contexts: Optional[int] = typer.Option(None, min=1, metavar="<int>", help="export words occurring at least this many times, counted by --count-by (default 5, as analyze and run)"),
        count_by: Optional[str] = typer.Option(None, metavar="<unit>", help=COUNT_BY_HELP),
        protocol: Optional[str] = typer.Option(None, metavar="ethayarajh2019", help="ethayarajh2019: the words of the released code (at least 5 occurrences, no punctuation)"),
        include_punct: Optional[bool] = typer.Option(None, "--include-punct/--exclude-punct", help="also export punctuation (default: not)"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=f"{DATA_DIR_HELP}: the word benchmarks"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out file that lmgeom did not write, "
                                                               "or the layer's benchmark scores with fewer"),
        min_coverage: str = typer.Option("50,10%", metavar="<items,%>", help=MIN_COVERAGE_HELP),
        sites: str = typer.Option("resid_post", "--sites", metavar="<site>", help=SITES_READ_HELP + "static/ (the "
                                  "layer-0 baseline stays the embedding output)"),
    ) -> None:
        """Export first-principal-component word vectors of a layer and score them on word benchmarks,
        covered items only and all items (out-of-vocabulary words as the mean vector)."""
        from lmgeom.stages import export_static_embeddings
        from lmgeom.stages.static import StaticOptions

        with user_errors(), RichProgress() as progress:
            options = StaticOptions.of(min_contexts=min_contexts, count_by=count_by, include_punct=include_punct,
                                       protocol=protocol, data_dir=data_dir, min_coverage=min_coverage,
                                       site=one_site(sites, "static-embeddings"))
            exported = export_static_embeddings(store_path, options, layer=layer, text_path=out, benchmarks=benchmark,
                                                static_vectors=static_vectors, trust_pickle=trust_pickle, overwrite=overwrite,
                                                progress=progress)
        at_site = "" if options.analysis.site == "resid_post" else f" of site {options.analysis.site}"
        print_static_benchmarks(exported.scores, f"{exported.embeddings.store_meta.get('model_id')}: layer {layer}{at_site}, "
                                                 f"{len(exported.embeddings.words):,} words", options.min_coverage)
        for name, reason in exported.skipped.items():
            console.print(f"skipped {shown(name)}: {shown(reason)}")
        console.print("wrote " + ", ".join(shown(p) for p in exported.paths.values()))
