"""`lmgeom attribute`: each layer's mean direction, variance and largest activations attributed to
the terms its model's sum rule writes it from (a store extracted with capture sites)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from lmgeom.cli.common import RichProgress, console, url_form, user_errors


def _shares(shares: dict[str, float]) -> str:
    from lmgeom.report.labels import number

    return " ".join(f"{term} {number(share, 2)}" for term, share in shares.items())


def register(app: typer.Typer) -> None:
    @app.command("attribute")
    def attribute_command(
        store_path: str = typer.Argument(..., metavar="STORE", help="a store extracted with `--sites` (its family's terms)"),
        layers: Optional[str] = typer.Option(None, metavar="<layers>", help="layers to attribute (first,last; negative "
                                             "numbers; ranges; default: every layer holding the sites)"),
        top_k: int = typer.Option(10, min=1, metavar="<int>", help="largest |x| entries per layer to attribute"),
        out: Optional[Path] = typer.Option(None, callback=url_form, help="folder for attribution.json (default: the store's folder)"),
    ) -> None:
        """Each layer's mean direction, total and outlier-dimension variance and largest |x| entries,
        split exactly among the terms that sum to it (resid_pre, attn_out, mlp_out; BERT at its
        LayerNorm inputs), written to attribution.json and attribution.csv."""
        from lmgeom.report.labels import number
        from lmgeom.stages.attribution import AttributionOptions, attribute_store
        from lmgeom.store import RepresentationStore

        with user_errors(), RichProgress() as progress:
            store = RepresentationStore.open(store_path)
            result = attribute_store(store, AttributionOptions(layers=layers, top_k=top_k), out=out, progress=progress)
        table = Table(title=f"{store.meta.get('model_id')}: shares of each layer's mean direction and total variance by term "
                            "(layer 0 = embedding output; residual = max |x - sum of terms|)")
        for header in ("layer", "sum", "mean shares", "variance shares", "top |x| shares", "residual"):
            table.add_column(header, justify="right" if header in ("layer", "residual") else "left")
        for entry in result.document["layers"]:
            top = entry["massive"][0]["shares"] if entry["massive"] else {}
            table.add_row(str(entry["layer"]), entry["sum"], _shares(entry["mean_shares"]),
                          _shares({term: parts["total"] for term, parts in entry["variance_shares"].items()}),
                          _shares(top), number(entry["residual"], 6))
        console.print(table)
        console.print("wrote " + ", ".join(str(p) for p in result.paths))
