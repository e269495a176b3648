"""`lmgeom similarity`: layer x layer CKA, Procrustes distance, RSA and mutual k-NN within a store or
between two stores of the same corpus."""

from __future__ import annotations

from typing import Any, Optional

import typer

from lmgeom.cli.common import (LAYERS_HELP, ROWS_HELP, SITES_READ_HELP, RichProgress, console, old_spellings, split_list,
                               user_errors, url_form)

MEASURE_NAMES = "cka,cka_debiased,procrustes,rsa,knn"
TABLE_WIDTH = 80
TABLE_MEASURES = {"cka": "linear CKA", "cka_debiased": "debiased linear CKA"}
PERMUTATIONS, PROCRUSTES_PERMUTATIONS = 200, 20  # SimilarityOptions' defaults (kept here: no numerical import at startup)


def grid_lines(values: Any, rows: list[int], columns: list[int], *, width: int = TABLE_WIDTH, digits: int = 2) -> list[str]:
    """A rows x columns table of values (`digits` decimals) as lines of at most `width` characters:
    the columns split into as many blocks as the width needs, each block with the row labels."""
    label = max(len("a\\b"), *(len(f"L{r}") for r in rows))
    cell = digits + 4
    per_block = max(1, (width - label) // cell)
    lines: list[str] = []
    for start in range(0, len(columns), per_block):
        block = range(start, min(len(columns), start + per_block))
        if lines:
            lines.append("")
        lines.append("a\\b".ljust(label) + "".join(f"L{columns[j]}".rjust(cell) for j in block))
        for i, row in enumerate(rows):
            lines.append(f"L{row}".ljust(label) + "".join(
                ("—" if values[i][j] != values[i][j] else f"{values[i][j]:.{digits}f}").rjust(cell) for j in block))
    return lines


def summary_table(result: Any, *, within: bool) -> Any:
    """A rich table of each measure over the pairs of layers: its mean, its permutation null's mean,
    the largest p-value, the pairs at p <= 0.05, the shuffles and the chance level (mutual k-NN)."""
    from rich.table import Table

    from lmgeom.metrics.similarity import P_LEVEL, measure_summaries

    def show(value: Any, digits: int = 3) -> str:
        return "—" if value is None or value != value else f"{value:.{digits}f}"

    table = Table(title="each measure over the pairs of layers" + (" (off the diagonal)" if within else ""))
    for name in ("measure", "mean", "null", "largest p", f"p ≤ {P_LEVEL:g}", "shuffles", "chance"):
        table.add_column(name, justify="left" if name == "measure" else "right")
    for row in measure_summaries(result.values, result.null, result.p_values, result.permutations, result.chance,
                                 within=within):
        share = "—" if row["p_small"] is None else f"{row['p_small']}/{row['pairs']}"
        table.add_row(row["measure"], show(row["mean"]), show(row["null"]), show(row["p_max"], 4), share,
                      str(row["permutations"]), show(row["chance"], 4))
    return table


def register(app: typer.Typer) -> None:
    @app.command("similarity", cls=old_spellings(
        {"--measure": "--measures", "--sample": "--rows", "--no-include-punct": "", "--no-include-special": "",
         "--no-exclude-first-word": ""}))
    def similarity_command(
        store: str = typer.Argument(..., help="a store written by `lmgeom extract` (or a run holding one)"),
        store2: Optional[str] = typer.Argument(None, metavar="[STORE2]", help="a second store of the same corpus: its rows are matched by word occurrence"),
        measure: str = typer.Option(MEASURE_NAMES, "--measures", "-m", show_default=False,
                                    help=f"comma-separated measures: {MEASURE_NAMES.replace(',', ', ')} (default: all)"),
        layers: Optional[str] = typer.Option(None, help=f"{LAYERS_HELP} (default: all), of both stores unless --layers-b"),
        layers_b: Optional[str] = typer.Option(None, help="layers of STORE2, the same grammar (default: those of --layers)"),
        rows: int = typer.Option(2000, min=4, metavar="<int>", help=f"{ROWS_HELP}, of the matched ones, for rsa, knn and the permutation nulls"),
        seed: int = typer.Option(0, min=0, metavar="<int>", help="seed of the subsample and the permutations"),
        k: int = typer.Option(10, min=1, metavar="<int>", help="neighbours of mutual k-NN"),
        permutations: int = typer.Option(PERMUTATIONS, min=0, metavar="<int>", help="row shuffles of the null of cka, rsa and knn (0: no null, no p-value)"),
        procrustes_permutations: int = typer.Option(PROCRUSTES_PERMUTATIONS, min=0, metavar="<int>", help="row shuffles of the Procrustes null (an SVD each; 0: none)"),
        include_punct: bool = typer.Option(False, "--include-punct", help="also compare punctuation tokens"),
        include_special: bool = typer.Option(False, "--include-special", help="also compare special tokens (one store only: they are no corpus words)"),
        exclude_first_word: bool = typer.Option(False, "--exclude-first-word", help="leave out each sentence's first word"),
        out: Optional[str] = typer.Option(None, callback=url_form, help="folder for similarity.json and .csv [default: STORE, or STORE/similarity/<STORE2 name> for two stores; another site's inside STORE/site_results/<site>/]"),
        device: str = typer.Option("cpu", help="where CKA and Procrustes accumulate: cpu (numpy), cuda, cuda:N, auto (cuda when present) or torch:cpu"),
        engine: str = typer.Option("auto", help="local, processes, ray, or auto (processes with more than one worker)"),
        num_workers: int = typer.Option(1, min=1, metavar="<int>", help="tasks at once (groups of layer pairs)"),
        sites: str = typer.Option("resid_post", "--sites", metavar="<site>", help=f"{SITES_READ_HELP}; with STORE2, "
                                  "the same site of both stores"),
    ) -> None:
        """Layer x layer similarity: linear CKA (biased and debiased) and the Procrustes distance over
        every row, RSA and mutual k-NN on a seeded subsample, each with a permutation null and
        p-value on the subsample. Prints the CKA tables and each measure's mean, null and p-values,
        and writes similarity.json and similarity.csv."""
        import numpy as np

        from lmgeom.stages.similarity import SimilarityOptions, default_out, similarity_matrix, write_similarity

        from lmgeom.cli.analyze import one_site

        with user_errors({"sample": "--rows"}):
            options = SimilarityOptions(measures=tuple(split_list(measure)), layers=layers, layers_b=layers_b,
                                        sample=rows, seed=seed, k=k,
                                        permutations=permutations, procrustes_permutations=procrustes_permutations,
                                        include_punct=include_punct,
                                        include_special=include_special, exclude_first_word=exclude_first_word,
                                        site=one_site(sites, "similarity"), device=device, engine=engine,
                                        num_workers=num_workers)
            with RichProgress() as progress:
                result = similarity_matrix(store, store2, options, progress=progress)
            paths = write_similarity(result, out or default_out(store, store2, options.site))
        names = " x ".join(str(s["model_id"] or s["url"]) for s in result.stores) if store2 else str(result.stores[0]["model_id"])
        if options.site != "resid_post":
            names += f", site {options.site}"
        counts = result.counts
        matched = f"{counts['rows_matched']:,} rows"
        if store2:
            matched += f" matched by word occurrence ({counts['a_rows_unmatched']:,} of a and {counts['b_rows_unmatched']:,} of b unmatched)"
        axes = "layers of a (rows) x b (columns)" if store2 else "layer x layer"
        shuffled = "rows of b shuffled" if store2 else "rows of one side shuffled"
        for name, title in TABLE_MEASURES.items():
            if name in result.values:
                console.print(f"{title}, {axes}: {names}, {matched}", highlight=False, soft_wrap=True)
                console.print("\n".join(grid_lines(result.values[name], result.layers_a, result.layers_b)), highlight=False)
                if name in result.null:
                    mean_null = float(np.nanmean(result.null[name]))
                    p, shuffles = result.p_values[name], result.permutations[name]
                    console.print(f"null ({shuffled} {shuffles} times on {counts['sample']:,} sampled rows): "
                                  f"mean {mean_null:.3f}", highlight=False)
                    console.print(f"p-values on the sampled rows (the smallest possible {1 / (1 + shuffles):.3f}):",
                                  highlight=False)
                    console.print("\n".join(grid_lines(p, result.layers_a, result.layers_b, digits=3)), highlight=False)
        console.print(summary_table(result, within=not store2))
        if "knn" in result.chance:
            console.print(f"mutual k-NN chance level k / (m - 1) = {result.chance['knn']:.4f} (k = {k}, m = "
                          f"{counts['sample']:,} sampled rows)", highlight=False)
        console.print("wrote " + ", ".join(str(path) for path in paths), highlight=False, soft_wrap=True)
