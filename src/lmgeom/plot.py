"""A run's figures on matplotlib Axes, for notebooks and papers: the report's charts, drawn by the
report's own drawing code (`lmgeom.report.figures.draw_chart`, `lmgeom.report.similarity.heatmap_on`).

Each function takes a run (a `RunData` from `lmgeom.load_run`, or a run directory's path or URL),
draws one chart on `ax` (a new figure's Axes when None) and returns the Axes. Layer 0 is the
embedding output.

    >>> import lmgeom, lmgeom.plot
    >>> run = lmgeom.load_run("runs/minilm-lee")  # doctest: +SKIP
    >>> lmgeom.plot.contextuality(run, "self_similarity")  # doctest: +SKIP
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, Sequence

from lmgeom.errors import InputError
from lmgeom.report.data import RunData, load_run
from lmgeom.report.figures import LAYER_AXIS, Chart, calibration_charts, contextuality_charts, draw_chart, isotropy_charts
from lmgeom.report.geometry import id_chart, read_geometry
from lmgeom.report.similarity import MEASURE_TITLES, heatmap_on
from lmgeom import rundir

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["calibration", "contextuality", "geometry", "isotropy", "similarity"]

TITLE_WIDTH = 60  # characters per line of an Axes' title


def contextuality(run: RunData | rundir.Where, measure: str = "self_similarity", *, ax: Axes | None = None) -> Axes:
    """One contextuality chart of the report, by layer.

    Raw values (and adjusted ones where the measure has a baseline), with the bootstrap bands the
    analysis computed.

    Parameters
    ----------
    run : RunData or str or os.PathLike
        The run (`lmgeom.load_run`), or its directory's path or fsspec URL.
    measure : str, default "self_similarity"
        The chart: "anisotropy" (exact and sampled mean cosine), "self_similarity",
        "intra_sentence_similarity", "mev" (three variants, raw), "mev_adjusted", or another measure
        the statistics registry charts.
    ax : matplotlib Axes or None, default None
        Where to draw (None: a new figure's Axes).

    Returns
    -------
    ax : matplotlib.axes.Axes
        `ax`, with one line per series, labelled as in the report; a band's edges are lines labelled
        "_band", outside the legend.

    Raises
    ------
    InputError
        The run holds no contextuality.json, or `measure` is not one of its charts.
    """
    data = _run(run)
    _require(data, "contextuality")
    return _draw(_chart(contextuality_charts(data), measure, "measure", prefix=""), ax)


def isotropy(run: RunData | rundir.Where, measure: str = "isoscore", *, ax: Axes | None = None) -> Axes:
    """Global and local isotropy of every layer (isotropy.json), as the report draws it.

    Parameters
    ----------
    run : RunData or str or os.PathLike
        The run (`lmgeom.load_run`), or its directory's path or fsspec URL.
    measure : str, default "isoscore"
        The chart: "isoscore" (global and in k-means clusters), "log_partition" (log I(W), raw and
        centred) or "average_cosine" (global, and centred in clusters).
    ax : matplotlib Axes or None, default None
        Where to draw (None: a new figure's Axes).

    Returns
    -------
    ax : matplotlib.axes.Axes
        `ax`, with one line per series of the chart.

    Raises
    ------
    InputError
        The run holds no isotropy.json, or `measure` is not one of the charts.
    """
    data = _run(run)
    _require(data, "isotropy")
    return _draw(_chart(isotropy_charts(data), measure, "measure", prefix="isotropy_"), ax)


def calibration(run: RunData | rundir.Where, measure: str = "isoscore", *, ax: Axes | None = None) -> Axes:
    """Isotropy before and after each calibration (calibration.json), as the report draws it.

    One line before calibration and one after each fitted method, at the calibrated layers.

    Parameters
    ----------
    run : RunData or str or os.PathLike
        The run (`lmgeom.load_run`), or its directory's path or fsspec URL.
    measure : str, default "isoscore"
        The isotropy measure: "isoscore", "log_partition_isotropy" or "average_cosine".
    ax : matplotlib Axes or None, default None
        Where to draw (None: a new figure's Axes).

    Returns
    -------
    ax : matplotlib.axes.Axes
        `ax`, with a line "before calibration" and one "after <method>" per method.

    Raises
    ------
    InputError
        The run holds no calibration.json, or `measure` is not one of the charts.
    """
    data = _run(run)
    _require(data, "calibration")
    return _draw(_chart(calibration_charts(data), measure, "measure", prefix="calibration_"), ax)


def similarity(run: RunData | rundir.Where, measure: str = "cka_debiased", *, ax: Axes | None = None,
               colorbar: bool = True) -> Axes:
    """The layer x layer similarity of a run (similarity.json) as a heatmap, as the report draws it.

    Parameters
    ----------
    run : RunData or str or os.PathLike
        The run (`lmgeom.load_run`), or its directory's path or fsspec URL.
    measure : str, default "cka_debiased"
        "cka_debiased", "cka", "procrustes" (a distance, radians), "rsa" or "knn", among those the
        run measured.
    ax : matplotlib Axes or None, default None
        Where to draw (None: a new figure's Axes).
    colorbar : bool, default True
        Add a colour bar beside `ax`.

    Returns
    -------
    ax : matplotlib.axes.Axes
        `ax`, holding the matrix as its image (`ax.images[0]`): rows `layer_a`, columns `layer_b`.

    Raises
    ------
    InputError
        The run holds no similarity.json, or `measure` is not among its measures.
    """
    data = _run(run)
    table = _require(data, "similarity")
    measured = list(dict.fromkeys(table["measure"]))
    if measure not in measured:
        raise InputError(f"`measure={measure!r}` is not among the similarity measures of {data.name}; give one of "
                         f"{', '.join(map(repr, measured))}", param="measure")
    rows = table.loc[table["measure"] == measure]
    matrix = rows.pivot(index="layer_a", columns="layer_b", values="value").sort_index().sort_index(axis=1)
    ax = _axes(ax)
    image = heatmap_on(ax, matrix.to_numpy(dtype=float), [str(layer) for layer in matrix.index],
                       [str(layer) for layer in matrix.columns], "layer", LAYER_AXIS, measure != "procrustes")
    title = MEASURE_TITLES.get(measure, measure)
    _title(ax, f"{title[0].upper()}{title[1:]} between layers")
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return ax


def geometry(run: RunData | rundir.Where, *, ax: Axes | None = None) -> Axes:
    """The intrinsic dimension of every layer (geometry.json), as the report draws it.

    TwoNN, MLE and GRIDE at two scales, each with its bootstrap band.

    Parameters
    ----------
    run : RunData or str or os.PathLike
        The run (`lmgeom.load_run`), or its directory's path or fsspec URL.
    ax : matplotlib Axes or None, default None
        Where to draw (None: a new figure's Axes).

    Returns
    -------
    ax : matplotlib.axes.Axes
        `ax`, with one line per estimator ("TwoNN", "MLE", "GRIDE n2 = 8", "GRIDE n2 = 64").

    Raises
    ------
    InputError
        The run holds no geometry.json.
    """
    data = _run(run)
    _require(data, "geometry")
    document = read_geometry(data.path)  # the checked reader, as the report reads it
    assert document is not None
    return _draw(id_chart(document, data.label), ax)


def _run(run: RunData | rundir.Where) -> RunData:
    return run if isinstance(run, RunData) else load_run(run)


def _require(run: RunData, result: str) -> Any:
    frame = getattr(run, result)
    if frame is None or frame.empty:
        raise InputError(f"{run.name} holds no {result} results to plot: "
                         f"{run.notes.get(result, f'its {result} result is empty')}", param="run")
    return frame


def _chart(charts: Sequence[Chart], measure: str, param: str, *, prefix: str) -> Chart:
    """The chart named `prefix` + `measure` among `charts`, else an error listing the choices."""
    by_name = {chart.name.removeprefix(prefix): chart for chart in charts if chart.has_data}
    if measure not in by_name:
        raise InputError(f"`{param}={measure!r}` is not a chart this run has; give one of "
                         f"{', '.join(map(repr, by_name)) or '(none)'}", param=param)
    return by_name[measure]


def _axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # the user's backend: a notebook shows the figure

    _, axes = plt.subplots(figsize=(7.0, 4.0))
    return axes


def _title(ax: Axes, title: str) -> None:
    ax.set_title("\n".join(textwrap.wrap(title, TITLE_WIDTH)), fontsize=9, loc="left")


def _draw(chart: Chart, ax: Axes | None) -> Axes:
    ax = _axes(ax)
    draw_chart(chart, ax)
    _title(ax, chart.title)
    return ax
