"""`lmgeom export sentence-transformers`: a model with a fitted calibrator inside (the work is `lmgeom.stages.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from lmgeom.calibrate import METHOD_NAMES
from lmgeom.cli.common import MODEL_OPTION_HELP, RichProgress, console, old_spellings, one_model, user_errors, url_form


def register(app: typer.Typer) -> None:
    export_app = typer.Typer(help="Write lmgeom's results in other libraries' formats.", no_args_is_help=True)
    app.add_typer(export_app, name="export")

    @export_app.command("sentence-transformers", cls=old_spellings({"--no-overwrite": ""}))
    def sentence_transformers_command(
        model_argument: Optional[str] = typer.Argument(None, metavar="[MODEL]", show_default=False,
                                                       help="minilm, or a sentence-transformers model folder (with modules.json)"),
        model_option: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help=MODEL_OPTION_HELP),
        method: str = typer.Option(..., "--method", "-m", help=f"the calibrator: {', '.join(METHOD_NAMES)}"),
        fit_on: str = typer.Option("lee", "--fit-on", help="corpus whose pooled sentence vectors the calibrator is fitted on: lee, brown[:DIR], sts[:DIR], a text file (one sentence per line), a .jsonl file, hf:NAME:SPLIT:COLUMN"),
        out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="folder for the exported sentence-transformers model"),
        limit: Optional[int] = typer.Option(None, help="fit on the first N sentences of the corpus (N ≥ 1; default: all)"),
        sample: Optional[int] = typer.Option(None, help="fit on a seeded uniform sample of N sentences (N ≥ 1; default: all)"),
        field: str = typer.Option("text", help="the text field of a .jsonl corpus"),
        seed: int = typer.Option(0, min=0, help="seed for --sample and the calibrator (k-means, the flow)"),
        batch_size: int = typer.Option(32, min=1, help="sentences per forward pass while encoding the fit corpus"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N (for encoding the fit corpus)"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace a sentence-transformers model already in --out"),
    ) -> None:
        """Fit a calibrator on the model's pooled sentence vectors and save the model with it after
        the Pooling module (before Normalize), so encode() returns calibrated embeddings."""
        from lmgeom.stages.export import export_sentence_transformer

        model = one_model(model_argument, model_option, "export sentence-transformers")
        with user_errors():
            with RichProgress() as progress:
                result = export_sentence_transformer(
                    model, method=method, fit_on=fit_on, out=out, seed=seed, limit=limit, sample=sample, field=field,
                    batch_size=batch_size, device=device, overwrite=overwrite, progress=progress,
                )
        table = Table(title=f"{result.n_fit_sentences:,} pooled fit-corpus vectors")
        table.add_column("measure")
        table.add_column("raw", justify="right")
        table.add_column(method, justify="right")
        for measure, before in result.isotropy["before"].items():
            table.add_row(measure, f"{before:.4f}", f"{result.isotropy['after'][measure]:.4f}")
        console.print(table)
        console.print(f"wrote {result.out}: {' -> '.join(result.modules)}")
        console.print(f"load it with SentenceTransformer({str(result.out)!r}, trust_remote_code=True) where lmgeom is installed")
