"""`lmgeom sts`: sentence-similarity Spearman per layer, raw and after isotropy calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from lmgeom.cli.common import console, progress_bar, user_errors
from lmgeom.encoders import NAMED_MODELS, load_encoder
from lmgeom.evaluate.sts import (
    CALIBRATION_METHODS, TRANSDUCTIVE, combination, evaluate_sts, markdown_table, resolve_fit_sources, resolve_layers,
    resolve_methods, summary_table,
)
from lmgeom.evaluate.sts_data import find_datasets
from lmgeom.results import atomic_write_text, write_json, write_records_csv


def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _parse_combination(text: str):
    try:
        return combination(int(x) for x in _split_list(text))
    except ValueError:
        raise ValueError(f"--combine takes comma-separated layer numbers such as 0,6; got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command("sts")
    def sts_command(
        model: str = typer.Argument(..., help=f"a named model ({', '.join(NAMED_MODELS)}), a Hugging Face id, or a local folder"),
        data: Path = typer.Option(..., "--data", help="folder holding any of stsbenchmark/, STS_raw/ (or STS/), SICK/; all found are evaluated"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="results JSON (tidy records; a .csv of the records is written next to it)"),
        layers: str = typer.Option("all,first-last-avg", help="comma list of layer numbers, 'all' and 'first-last-avg' (layers 1 and L); layer 0 = embedding output"),
        combine: list[str] = typer.Option([], "--combine", help="also evaluate the average of these layers, e.g. 0,6 (repeatable)"),
        method: str = typer.Option("none", "--method", help=f"comma list of {', '.join(CALIBRATION_METHODS)}, or 'all'; 'none' is always included"),
        fit_on: str = typer.Option(TRANSDUCTIVE, "--fit-on", help="fit calibrators on the evaluated sentences ('transductive') or on a corpus (lee, brown, a file, ...); comma list for several"),
        split: str = typer.Option("test", help="test, dev or train (SemEval STS12-16 exist only as test; SICK dev = TRIAL)"),
        limit_pairs: Optional[int] = typer.Option(None, help="evaluate a seeded random subset of N pairs per dataset"),
        special: bool = typer.Option(True, "--special/--no-special", help="include special tokens (CLS/SEP/BOS) in the sentence mean"),
        seed: int = typer.Option(0, help="seed for --limit-pairs and the calibrators"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
        markdown: Optional[Path] = typer.Option(None, "--markdown", help="also write the summary table as markdown"),
    ) -> None:
        """Spearman x 100 between gold similarity and the cosine of mean-pooled sentence vectors, per layer and calibration."""
        with user_errors():
            methods = resolve_methods(list(CALIBRATION_METHODS) if method.strip() == "all" else _split_list(method))
            # corpora load (and a bad spec fails) before the model does
            fit_sources = resolve_fit_sources(_split_list(fit_on)) if len(methods) > 1 else []
            datasets = find_datasets(data, split=split)
            if limit_pairs is not None:
                datasets = [d.sample(limit_pairs, seed=seed) for d in datasets]
            encoder = load_encoder(model, device=device)
            selections = resolve_layers(
                [*_split_list(layers), *(_parse_combination(c) for c in combine)], encoder.n_layers
            )
            with progress_bar() as progress:
                tasks: dict[str, int] = {}

                def on_progress(stage: str, advance: int, total: int) -> None:
                    if stage not in tasks:
                        label = "encode sentences" if stage == "encode" else "evaluate"
                        tasks[stage] = progress.add_task(label, total=total, rate="")
                    progress.update(tasks[stage], advance=advance)

                records = evaluate_sts(
                    encoder, datasets, layers=selections, methods=methods, fit_on=fit_sources or TRANSDUCTIVE,
                    include_special=special, seed=seed, on_progress=on_progress,
                )
            special_note = f"special tokens {'included' if special else 'excluded'}"
            header, rows = summary_table(records, compact=True)
            title = (
                f"{encoder.model_id}: STS Spearman x 100 ({split}; mean pooling, {special_note}); "
                "'all' pools a year's subsets, 'mean' averages them unweighted; isotropy averaged over datasets; "
                "layer 0 = embedding output, first-last-avg = layers 1 and L"
            )
            table = Table(title=title)
            for index, column in enumerate(header):
                table.add_column(column, justify="left" if index < 3 else "right")
            for row in rows:
                table.add_row(*row)
            console.print(table)
            if out is not None:
                settings = {
                    "model": model, "data": str(data), "datasets": [{"name": d.name, "split": d.split, "n_pairs": len(d), "source": d.source} for d in datasets],
                    "layers": [{"name": s.name, "indexes": list(s.indexes)} for s in selections], "methods": methods,
                    "fit_on": [{"name": f.name, "n_sentences": len(f.sentences) if f.sentences else None} for f in fit_sources], "split": split, "limit_pairs": limit_pairs, "pooling": "mean",
                    "special_tokens": "included" if special else "excluded", "seed": seed,
                }
                write_json(out, "sts", {"settings": settings, "records": records}, store_meta={"model_id": encoder.model_id})
                write_records_csv(out.with_suffix(".csv"), records)
                console.print(f"wrote {out} and {out.with_suffix('.csv')}")
            if markdown is not None:
                atomic_write_text(markdown, markdown_table(*summary_table(records)))
                console.print(f"wrote {markdown}")
