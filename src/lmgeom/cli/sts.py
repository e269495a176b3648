"""`lmgeom sts`: sentence-similarity Spearman per layer, raw and after isotropy calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmgeom.calibrate import METHOD_NAMES
from lmgeom.cli.common import (DATA_DIR_HELP, LAYERS_HELP, MODEL_OPTION_HELP, RichProgress, console, grid_table, old_spellings,
                               one_model, split_list, table_columns, user_errors, url_form)


VECTORS_PANEL = "Sentence vectors"


def register(app: typer.Typer) -> None:
    @app.command("sts", cls=old_spellings({"--data": "--data-dir", "--method": "--methods", "--special": "--include-special",
                                           "--no-special": "--exclude-special"}))
    def sts_command(
        model_argument: Optional[str] = typer.Argument(None, metavar="[MODEL]", show_default=False, help="a named model (minilm, smollm2, tiny-bert, ...), a Hugging Face id, or a local folder"),
        model_option: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help=MODEL_OPTION_HELP),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=f"{DATA_DIR_HELP}: any of stsbenchmark/, STS_raw/ (or STS/), SICK/; all found are evaluated"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", callback=url_form, help="results JSON (tidy records; a .csv of the records is written next to it)"),
        layers: str = typer.Option("all,first-last-avg", help=LAYERS_HELP + ", and first-last-avg (layers 1 and L averaged)", rich_help_panel=VECTORS_PANEL),
        combine: list[str] = typer.Option([], "--combine", help="also evaluate the average of these layers, e.g. 0,6 or first,last (repeatable)", rich_help_panel=VECTORS_PANEL),
        method: str = typer.Option("none", "--methods", help=f"comma list of none, {', '.join(METHOD_NAMES)}, or 'all' (every one); 'none' is always included"),
        fit_on: str = typer.Option("transductive", "--fit-on", help="fit calibrators on the evaluated sentences ('transductive') or on a corpus (lee, brown, a file, ...); comma list for several"),
        split: str = typer.Option("test", help="test, dev or train (SemEval STS12-16 exist only as test; SICK dev = TRIAL)"),
        limit_pairs: Optional[int] = typer.Option(None, min=1, help="evaluate a seeded random subset of N pairs per dataset"),
        include_special: bool = typer.Option(True, "--include-special/--exclude-special", help="include special tokens (CLS/SEP/BOS) in the sentence mean", rich_help_panel=VECTORS_PANEL),
        seed: int = typer.Option(0, min=0, help="seed for --limit-pairs and the calibrators"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
        markdown: Optional[Path] = typer.Option(None, "--markdown", help="also write the summary table as markdown"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out, its CSV or --markdown file that lmgeom did not write"),
    ) -> None:
        """Spearman x 100 between gold similarity and the cosine of mean-pooled sentence vectors, per layer and calibration."""
        from lmgeom.corpus.builtin import DEFAULT_DATA_DIR
        from lmgeom.stages.sts import Combined, run_sts

        model = one_model(model_argument, model_option, "sts")
        with user_errors():
            methods = list(METHOD_NAMES) if method.strip() == "all" else split_list(method)
            combinations = [Combined(text) for text in combine]
            with RichProgress() as progress:
                result = run_sts(
                    model, DEFAULT_DATA_DIR if data_dir is None else data_dir, layers=[*split_list(layers), *combinations], methods=methods, fit_on=split_list(fit_on),
                    split=split, limit_pairs=limit_pairs, include_special=include_special, seed=seed, device=device, out=out,
                    markdown=markdown, overwrite=overwrite, progress=progress,
                )
        datasets = ", ".join(d["name"] for d in result.settings["datasets"])
        console.print(
            f"{result.model_id}: STS Spearman x 100 ({split}), mean over {datasets} of the pooled pairs; "
            f"mean pooling, special tokens {'included' if include_special else 'excluded'}; layer 0 = embedding output",
            highlight=False,
        )
        header, rows = result.summary
        groups = table_columns(header, rows, console.width)
        for number, group in enumerate(groups, start=1):
            part = f" ({number} of {len(groups)}: {header[group[0]]} to {header[group[-1]]})" if len(groups) > 1 else ""
            console.print(f"layer x calibration{part}", highlight=False)
            console.print(grid_table([header[i] for i in (0, *group)], [[row[i] for i in (0, *group)] for row in rows]))
        best_header, best_rows = result.best
        if best_rows:
            console.print("best calibration per layer (gain = score - none)", highlight=False)
            console.print(grid_table(best_header, best_rows, left=(0, 2)))
        if any(record.get("few_fit_rows") for record in result.records):
            from lmgeom.evaluate.sts import FEW_ROWS_MARK

            console.print(f"{FEW_ROWS_MARK} calibrator fitted on fewer sentences than 2 x the dimension: whitening, CIE "
                          "and the flow collapse there; fit on more sentences (--fit-on a corpus, or more pairs)")
        if result.paths:
            console.print("per-dataset scores, both aggregations and isotropy: " + ", ".join(str(path) for path in result.paths))
        else:
            console.print("per-dataset scores, both aggregations and isotropy: pass --out (JSON + CSV) or --markdown")

