"""`lmgeom calibrate`: fit isotropy calibrators on store layers and report isotropy before/after."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from lmgeom.calibrate import FIT_MAX_ROWS, METHODS, calibrate_store
from lmgeom.cli.common import console, progress_bar, user_errors
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS
from lmgeom.results import LAYER_NOTE
from lmgeom.store import RepresentationStore

TABLE_MEASURES = {
    "log_partition_isotropy": "log I(W)",
    "log_partition_isotropy_centered": "log I(W) centred",
    "isoscore": "IsoScore",
    "average_cosine": "avg cos",
    "effective_rank": "eff. rank",
}


def print_records(records: list[dict]) -> None:
    table = Table(title="Isotropy before → after calibration", caption=LAYER_NOTE)
    table.add_column("layer", justify="right")
    table.add_column("method")
    for label in TABLE_MEASURES.values():
        table.add_column(label, justify="right")
    cells: dict[tuple[int, str], dict[str, str]] = {}
    for record in records:
        if record["measure"] in TABLE_MEASURES:
            cells.setdefault((record["layer"], record["method"]), {})[record["measure"]] = f"{record['before']:.4g} → {record['after']:.4g}"
    for (layer, method), row in cells.items():
        table.add_row(str(layer), method, *(row.get(measure, "") for measure in TABLE_MEASURES))
    console.print(table)


def _store_or_extract(store_or_model: str, *, corpus: str, device: str) -> RepresentationStore:
    """Open a store; a name that is no store is a model, extracted on `corpus` (or resumed) first."""
    if (Path(store_or_model) / "meta.json").exists():
        return RepresentationStore.open(store_or_model)
    from lmgeom.cli.extract import extract_with_progress
    from lmgeom.corpus import load_corpus
    from lmgeom.encoders import load_encoder
    from lmgeom.pipeline import default_run_dir

    out = default_run_dir(store_or_model, corpus)
    console.print(f"{store_or_model} is not a store: extracting it on {corpus} into {out}")
    return extract_with_progress(load_encoder(store_or_model, device=device), load_corpus(corpus), out)


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_command(
        store: str = typer.Argument(..., metavar="STORE-OR-MODEL", help="a store written by `lmgeom extract`, or a model (then --corpus is extracted into runs/<model>-<corpus> first)"),
        corpus: str = typer.Option("lee", help="corpus to extract when a model is given instead of a store"),
        device: str = typer.Option("auto", help="device for that extraction: auto, cpu, cuda"),
        method: str = typer.Option(",".join(METHODS), "--method", "-m", help=f"comma-separated methods: {', '.join(METHODS)}"),
        layer: Optional[List[int]] = typer.Option(None, "--layer", "-l", help="layer to calibrate, repeatable (default: all; 0 = embedding output)"),
        include_punct: bool = typer.Option(False, help="also fit and measure on punctuation tokens"),
        include_special: bool = typer.Option(False, help="also fit and measure on special tokens (CLS/SEP/BOS), when stored"),
        eval_rows: int = typer.Option(REPORT_MAX_ROWS, help="seeded subsample of rows on which isotropy is measured"),
        fit_rows: int = typer.Option(FIT_MAX_ROWS, help="seeded subsample that cie and flow fit on (the others stream over all rows)"),
        seed: int = typer.Option(0, help="seed for subsamples, k-means and the flow"),
    ) -> None:
        """Fit whitening / all-but-the-top / CIE / flow / standardisation per layer; writes
        STORE/calibration.json + .csv and STORE/calibrators/<method>-L<layer>.*"""
        with user_errors():
            opened = _store_or_extract(store, corpus=corpus, device=device)
            methods = [name.strip() for name in method.split(",") if name.strip()]
            layers = list(layer) if layer else opened.layers
            with progress_bar(unit="fits") as progress:
                task = progress.add_task("calibrate", total=len(layers) * len(methods), rate="")
                records = calibrate_store(
                    opened, methods=methods, layers=layers, exclude_punct=not include_punct,
                    exclude_special=not include_special, eval_rows=eval_rows, fit_rows=fit_rows, seed=seed,
                    on_step=lambda done_layer, done_method: progress.update(task, advance=1, rate=f"done: L{done_layer} {done_method}"),
                )
        print_records(records)
        console.print(f"wrote {opened.path / 'calibration.json'}, calibration.csv and calibrators/")
