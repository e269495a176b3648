"""`lmgeom geometry` (intrinsic dimension, outlier panel, uniformity/alignment per layer) and
`lmgeom geometry-probes` (does the intrinsic-dimension profile pick the best probing layer?)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import typer
from rich.table import Table

from lmgeom.cli.common import (DATA_DIR_HELP, ROWS_HELP, SITES_READ_HELP, RichProgress, cli_text, console, old_spellings,
                               user_errors, url_form)

if TYPE_CHECKING:
    from lmgeom.stages.geometry import GeometryResult


def _estimate(layer: dict[str, Any], method: str, n2: int | None = None) -> dict[str, Any] | None:
    return next((e for e in layer["intrinsic_dimension"] if e["method"] == method and (n2 is None or e["n2"] == n2)), None)


def _with_interval(estimate: dict[str, Any] | None) -> str:
    from lmgeom.report.labels import number

    if estimate is None:
        return "—"
    return f"{number(estimate['dimension'], 1)} [{number(estimate['low'], 1)}, {number(estimate['high'], 1)}]"


def _layer_columns(folders: Sequence[Path | str], kind: str, key: str, value: str, wanted: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """`wanted` measures per layer (the records' `key`, their `value`) from the first result file of
    `kind` (isotropy, contextuality) in `folders`, checked as every reader checks one (another
    store's, other settings than its run records, or a mixed set: an error naming it)."""
    from lmgeom import rundir

    spec = rundir.KINDS[kind]
    document = next((d for d in (rundir.read_result(folder, spec) for folder in folders) if d is not None), None)
    columns: dict[int, dict[str, float]] = {}
    for record in (document or {}).get("records", []):
        if record[key] in wanted:
            columns.setdefault(int(record["layer"]), {})[record[key]] = record[value]
    return columns


def print_geometry(result: GeometryResult, run_folders: Sequence[Path | str] = ()) -> None:
    """The three per-layer tables; the rogue and standardised cosines come from the isotropy.json of
    the first of `run_folders` that has one."""
    from lmgeom.report.labels import number

    model = result.store_meta.get("model_id")
    settings = result.settings
    ids = Table(title=f"{model}: intrinsic dimension per layer (layer 0 = embedding output; "
                      f"{settings['n_points']:,} sampled rows, {settings['intrinsic_dimension']['interval']} over "
                      f"{settings['intrinsic_dimension']['n_boot']} resamples; MLE k = {settings['intrinsic_dimension']['mle_k']}, "
                      "GRIDE at n2 = 8 and 64)")
    for header in ("layer", "dup", "TwoNN [CI]", "MLE [CI]", "GRIDE 8", "GRIDE 64"):
        ids.add_column(header, justify="right")
    for layer in result.layers:
        gride_8, gride_64 = _estimate(layer, "gride", 8), _estimate(layer, "gride", 64)
        ids.add_row(str(layer["layer"]), f"{layer['n_duplicates']:,}", _with_interval(_estimate(layer, "twonn")),
                    _with_interval(_estimate(layer, "mle")), number(gride_8["dimension"] if gride_8 else None, 1),
                    number(gride_64["dimension"] if gride_64 else None, 1))
    console.print(ids)

    outliers = Table(title=f"outlier dimensions (mean |h| > {settings['outliers']['n_sigma']:g}σ), rogue dimensions "
                           "(cosine), top |h| over every row")
    for header in ("layer", "3σ: n, first", "rogue", "top |h|", "× median", "at word@position dim"):
        outliers.add_column(header, justify="left" if header.startswith("at") else "right")
    for layer in result.layers:
        dims = [str(d["dimension"]) for d in layer["outlier_dimensions"]]
        shown = f"{len(dims)}: {','.join(dims[:2])}" if dims else ""
        top = layer["top_activations"][0]
        where = f"{top['word'][:10]}@{top['position']} {top['dimension']}" + (" massive" if top["massive"] else "")
        outliers.add_row(str(layer["layer"]), shown or "—", ",".join(map(str, layer["rogue_dimensions"])) or "—",
                         number(abs(top["value"]), 1), number(top["ratio_to_median"], 0), where)
    console.print(outliers)

    isotropy = _layer_columns(run_folders, "isotropy", "measure", "value",
                              ("average_cosine_without_rogue", "average_cosine_standardized"))
    cosines = Table(title="average cosine of the sampled rows: raw, without the 3σ dims; without the rogue dims and "
                          "standardised (isotropy.json); uniformity (t=2) of sentence vectors; alignment")
    for header in ("layer", "raw", "w/o 3σ", "w/o rogue", "standard.", "uniformity", "alignment"):
        cosines.add_column(header, justify="right")
    for layer in result.layers:
        extra = isotropy.get(layer["layer"], {})
        cosines.add_row(str(layer["layer"]), number(layer["anisotropy_sampled"], 3),
                        number(layer["anisotropy_without_outlier_dimensions"], 3),
                        number(extra.get("average_cosine_without_rogue"), 3), number(extra.get("average_cosine_standardized"), 3),
                        number(layer["uniformity"], 3), number(layer["alignment"], 3))
    console.print(cosines)
    raw = _layer_columns(run_folders, "contextuality", "metric", "raw", ("self_similarity", "intra_sentence_similarity"))
    similarities = Table(title="self-similarity and intra-sentence similarity: raw (contextuality.json), without the 3σ "
                               "dims, standardised")
    for header in ("layer", "SelfSim", "w/o 3σ", "standard.", "IntraSim", "w/o 3σ", "standard."):
        similarities.add_column(header, justify="right")
    for layer in result.layers:
        extra = raw.get(layer["layer"], {})
        similarities.add_row(str(layer["layer"]), number(extra.get("self_similarity"), 3),
                             number(layer["self_similarity_without_outlier_dimensions"], 3),
                             number(layer["self_similarity_standardized"], 3), number(extra.get("intra_sentence_similarity"), 3),
                             number(layer["intra_sentence_similarity_without_outlier_dimensions"], 3),
                             number(layer["intra_sentence_similarity_standardized"], 3))
    console.print(similarities)
    note = settings["alignment"]["note"]
    if note:
        console.print(f"alignment: none ({note})")
    print_layernorm(result.layernorm_weights)
    if not isotropy or not raw:
        console.print("missing columns come from the run's isotropy.json and contextuality.json: `lmgeom run` writes them")


def print_layernorm(layernorm: dict[str, Any]) -> None:
    """The LayerNorm-weight outliers of a model (`lmgeom.stages.geometry.layernorm_outliers`), or why there are none."""
    from lmgeom.report.labels import number

    if not layernorm.get("computed"):
        note = cli_text(str(layernorm.get("note") or "not computed"), ("model_weights",))
        console.print(f"LayerNorm-weight outliers: {note}", highlight=False)
        return
    table = Table(title=f"{layernorm['model']}: LayerNorm-weight outliers (|z| > {layernorm['n_sigma']:g} within each "
                        f"of its {len(layernorm['modules'])} norm weight vectors)")
    for header in ("module", "dim", "weight", "z"):
        table.add_column(header, justify="left" if header == "module" else "right")
    for module in layernorm["modules"]:
        for outlier in module["outliers"]:
            table.add_row(module["module"], str(outlier["dimension"]), number(outlier["weight"], 3), number(outlier["z"], 1))
    console.print(table if table.row_count else f"{layernorm['model']}: no LayerNorm-weight outlier in "
                                                 f"{len(layernorm['modules'])} norm weight vectors")


def register(app: typer.Typer) -> None:
    @app.command("geometry", cls=old_spellings({"--points": "--rows", "--boot": "--bootstrap"}))
    def geometry_command(
        store_path: str = typer.Argument(..., metavar="STORE", help="a store written by `lmgeom extract`"),
        out: Optional[Path] = typer.Option(None, callback=url_form, help="folder for geometry.json (default: the store's folder; another site's: STORE/site_results/<site>/)"),
        rows: int = typer.Option(5000, min=2, metavar="<int>", help=f"{ROWS_HELP}, the same at every layer, for the intrinsic dimension"),
        bootstrap: int = typer.Option(200, min=0, metavar="<int>", help="bootstrap resamples for the intrinsic dimension's intervals (0: none)"),
        top_k: int = typer.Option(10, min=1, metavar="<int>", help="largest |h| per layer to locate"),
        max_sentences: int = typer.Option(10_000, min=2, metavar="<int>", help="sentence vectors (seeded) for uniformity"),
        include_punct: bool = typer.Option(False, "--include-punct", help="also use punctuation rows"),
        include_special: bool = typer.Option(False, "--include-special", help="also use special-token rows the store kept"),
        exclude_first_word: bool = typer.Option(False, "--exclude-first-word", help="leave out each sentence's first word"),
        min_contexts: int = typer.Option(5, min=2, metavar="<int>", help="self-similarity of words in at least this many sentences"),
        seed: int = typer.Option(0, min=0, metavar="<int>", help="seed for the samples and the bootstrap"),
        device: str = typer.Option("cpu", help="where the k-NN search runs: cpu, cuda, cuda:N or auto"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=f"{DATA_DIR_HELP}: stsbenchmark/ for alignment"),
        model_weights: bool = typer.Option(False, "--model-weights", help="also the LayerNorm-weight outliers of the store's model (loads it)"),
        sites: str = typer.Option("resid_post", "--sites", metavar="<site>", help=SITES_READ_HELP),
    ) -> None:
        """Intrinsic dimension (TwoNN, MLE, GRIDE), outlier dimensions and massive activations,
        uniformity and alignment of every layer, written to geometry.json and geometry.csv."""
        from lmgeom import rundir
        from lmgeom.cli.analyze import one_site
        from lmgeom.engine import AnalysisOptions
        from lmgeom.stages.geometry import GeometryOptions, measure_geometry
        from lmgeom.store import RepresentationStore

        with user_errors(), RichProgress() as progress:
            site = one_site(sites, "geometry")
            analysis = AnalysisOptions(geometry_rows=rows, top_activations=top_k, min_contexts=min_contexts,
                                       include_punct=include_punct, include_special=include_special,
                                       exclude_first_word=exclude_first_word, seed=seed, device=device, site=site)
            store = RepresentationStore.open(store_path)
            folder: Path | str | None = out
            if site != "resid_post":
                store.site_layers(site)  # a site the store lacks is refused before anything runs
                folder = out or rundir.site_results(store.url, site)
            options = GeometryOptions(analysis, n_boot=bootstrap, max_sentences=max_sentences,
                                      data_dir=None if data_dir is None else str(data_dir), model_weights=model_weights or None)
            result = measure_geometry(store, options, out=folder, progress=progress)
        # the isotropy and contextuality shown beside are the same site's: the store's own files are resid_post's
        beside = store.location.local_path if store.location.is_local and site == "resid_post" else None
        print_geometry(result, [where for where in (folder, beside) if where is not None])
        console.print("wrote " + ", ".join(str(p) for p in result.paths))

    @app.command("geometry-probes")
    def geometry_probes_command(
        geometry: List[Path] = typer.Argument(..., metavar="GEOMETRY...", help="geometry.json files, one per model"),
        results: List[Path] = typer.Option(..., "--results", help="a layer experiment's results.json (repeatable)"),
        method: str = typer.Option("twonn", help="the intrinsic-dimension estimate of the profile: twonn or mle"),
        model_weights: bool = typer.Option(False, "--model-weights", help="also each model's LayerNorm-weight outliers "
                                           "(from its geometry.json, else by loading the model it names)"),
    ) -> None:
        """Does the intrinsic-dimension peak (Cheng et al. 2025) or the minimum after it (Valeriani et
        al. 2023) pick the best probing layer? Hits against chance, with an exact test."""
        from lmgeom.stages.geometry import model_layernorm_outliers, probe_layer_test

        with user_errors():
            test = probe_layer_test(geometry, results, method=method)
            layernorms = [model_layernorm_outliers(path) for path in geometry] if model_weights else []
        table = Table(title=f"best probing layer vs the {method} profile (layer 0 = embedding output)")
        for header in ("model", "task", "best", "peak", "min after", "layers"):
            table.add_column(header, justify="left" if header in ("model", "task") else "right")
        for case in test["cases"]:
            after = case["minimum_after_peak"]
            table.add_row(case["model"], case["task"], str(case["best_layer"]), str(case["peak_layer"]),
                          "—" if after is None else str(after), str(case["n_layers"]))
        console.print(table)
        for rule, outcome in test["tests"].items():
            console.print(f"{rule}: {outcome['hits']}/{outcome['cases']} hits, {outcome['expected_hits']:.2f} expected by chance, "
                          f"p = {outcome['p_value']:.3g}")
        console.print(test["test"])
        if test["missing"]:
            console.print("no geometry for: " + ", ".join(test["missing"]))
        for layernorm in layernorms:
            print_layernorm(layernorm)
