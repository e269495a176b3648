"""The similarity sections: a run's layer x layer CKA and Procrustes heatmaps (similarity.json of
`lmgeom run` or `lmgeom similarity RUN`), and the model x model matrix of `lmgeom compare`.

A heatmap is a Plotly figure on the page (debiased CKA, with a button for the biased estimator)
and a PNG and SVG for papers. Each section states the permutation null: the same measure with the
rows of one side shuffled on the seeded subsample, the value of unrelated rows; the run's table gives
each measure's mean over the pairs of layers beside its null, its p-values and the chance level of
mutual k-NN."""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmgeom.report.figures import chart_subtitle, new_figure, one_line, safe_name, write_figure
from lmgeom.report.html import Page, esc, missing, table
from lmgeom.report.labels import number
from lmgeom import rundir
from lmgeom.metrics.similarity import P_LEVEL, measure_summaries

MEASURE_TITLES = {"cka_debiased": "linear CKA (debiased)", "cka": "linear CKA (biased)",
                  "procrustes": "Procrustes shape distance (radians)", "rsa": "RSA (Spearman of cosine-distance matrices)",
                  "knn": "mutual k-NN overlap"}
LAYER_NOTE = "layer 0 = embedding output"
ANNOTATED = 12  # a heatmap with at most this many rows and columns shows each cell's value


def read_similarity(directory: rundir.Where) -> dict[str, Any] | None:
    """A folder's similarity.json, or None when it has none."""
    return rundir.read_result(directory, rundir.SIMILARITY)


def _matrix(document: Mapping[str, Any], measure: str, kind: str = "matrices") -> np.ndarray | None:
    table = document.get(kind, {}).get(measure)
    return None if table is None else np.asarray(table, dtype=float)


def _cells(document: Mapping[str, Any], measure: str) -> list[list[float | None]]:
    """A matrix as Plotly's heatmap takes it (None for an undefined value)."""
    matrix = _matrix(document, measure)
    assert matrix is not None
    return [[float(v) if np.isfinite(v) else None for v in row] for row in matrix]


def null_statement(document: Mapping[str, Any]) -> str:
    """The permutation null in words: how it is made and its mean value for each measure."""
    settings = document.get("settings", {})
    null = document.get("null", {})
    if not null:
        return "No permutation null was computed (permutations = 0): no p-values."
    means = "; ".join(f"{MEASURE_TITLES.get(measure, measure)} {number(float(np.nanmean(np.asarray(table, float))), 3)}"
                      for measure, table in null.items())
    shuffles = document.get("permutations") or {}
    counts = sorted(set(shuffles.values()), reverse=True) or [settings.get("permutations")]
    how_many = (f"{counts[0]} times" if len(counts) == 1 else
                "; ".join(f"{n} times for {', '.join(m for m in shuffles if shuffles[m] == n)}" for n in counts))
    chance = document.get("chance", {}).get("knn")
    return (f"Permutation null (the rows of one side shuffled on the seeded subsample of "
            f"{number(document.get('counts', {}).get('sample'))} rows, seed {settings.get('seed')}: {how_many}; the "
            "Procrustes distance gets fewer shuffles because each needs an SVD), mean over the layer pairs: "
            f"{means}. Each measure's p-value compares its value on the subsample with its null: (1 + shuffles at least "
            "as similar) / (1 + shuffles), so the smallest possible is 1 / (1 + shuffles). Unrelated rows give a debiased "
            "CKA near 0; values well above the null are shared structure."
            + ("" if chance is None else f" Mutual k-NN's chance level (random neighbour lists) is k / (m − 1) = "
               f"{number(chance, 4)}."))


def heatmap(page: Page, name: str, what: str, document: Mapping[str, Any], folder: rundir.Where,
            measures: Sequence[str], *, label: str = "", y_title: str = "layer", x_title: str = "layer") -> str:
    """A heatmap of `measures[0]` of a similarity document (a button per further measure switches
    to it) on the page, and its PNG/SVG in `folder`/figures/: titled with the measure drawn and `what`
    it compares, its subtitle `label` (the run's) and the rows it was computed on."""
    present = [m for m in measures if _matrix(document, m) is not None]
    if not present:
        return missing(f"{rundir.SIMILARITY.name} holds none of {', '.join(measures)}")
    ys, xs = [str(layer) for layer in document["layers_a"]], [str(layer) for layer in document["layers_b"]]
    z = {m: _cells(document, m) for m in present}
    bounded = present[0] != "procrustes"
    trace = {"type": "heatmap", "z": z[present[0]], "x": xs, "y": ys, "colorscale": "Viridis",
             "zmin": 0, "zmax": 1 if bounded else float(np.pi / 2), "hovertemplate": "%{y} × %{x}: %{z:.3f}<extra></extra>"}
    if len(ys) <= ANNOTATED and len(xs) <= ANNOTATED:
        trace["texttemplate"] = "%{z:.2f}"
    layout: dict[str, Any] = {"template": "plotly_white", "height": 460, "margin": {"t": 40, "l": 70, "r": 20, "b": 60},
                              "xaxis": {"title": {"text": x_title}, "type": "category"},
                              "yaxis": {"title": {"text": y_title}, "type": "category", "autorange": "reversed"}}
    if len(present) > 1:
        layout["updatemenus"] = [{"type": "buttons", "direction": "right", "x": 0, "y": 1.12, "xanchor": "left",
                                  "buttons": [{"label": MEASURE_TITLES.get(m, m), "method": "restyle", "args": [{"z": [z[m]]}]}
                                              for m in present]}]
    div_id = f"chart-{safe_name(name)}"
    page.figures[div_id] = {"data": [trace], "layout": layout}
    first = _matrix(document, present[0])
    assert first is not None
    measure = MEASURE_TITLES.get(present[0], present[0])
    title = f"{measure[0].upper()}{measure[1:]} {what}"
    rows = document.get("counts", {}).get("rows_matched")
    subtitle = chart_subtitle(label, f"{rows:,} word occurrences" if rows is not None else "")
    files = write_figure(draw_heatmap(first, title, subtitle, ys, xs, y_title, f"{x_title} ({LAYER_NOTE})", bounded),
                         name, folder)
    links = " · ".join(f'<a href="{esc(rundir.link(rundir.REPORT.at(folder), f))}">'
                       f'{esc(str(f).rsplit(".", 1)[-1].upper())}</a>' for f in files)
    caption = "; ".join(filter(None, [subtitle, LAYER_NOTE]))
    return (f'<figure class="chart-box"><figcaption><span class="chart-title">{esc(title)}</span>'
            f'<span class="chart-subtitle">{esc(caption)}</span></figcaption><div class="chart" id="{div_id}"></div>'
            f'<p class="figure-files">for papers: {links}</p></figure>')


def draw_heatmap(matrix: np.ndarray, title: str, subtitle: str, ys: list[str], xs: list[str], y_title: str, x_title: str,
                 bounded: bool) -> Any:
    """The matplotlib figure of a heatmap (`heatmap_on`): the title (wrapped to the figure), one line of
    `subtitle` and a colour bar."""
    width = max(4.5, 1.6 + 0.4 * len(xs))
    fig = new_figure(width, 1.8 + 0.4 * len(ys), layout="constrained")
    axis = fig.add_subplot()
    image = heatmap_on(axis, matrix, ys, xs, y_title, x_title, bounded)
    # about 14 characters of 9 pt bold text per inch
    fig.suptitle(textwrap.fill(title, max(20, int(width * 14))), fontsize=9, weight="bold", gid="title")
    line = axis.set_title(subtitle, fontsize=7, color="#444", loc="left", gid="subtitle")
    fig.colorbar(image, ax=axis)
    fig.canvas.draw()  # the layout: where the axes start
    one_line(fig, line, 0.98 - axis.bbox.x0 / fig.bbox.width)
    return fig


def heatmap_on(axis: Any, matrix: np.ndarray, ys: Sequence[str], xs: Sequence[str], y_title: str, x_title: str,
               bounded: bool) -> Any:
    """Draw a similarity matrix on the matplotlib Axes `axis`: rows `ys`, columns `xs`, viridis from 0 to 1
    (to pi / 2 unless `bounded`: the Procrustes distance), and each cell's value (2 decimals, black on
    light cells and white on dark ones) when the matrix has at most `ANNOTATED` rows and columns. The
    one drawing of a heatmap: the report's figures and `lmgeom.plot.similarity` call it. Returns the image."""
    image = axis.imshow(matrix, vmin=0, vmax=1 if bounded else np.pi / 2, cmap="viridis")
    axis.set_xticks(range(len(xs)), list(xs))
    axis.set_yticks(range(len(ys)), list(ys))
    axis.set_xlabel(x_title)
    axis.set_ylabel(y_title)
    if len(ys) <= ANNOTATED and len(xs) <= ANNOTATED:
        for (row, column), value in np.ndenumerate(matrix):
            if np.isfinite(value):
                red, green, blue, _ = image.cmap(image.norm(value))
                light = 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.5
                axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7,
                          color="black" if light else "white", gid="cell")
    return image


def summary_table(document: Mapping[str, Any]) -> str:
    """Per measure, over the pairs of layers (off the diagonal within a model): the mean, its
    permutation null's mean, the largest p-value, the pairs at p <= 0.05, the shuffles and the
    chance level (mutual k-NN)."""
    within = len(document.get("stores", [])) == 1
    present = [measure for measure in MEASURE_TITLES if _matrix(document, measure) is not None]
    tables = {kind: {m: _matrix(document, m, kind) for m in present if _matrix(document, m, kind) is not None}
              for kind in ("matrices", "null", "p_values")}
    rows = []
    for row in measure_summaries(tables["matrices"], tables["null"], tables["p_values"], document.get("permutations") or {},
                                 document.get("chance") or {}, within=within):
        rows.append({"measure": MEASURE_TITLES[row["measure"]], "mean over layer pairs": row["mean"],
                     "permutation null": row["null"], "largest p": row["p_max"],
                     f"pairs at p ≤ {P_LEVEL:g}": "—" if row["p_small"] is None else f"{row['p_small']} of {row['pairs']}",
                     "shuffles": str(row["permutations"] or "—"), "chance level": row["chance"]})
    return table(pd.DataFrame(rows), digits=3, text_columns=("measure", f"pairs at p ≤ {P_LEVEL:g}", "shuffles"))


def similarity_section(page: Page, run_path: rundir.Target, label: str = "") -> str:
    """The body of a run report's similarity section (`label`: the run's, for the figures' subtitles)."""
    document = read_similarity(run_path)
    if document is None:
        return missing(f"no {rundir.SIMILARITY.name} in this run; `lmgeom run` (its similarity step) or "
                       f"`lmgeom similarity {run_path}` writes it")
    counts = document.get("counts", {})
    note = (f"Every pair of layers over the {number(counts.get('rows_matched'))} selected word occurrences: linear CKA "
            "(debiased, Song et al. 2012; the biased estimator by the button), the Procrustes shape distance (0 when one "
            "layer is a rotation of the other), RSA and mutual k-NN on a seeded subsample. " + null_statement(document))
    return (f'<p class="note">{esc(note)}</p>'
            + heatmap(page, "similarity_cka", "between layers", document, run_path, ("cka_debiased", "cka"), label=label)
            + heatmap(page, "similarity_procrustes", "between layers", document, run_path, ("procrustes",), label=label)
            + summary_table(document))


def models_section(page: Page, out: rundir.Where, labels: Sequence[str], pairs: Sequence[Mapping[str, Any]],
                   note: str | None) -> str:
    """The body of the comparison's model x model section: a matrix of the debiased CKA of the
    runs' last layers, and the layer x layer heatmap of every pair of runs; `note` says why there is
    no matrix (runs of different corpora, one run)."""
    if note is not None:
        return missing(note)
    matrix = pd.DataFrame(np.eye(len(labels)), index=list(labels), columns=list(labels))
    best = matrix.copy()
    bodies = []
    for pair in pairs:
        document, a, b = pair["document"], pair["a"], pair["b"]
        cka = _matrix(document, "cka_debiased")
        assert cka is not None
        matrix.loc[a, b] = matrix.loc[b, a] = cka[-1, -1]
        best.loc[a, b] = best.loc[b, a] = np.nanmax(cka)
        bodies.append(heatmap(page, f"models_{a}_{b}", f"of {a} (rows) × {b} (columns)", document, out,
                              ("cka_debiased", "cka"), y_title=f"layer of {a}", x_title=f"layer of {b}"))
    counts = [pair["document"].get("counts", {}).get("rows_matched") for pair in pairs]
    text = (f"Debiased linear CKA between the runs' last layers, over the word occurrences both stores hold (matched by "
            f"character offset in the corpus, whatever each tokenizer made of them; {', '.join(map(number, counts))} "
            "matched rows per pair); below it the best-matching pair of layers, then each pair's layer × layer "
            "heatmap. " + null_statement(pairs[0]["document"]))
    return (f'<p class="note">{esc(text)}</p><h3>Last layer × last layer</h3>'
            + table(matrix.reset_index(names="run"), digits=3, text_columns=("run",))
            + "<h3>Best-matching layers (highest debiased CKA over every pair of layers)</h3>"
            + table(best.reset_index(names="run"), digits=3, text_columns=("run",)) + "".join(bodies))
