"""`lmgeom calibrate`: fit isotropy calibrators on store layers and report isotropy before/after."""

from __future__ import annotations

from typing import Any, List, Optional

import typer
from rich.table import Table

from lmgeom.calibrate import FIT_MAX_ROWS, METHOD_NAMES
from lmgeom.cli.common import LAYERS_HELP, RichProgress, console, split_list, user_errors, err_console
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


# isotropy_report's row cap (lmgeom.metrics.isotropy.REPORT_MAX_ROWS, a test checks it), written here so
# that `--help` does not import the metrics
EVAL_ROWS_DEFAULT = "20,000"


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_command(
        store: str = typer.Argument(..., metavar="STORE-OR-MODEL", help="a store written by `lmgeom extract`, or a model (then --corpus is extracted into runs/<model>-<corpus> first)"),
        corpus: str = typer.Option("lee", help="corpus to extract when a model is given instead of a store"),
        device: str = typer.Option("auto", help="device for that extraction and the flow: auto, cpu, cuda"),
        method: str = typer.Option(",".join(METHOD_NAMES), "--methods", "--method", "-m", help=f"comma-separated methods: {', '.join(METHOD_NAMES)}"),
        layers: Optional[str] = typer.Option(None, "--layers", help=f"{LAYERS_HELP} (default: all)"),
        layer: Optional[List[int]] = typer.Option(None, "--layer", "-l", hidden=True, help="old spelling of --layers (repeatable)"),
        include_punct: bool = typer.Option(False, help="also fit and measure on punctuation tokens"),
        include_special: bool = typer.Option(False, help="also fit and measure on special tokens (CLS/SEP/BOS), when stored"),
        eval_rows: Optional[int] = typer.Option(None, min=2, show_default=False, help=f"seeded subsample of rows on which isotropy is measured [default: {EVAL_ROWS_DEFAULT}]"),
        fit_rows: int = typer.Option(FIT_MAX_ROWS, min=2, help="seeded subsample that cie and flow fit on (the others stream over all rows)"),
        seed: int = typer.Option(0, min=0, help="seed for subsamples, k-means and the flow"),
    ) -> None:
        """Fit whitening / all-but-the-top / CIE / flow / standardisation per layer; merges the records
        into STORE/calibration.json + .csv by (layer, method) and saves STORE/calibrators/<method>-L<layer>.*"""
        from lmgeom.metrics.isotropy import REPORT_MAX_ROWS
        from lmgeom.stages import calibrate_store
        from lmgeom.stages.calibration import CalibrationOptions

        if layer:
            if layers is not None:
                raise typer.BadParameter("give --layers only (--layer is its old spelling)", param_hint="--layer")
            err_console.print("[yellow]warning:[/] --layer N (repeated) is now --layers with one spec, e.g. "
                                   "--layers 0,3; the old spelling goes in a later release", highlight=False)
            layers = ",".join(map(str, layer))
        with user_errors(), RichProgress() as progress:
            options = CalibrationOptions(
                methods=tuple(split_list(method)), layers=layers, include_punct=include_punct,
                include_special=include_special, eval_rows=REPORT_MAX_ROWS if eval_rows is None else eval_rows,
                fit_rows=fit_rows, seed=seed, device=device,
            )
            result = calibrate_store(store, options, corpus=corpus, progress=progress)
        print_records(result.records)
        print_fit_times(result.fits)
        console.print("wrote " + ", ".join(str(path) for path in result.paths))
