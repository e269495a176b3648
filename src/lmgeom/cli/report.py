"""`lmgeom report` (one run's HTML report and figures) and `lmgeom compare` (several runs side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from lmgeom.cli.common import RichProgress, console, shown, user_errors, url_form


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_command(
        run_dir: Path = typer.Argument(..., metavar="RUN", help="a run directory written by `lmgeom run`"),
        include: List[Path] = typer.Option([], help="another folder of experiment results: results.json or thesis.json, "
                                                    "or */ of them (repeatable)"),
        out: Optional[Path] = typer.Option(None, callback=url_form, help="HTML file to write (default RUN/report.html)"),
        explorer_words: int = typer.Option(2000, min=1, help="words in the word explorer (the most frequent analysed ones)"),
        neighbours: int = typer.Option(10, min=1, help="nearest neighbours per word and layer in the word explorer"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out file that lmgeom did not write"),
        control: Optional[Path] = typer.Option(None, metavar="RUN_CONTROL", help="a control run of the same model "
                                               "(`lmgeom run --control`), drawn beside RUN in the contextuality and "
                                               "isotropy figures: dashed, same colour"),
    ) -> None:
        """Re-render a run's report from its result files (no model needed): RUN/report.html and RUN/figures/."""
        from lmgeom.report import load_run
        from lmgeom.pipeline import render_report
        from lmgeom.rundir import FIGURES

        if neighbours >= explorer_words:
            raise typer.BadParameter(f"{neighbours} neighbours need more than {neighbours} other words; give fewer than "
                                     f"--explorer-words ({explorer_words})", param_hint="--neighbours")
        with user_errors():
            with RichProgress() as progress:
                path = render_report(run_dir, include=include, out=out, explorer_words=explorer_words,
                                     explorer_neighbours=neighbours, overwrite=overwrite, control=control,
                                     progress=progress)
            run = load_run(run_dir)
            if run.contextuality is not None:
                from lmgeom.report.labels import MEV_ADJ_COLUMN, MEV_ADJ_NOTE

                table = Table(title=f"{shown(run.label)} (layer 0 = embedding output)")
                for header in ("layer", "baseline", "SelfSim", "SelfSim adj", "IntraSim", "MEV adj"):
                    table.add_column(header, justify="right")
                for layer in run.layer_numbers:
                    values = [run.metric("anisotropy_exact").get(layer), run.metric("self_similarity").get(layer),
                              run.metric("self_similarity", "adjusted").get(layer),
                              run.metric("intra_sentence_similarity").get(layer),
                              run.metric(MEV_ADJ_COLUMN.removesuffix("_adjusted"), "adjusted").get(layer)]
                    table.add_row(str(layer), *(f"{v:.3f}" if v is not None else "—" for v in values))
                console.print(table)
                console.print(MEV_ADJ_NOTE)
            for section, note in run.notes.items():
                console.print(f"[dim]{shown(section)}: {shown(note)}[/]")
            console.print(f"wrote {shown(path)}")
            console.print(f"figures in {shown(FIGURES.at(run.path))}")

    @app.command("compare")
    def compare_command(
        run_dirs: List[Path] = typer.Argument(..., metavar="RUN...", help="analysed run directories"),
        out: Path = typer.Option(..., callback=url_form, help="folder for compare.html, compare.csv and figures/"),
    ) -> None:
        """Several runs side by side: one chart per metric, by layer and by relative depth (layer / last layer);
        for runs of one corpus, the model x model similarity (debiased CKA) of their stores."""
        from lmgeom.report.compare import wide_table, comparison_table
        from lmgeom.report.data import load_run
        from lmgeom.pipeline import render_comparison

        with user_errors():
            with RichProgress() as progress:
                path = render_comparison(run_dirs, out, progress=progress)
            wide = wide_table(comparison_table([load_run(d) for d in run_dirs]))
            table = Table(title="by relative depth (layer / last layer)")
            for header in ("run", "layer", "depth", "SelfSim adj", "IntraSim adj"):
                table.add_column(header, justify="left" if header == "run" else "right")
            for row in wide.to_dict("records"):
                table.add_row(str(row["run"]), str(row["layer"]), f"{row['depth']:.2f}",
                              f"{row['self_similarity_adjusted']:.3f}", f"{row['intra_sentence_similarity_adjusted']:.3f}")
            console.print(table)
            from lmgeom import rundir

            console.print(f"wrote {path}, {rundir.COMPARE_CSV.at(out)} and {rundir.FIGURES.at(out)}/")
