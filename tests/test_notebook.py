"""The Python API a notebook meets: a run's results as DataFrames (`lmgeom.load_run`, `RunResult.run`),
the report's figures on matplotlib Axes (`lmgeom.plot`), progress on standard error by default, and
docs/api.md's worked example, executed."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")  # this test process draws into files only

import lmgeom  # noqa: E402
import lmgeom.plot  # noqa: E402
from lmgeom.errors import InputError  # noqa: E402
from lmgeom.progress import StderrProgress  # noqa: E402
from lmgeom.rundir import ResultFileError  # noqa: E402

from helpers import TINY_RUN  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"


@pytest.fixture(scope="module")
def run_dir(tiny_run: Any) -> Path:
    return Path(tiny_run.store.path)


@pytest.fixture(scope="module")
def run(run_dir: Path) -> Any:
    return lmgeom.load_run(run_dir)


def document(run_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((run_dir / name).read_text(encoding="utf-8"))


def test_load_run_imports_neither_torch_nor_matplotlib() -> None:
    code = ("import sys; from lmgeom import load_run; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'sklearn', 'transformers') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]", shown.stderr


def test_every_result_is_a_frame_of_the_run_s_files(run: Any, run_dir: Path, tiny_run: Any) -> None:
    assert run.present == ["contextuality", "words", "isotropy", "calibration", "static", "similarity", "geometry"]
    assert set(run.missing) == {"sts", "experiments"} and "lmgeom sts" in run.missing["sts"]

    records = document(run_dir, "contextuality.json")["records"]
    frame = run.contextuality.set_index(["layer", "metric"])
    assert len(frame) == len(records)
    for record in records:
        assert frame.at[(record["layer"], record["metric"]), "raw"] == pytest.approx(record["raw"], nan_ok=True)
    expected = tiny_run.contextuality.layers.set_index(["layer", "metric"])["raw"]
    np.testing.assert_allclose(frame["raw"].loc[expected.index].to_numpy(dtype=float), expected.to_numpy(dtype=float))

    words = pd.read_csv(run_dir / "contextuality_words.csv", keep_default_na=False, na_values=[""], dtype={"word": str})
    assert run.words.shape == words.shape and list(run.words["word"]) == list(words["word"])

    isotropy = pd.DataFrame(document(run_dir, "isotropy.json")["records"])
    pd.testing.assert_frame_equal(run.isotropy[isotropy.columns].reset_index(drop=True), isotropy, check_dtype=False)
    calibration = pd.DataFrame(document(run_dir, "calibration.json")["records"])
    assert sorted(run.calibration["layer"].unique()) == [0, 3] == sorted(calibration["layer"].unique())
    np.testing.assert_allclose(run.calibration["after"].to_numpy(dtype=float), calibration["after"].to_numpy(dtype=float))
    assert set(run.static["layer"]) == {0, 3}

    similarity = document(run_dir, "similarity.json")
    cka = run.similarity.loc[run.similarity["measure"] == "cka_debiased"].pivot(index="layer_a", columns="layer_b", values="value")
    np.testing.assert_allclose(cka.to_numpy(), np.asarray(similarity["matrices"]["cka_debiased"], dtype=float))

    geometry = document(run_dir, "geometry.json")["layers"]
    twonn = run.geometry.loc[run.geometry["measure"] == "id_twonn"].set_index("layer")["value"]
    assert twonn.to_dict() == pytest.approx({layer["layer"]: next(e["dimension"] for e in layer["intrinsic_dimension"]
                                                                   if e["method"] == "twonn") for layer in geometry})


def test_settings_store_and_summaries(run: Any, run_dir: Path) -> None:
    steps = document(run_dir, "run.json")["steps"]
    assert list(run.settings) == list(steps)
    assert run.settings == {name: step["settings"] for name, step in steps.items()}
    assert run.settings["calibration"]["methods"] == ["whitening", "abtt"]
    assert run.store["model_id"] == "tiny-bert" and run.store["corpus"] == "lee[:60]"
    assert run.store["layers"] == [0, 1, 2, 3] and run.store["layer_note"].startswith("layer 0 is the embedding output")

    headline = run.headline()
    assert list(headline.index) == [0, 1, 2, 3]
    assert headline.loc[3, "self_similarity"] == pytest.approx(run.metric("self_similarity")[3])
    isoscore = run.isotropy.query("measure == 'isoscore' and layer == 2")["value"].item()
    assert headline.loc[2, "isoscore"] == pytest.approx(isoscore)

    text = repr(run)
    assert text.startswith("RunData: tiny-bert on lee[:60]") and "results: contextuality, words, isotropy" in text
    assert "missing sts:" in text and f"{headline.loc[3, 'self_similarity']:.3f}" in text
    page = run._repr_html_()
    assert "<strong>tiny-bert on lee[:60]</strong>" in page and "<table" in page and "missing" in page


def test_run_result_holds_the_run_s_frames(tiny_run: Any, run: Any) -> None:
    assert isinstance(tiny_run.run, lmgeom.RunData)
    pd.testing.assert_frame_equal(tiny_run.run.contextuality, run.contextuality)
    assert tiny_run.run.settings == run.settings
    assert "RunResult: steps run extract" in repr(tiny_run) and "RunData: tiny-bert" in repr(tiny_run)
    assert "steps run:" in tiny_run._repr_html_()


def test_a_missing_result_is_none_and_a_mixed_one_refused(run_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(run_dir, tmp_path / "run"))
    for name in ("geometry.json", "geometry.csv"):
        (copy / name).unlink()
    partial = lmgeom.load_run(copy)
    assert partial.geometry is None and "geometry" not in partial.present
    assert "lmgeom geometry" in partial.missing["geometry"]
    with pytest.raises(InputError, match="holds no geometry results"):
        lmgeom.plot.geometry(partial)

    table = copy / "similarity.csv"  # a companion changed after its document was written: not one set
    table.write_text(table.read_text(encoding="utf-8").replace("cka,1.0", "cka,0.5", 1), encoding="utf-8")
    with pytest.raises(ResultFileError, match="similarity.json and similarity.csv are not one set"):
        lmgeom.load_run(copy)


def drawn(ax: Any) -> dict[str, np.ndarray]:
    """Each labelled line of `ax` (not a band's edge) and its y values."""
    return {line.get_label(): np.asarray(line.get_ydata(), dtype=float) for line in ax.lines
            if not line.get_label().startswith("_")}


def test_plot_contextuality_draws_the_run_s_values(run: Any) -> None:
    ax = lmgeom.plot.contextuality(run, "self_similarity")
    lines = drawn(ax)
    assert list(lines) == ["raw", "adjusted (raw − exact anisotropy)"]
    np.testing.assert_allclose(lines["raw"], run.metric("self_similarity").to_numpy())
    np.testing.assert_allclose(lines["adjusted (raw − exact anisotropy)"], run.metric("self_similarity", "adjusted").to_numpy())
    edges = [line for line in ax.lines if line.get_label() == "_band"]
    assert len(edges) == 4  # each line's bootstrap band: its two edges
    np.testing.assert_allclose(edges[0].get_ydata(), run.metric("self_similarity", "raw_lo").to_numpy())

    lines = drawn(lmgeom.plot.contextuality(run, "anisotropy"))
    assert len(lines) == 2
    np.testing.assert_allclose(lines["exact (all pairs)"], run.metric("anisotropy_exact").to_numpy())
    with pytest.raises(InputError, match=r"`measure='selfsim'` is not a chart this run has; give one of 'anisotropy'"):
        lmgeom.plot.contextuality(run, "selfsim")


def test_plot_isotropy_and_calibration_draw_the_run_s_values(run: Any) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    assert lmgeom.plot.isotropy(run, ax=left) is left
    lines = drawn(left)
    assert list(lines) == ["global", "in clusters (local)"]
    iso = run.isotropy
    np.testing.assert_allclose(lines["global"], iso.loc[iso["measure"] == "isoscore"].sort_values("layer")["value"])
    np.testing.assert_allclose(lines["in clusters (local)"],
                               iso.loc[iso["measure"] == "local_isoscore"].sort_values("layer")["value"])

    assert lmgeom.plot.calibration(run, "average_cosine", ax=right) is right
    lines = drawn(right)
    assert list(lines) == ["before calibration", "after whitening", "after abtt"]
    table = run.calibration.loc[run.calibration["measure"] == "average_cosine"]
    whitening = table.loc[table["method"] == "whitening"].set_index("layer")["after"]
    # layers 0 and 3 calibrated: 1 and 2 are gaps, which no line crosses
    np.testing.assert_allclose(lines["after whitening"], [whitening[0], np.nan, np.nan, whitening[3]])
    plt.close(fig)


def test_plot_similarity_and_geometry_draw_the_run_s_values(run: Any) -> None:
    ax = lmgeom.plot.similarity(run, "procrustes")
    expected = run.similarity.loc[run.similarity["measure"] == "procrustes"].pivot(index="layer_a", columns="layer_b",
                                                                                      values="value")
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), expected.to_numpy())
    assert ax.images[0].get_clim() == pytest.approx((0, np.pi / 2))  # a distance in radians
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
    with pytest.raises(InputError, match="`measure='cca'` is not among the similarity measures"):
        lmgeom.plot.similarity(run, "cca")

    lines = drawn(lmgeom.plot.geometry(run))
    assert list(lines) == ["TwoNN", "MLE", "GRIDE n2 = 8", "GRIDE n2 = 64"]
    geometry = run.geometry.set_index(["measure", "layer"])["value"]
    np.testing.assert_allclose(lines["TwoNN"], geometry.loc["id_twonn"].sort_index().to_numpy())
    np.testing.assert_allclose(lines["GRIDE n2 = 64"], geometry.loc["id_gride_64"].sort_index().to_numpy())


def test_plot_takes_a_run_directory(run_dir: Path, run: Any) -> None:
    lines = drawn(lmgeom.plot.contextuality(str(run_dir), "mev"))
    assert len(lines) == 3
    np.testing.assert_allclose(lines["uncentred (paper's formula)"], run.metric("mev_uncentred").to_numpy())


def test_progress_lines_on_stderr_and_nothing_on_stdout(run_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    copy = shutil.copytree(run_dir, tmp_path / "run")
    capfd.readouterr()
    result = lmgeom.run("tiny-bert", "lee", out=copy, **TINY_RUN)  # every step done: skipped; the report rendered again
    out, err = capfd.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "run: started, 8 steps"
    noted = [line.rsplit("; ", 1)[-1] for line in lines if line.startswith("run: ") and "; " in line]
    assert noted == [*result.steps_skipped, "report", "done"]
    assert any(line.startswith("report: 1/1 pages (100 %)") for line in lines)
    assert result.steps_run == ["report"]

    capfd.readouterr()
    lmgeom.run("tiny-bert", "lee", out=copy, progress=False, **TINY_RUN)
    assert capfd.readouterr() == ("", "")
    with pytest.raises(InputError, match=r"`progress='bars'` is neither True, False nor an object"):
        lmgeom.run("tiny-bert", "lee", out=copy, progress="bars", **TINY_RUN)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stderr_progress_lines_notes_at_once_and_bars() -> None:
    clock, out = Clock(), io.StringIO()
    progress = StderrProgress(bars=False, file=out, clock=clock)
    progress.start("calibrate", 2, unit="fits")
    clock.now = 1.0
    progress.advance("calibrate", 0, note="fitting L3 flow")  # a new activity: shown at once
    clock.now = 2.0
    progress.advance("calibrate", 1, note="L3 flow fitted")  # within 10 s: not shown
    clock.now = 15.0
    progress.advance("calibrate", 1, note="L3 abtt fitted")
    assert out.getvalue().splitlines() == [
        "calibrate: started, 2 fits",
        "calibrate: 0/2 fits (0 %), 0:00:01 elapsed; fitting L3 flow",
        "calibrate: 2/2 fits (100 %), 0:00:15 elapsed; L3 abtt fitted",
    ]

    bars = io.StringIO()
    with StderrProgress(bars=True, file=bars) as shown:
        shown.start("extract", 4, unit="sentences")
        shown.advance("extract", 4, note="12 sentences/s")
    final = bars.getvalue().replace("\r", "\n").splitlines()[-1]
    assert re.search(r"extract: 100%.*4/4.*12 sentences/s", final), final


def test_hugging_face_bars_are_off_inside_and_restored() -> None:
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    from lmgeom.encoders.registry import hub_progress_bars_off

    before = (hub.are_progress_bars_disabled(), transformers_logging.is_progress_bar_enabled())
    with hub_progress_bars_off():
        assert hub.are_progress_bars_disabled() and not transformers_logging.is_progress_bar_enabled()
    assert (hub.are_progress_bars_disabled(), transformers_logging.is_progress_bar_enabled()) == before


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown page (```py blocks are shown, not run)."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_api_page_s_example_runs_on_a_tiny_run(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    example = "\n".join(blocks)
    assert '"runs/tiny-bert-lee"' in example and "load_run" in example and "set_output" in example and "lmgeom.plot" in example
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny-bert-lee").symlink_to(run_dir)
    namespace: dict[str, Any] = {}
    exec(compile(example, str(DOCS), "exec"), namespace)  # noqa: S102 (the page's own example)
    assert (tmp_path / "selfsim.png").stat().st_size > 5_000  # the example saves its figure
    whitened = namespace["whitened"]
    assert isinstance(whitened, pd.DataFrame) and list(whitened.columns) == [f"whitening{i}" for i in range(8)]
    np.testing.assert_allclose(np.cov(whitened.to_numpy(), rowvar=False), np.eye(whitened.shape[1]), atol=1e-4)
