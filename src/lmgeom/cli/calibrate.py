"""`lmgeom calibrate`: fit isotropy calibrators on store layers and report isotropy before/after."""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.table import Table

from lmgeom.calibrate import DEFAULT_METHODS, FIT_MAX_ROWS, METHOD_NAMES
from lmgeom.cli.common import LAYERS_HELP, SITES_READ_HELP, RichProgress, console, old_spellings, split_list, user_errors
from lmgeom.store.layout import LAYER_NOTE

TABLE_MEASURES = ("log_partition_isotropy", "isoscore", "average_cosine", "effective_rank")
"""The calibration table's measures, labelled as the report labels them (`lmgeom.report.labels`)."""


def print_records(records: list[dict[str, Any]]) -> None:
    """Per layer, the isotropy before calibration ("none") and after each method: a table that fits
    80 columns; every measure is in calibration.csv."""
    from lmgeom.report.labels import label

    table = Table(title=f"Isotropy before (none) and after calibration ({LAYER_NOTE})")
    table.add_column("layer", justify="right")
    table.add_column("method")
    for measure in TABLE_MEASURES:
        table.add_column(label(measure), justify="right")
    rows: dict[tuple[int, str], dict[str, float]] = {}
    for record in records:
        if record["measure"] in TABLE_MEASURES:
            rows.setdefault((record["layer"], "none"), {})[record["measure"]] = record["before"]
            rows.setdefault((record["layer"], record["method"]), {})[record["measure"]] = record["after"]
    for (layer, method), values in rows.items():
        table.add_row(str(layer), method, *(f"{values[m]:.4g}" if m in values else "" for m in TABLE_MEASURES))
    console.print(table)


def print_fit_times(fits: list[dict[str, Any]]) -> None:
    """Seconds each method's fits took, summed over the layers (the fits' `seconds`)."""
    seconds: dict[str, float] = {}
    for fit in fits:
        seconds[fit["method"]] = seconds.get(fit["method"], 0.0) + float(fit["seconds"])
    layers = len({fit["layer"] for fit in fits})
    over = f"over {layers} layers" if layers > 1 else f"layer {fits[0]['layer']}" if fits else ""
    console.print(f"fit seconds per method ({over}): " + ", ".join(f"{method} {value:.1f} s" for method, value in seconds.items()),
                  highlight=False)


METHODS_HELP = (f"comma-separated calibrators: {', '.join(METHOD_NAMES)}, or all (default: the two that "
                "stream and fit fast, as run fits)")


def parse_methods(text: str) -> tuple[str, ...]:
    """`--methods`: a comma list of calibrators, or `all` for every one."""
    return METHOD_NAMES if text.strip() == "all" else tuple(split_list(text))


# isotropy_report's row cap (lmgeom.metrics.isotropy.REPORT_MAX_ROWS, a test checks it), written here so
# that `--help` does not import the metrics
EVAL_ROWS_DEFAULT = "20,000"


def register(app: typer.Typer) -> None:
    @app.command("calibrate", cls=old_spellings(
        {"--method": "--methods", "--layer": "--layers", "-l": "--layers", "--no-include-punct": "",
         "--no-include-special": ""}, joined=["--layers"]))
    def calibrate_command(
        store: str = typer.Argument(..., metavar="STORE-OR-MODEL", help="a store written by `lmgeom extract`, or a model (then --corpus is extracted into runs/<model>-<corpus> first)"),
        corpus: str = typer.Option("lee", help="corpus to extract when a model is given instead of a store"),
        device: str = typer.Option("auto", help="device for that extraction and the flow: auto, cpu, cuda"),
        method: str = typer.Option(",".join(DEFAULT_METHODS), "--methods", "-m", help=METHODS_HELP),
        layers: Optional[str] = typer.Option(None, "--layers", help=f"{LAYERS_HELP} (default: all)"),
        include_punct: bool = typer.Option(False, "--include-punct", help="also fit and measure on punctuation tokens"),
        include_special: bool = typer.Option(False, "--include-special", help="also fit and measure on special tokens (CLS/SEP/BOS), when stored"),
        eval_rows: Optional[int] = typer.Option(None, min=2, show_default=False, help=f"seeded subsample of rows on which isotropy is measured [default: {EVAL_ROWS_DEFAULT}]"),
        fit_rows: int = typer.Option(FIT_MAX_ROWS, min=2, help="seeded subsample of rows that cie and flow fit on (the others stream over all rows)"),
        seed: int = typer.Option(0, min=0, help="seed for subsamples, k-means and the flow"),
        sites: str = typer.Option("resid_post", "--sites", metavar="<site>", help=SITES_READ_HELP),
    ) -> None:
        """Fit isotropy calibrators per layer (whitening and all-but-the-top unless --methods names
        others: cie, flow, standardize, conceptor, or all); merges the records
        into STORE/calibration.json + .csv by (layer, method) and saves STORE/calibrators/<method>-L<layer>.*
        (another capture site's: in STORE/site_results/<site>/)"""
        from lmgeom.metrics.isotropy import REPORT_MAX_ROWS
        from lmgeom.stages import calibrate_store
        from lmgeom.stages.calibration import CalibrationOptions

        from lmgeom.cli.analyze import one_site

        with user_errors(), RichProgress() as progress:
            options = CalibrationOptions(
                methods=parse_methods(method), layers=layers, include_punct=include_punct,
                include_special=include_special, eval_rows=REPORT_MAX_ROWS if eval_rows is None else eval_rows,
                fit_rows=fit_rows, seed=seed, site=one_site(sites, "calibrate"), device=device,
            )
            result = calibrate_store(store, options, corpus=corpus, progress=progress)
        if options.site != "resid_post":
            console.print(f"site {options.site}: layers {', '.join(map(str, result.store.layers))}", highlight=False)
        print_records(result.records)
        print_fit_times(result.fits)
        console.print("wrote " + ", ".join(str(path) for path in result.paths))
