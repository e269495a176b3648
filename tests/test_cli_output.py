"""Terminal output a researcher can read at 80 columns: `lmgeom sts`'s grid split into column groups,
`run --help` and `analyze --help` panels, calibrate's seconds per method."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.calibrate import METHOD_NAMES
from lmgeom.cli.main import app
from lmgeom.cli.common import table_columns as column_groups

STS_PAIRS = 40  # enough sentences for every calibrator's fit on a 4-layer tiny model


def write_stsb(root: Path, n_pairs: int = STS_PAIRS) -> None:
    words = "man woman dog cat car house runs eats sleeps red blue small big the a plays sings reads".split()
    rng = random.Random(0)
    rows = []
    for i in range(n_pairs):
        first, second = (" ".join(rng.choice(words) for _ in range(6)) for _ in range(2))
        rows.append("\t".join(["main-captions", "MSRvid", "2012test", f"{i:04d}", f"{rng.uniform(0, 5):.3f}", first, second]))
    (root / "stsbenchmark").mkdir(parents=True)
    (root / "stsbenchmark" / "sts-test.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def boxed_rows(output: str, label: str) -> list[list[str]]:
    """The cells of every table row of `output` whose first cell is `label`."""
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in output.splitlines()
            if line.startswith(f"│ {label} ")]


@pytest.mark.parametrize("width", [80, 60])
def test_sts_all_methods_fit_the_terminal(tmp_path, single_torch_thread, width):
    write_stsb(tmp_path)
    out = tmp_path / "sts.json"
    result = CliRunner().invoke(app, [
        "sts", "tiny-bert", "--data-dir", str(tmp_path), "--methods", "all", "--layers", "0,first-last-avg",
        "--device", "cpu", "--out", str(out),
    ], env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output
    assert max(len(line) for line in lines) <= width, "\n".join(line for line in lines if len(line) > width)
    headers = [cell.strip() for line in lines if line.startswith("┃ layer ") for cell in line.strip("┃").split("┃")]
    # the grid's column groups name every method once (plus none), then the best-per-layer table's header
    assert [h for h in headers if h != "layer"][: len(METHOD_NAMES) + 1] == ["none", *METHOD_NAMES]
    groups = [line for line in lines if line.startswith("layer x calibration (")]
    assert len(groups) >= 2 and groups[0].startswith(f"layer x calibration (1 of {len(groups)}: none to ")
    # every grid cell and every best-per-layer row agree with the records' means
    records = json.loads(out.read_text())["records"]
    means = {(layer, method): np.mean([r["spearman"] for r in records if r["layer"] == layer and r["method"] == method
                                       and r["aggregation"] == "all"])
             for layer in ("0", "first-last-avg") for method in ("none", *METHOD_NAMES)}
    for layer in ("0", "first-last-avg"):
        rows = boxed_rows(result.output, layer)
        grid = [cell for row in rows[:-1] for cell in row[1:]]
        assert grid == [f"{means[layer, m]:.1f}" for m in ("none", *METHOD_NAMES)]
        best = max(METHOD_NAMES, key=lambda m: means[layer, m])
        assert rows[-1] == [layer, f"{means[layer, 'none']:.1f}", best, f"{means[layer, best]:.1f}",
                            f"{means[layer, best] - means[layer, 'none']:+.1f}"]


def test_column_groups_cover_every_column_in_order_and_fit():
    header = ["layer", *(f"method{i}" * (1 + i % 3) for i in range(9))]
    rows = [["first-last-avg", *("-10.4" for _ in range(9))], ["0", *("1.0" for _ in range(9))]]
    for width in (30, 50, 80, 200):
        groups = column_groups(header, rows, width)
        assert [i for group in groups for i in group] == list(range(1, len(header)))
        for group in groups:
            # a boxed table: the left border, then each column's text, two spaces of padding and a border
            drawn = 1 + sum(max(len(header[i]), *(len(r[i]) for r in rows)) + 3 for i in (0, *group))
            assert drawn <= width or len(group) == 1
        # greedy: the first column of the next group would not have fitted
        for group, following in zip(groups, groups[1:]):
            drawn = 1 + sum(max(len(header[i]), *(len(r[i]) for r in rows)) + 3 for i in (0, *group, following[0]))
            assert drawn > width
    assert column_groups(header, rows, 1000) == [list(range(1, len(header)))]


def test_sts_help_lists_every_method():
    result = CliRunner().invoke(app, ["sts", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    text = re.sub(r"[\s│]+", " ", result.output)
    assert all(name in text for name in METHOD_NAMES)


def description_width(output: str) -> int:
    """The width of the narrowest description (help text) column of the help's Options panel: on each
    option's first line, from where its description starts to the panel's right border."""
    widths = []
    for line in output.splitlines():
        if line.startswith("│ --"):
            description = re.split(r"\s{2,}", line.strip("│ "))[-1]
            widths.append(len(line.rstrip()) - 1 - line.index(description))
    return min(widths)


@pytest.mark.parametrize("command", ["run", "analyze"])
def test_run_and_analyze_help_read_at_80_columns(command):
    import typer.main

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output and max(len(line) for line in lines) <= 80
    params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    for param in params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("--"):
                assert any(line.startswith(f"│ {name}") or f",{name} " in line for line in lines), name
    assert description_width(result.output) >= 30
    # each option's help is a few lines, not a screen: at most 5 lines an option (with its default)
    option_lines = [line for line in lines if line.startswith("│ ")]
    assert len(option_lines) <= 5 * len(params)
    assert "--mev-memory-mb" not in result.output or command == "analyze"


def test_model_help_names_every_named_model():
    from lmgeom.cli.extract import MODEL_HELP
    from lmgeom.encoders.named import NAMED_MODELS

    assert all(name in MODEL_HELP for name in NAMED_MODELS)
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert all(name in result.output for name in NAMED_MODELS)
    assert "MODEL on CORPUS" not in result.output


def test_limit_and_sample_have_default_folders_of_their_own(tmp_path, monkeypatch, single_torch_thread):
    """`lmgeom run`'s extraction (`extract_model` without `out`): each selection of sentences has its own
    folder, so the whole corpus after a --limit run is not refused as "holds another run"."""
    from lmgeom.stages.extraction import default_run_dir, extract_model

    words = "the man dog cat runs eats red blue small big house car a sings".split()
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(words) for _ in range(8)).capitalize() + "." for _ in range(12)]
    (tmp_path / "c.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    expected = {
        (("limit", 6),): ("runs/tiny-bert-c-limit6", sentences[:6]),
        (): ("runs/tiny-bert-c", sentences),
        (("sample", 4),): ("runs/tiny-bert-c-sample4", None),
        (("sample", 4), ("seed", 1)): ("runs/tiny-bert-c-sample4-seed1", None),
    }
    for options, (folder, texts) in expected.items():
        store = extract_model("tiny-bert", "c.txt", device="cpu", **dict(options))
        assert store.path.resolve() == (tmp_path / folder).resolve()
        stored = list(store.sentences["text"])
        assert stored == texts if texts is not None else (len(stored) == 4 and set(stored) <= set(sentences))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(Path(f).name for f, _ in expected.values())
    assert default_run_dir("models/my-bert", "sts:../data/STS", limit=60) == Path("runs/my-bert-sts-limit60")
    assert default_run_dir("minilm", "lee", sample=100, seed=3) == Path("runs/minilm-lee-sample100-seed3")


class NoteProgress:
    """Records every (stage, n, note) the driver reports."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self.events.append((stage, n, note))


@pytest.fixture
def small_store(tmp_path):
    from lmgeom.corpus import lee
    from lmgeom.store.arrays import write_store_from_arrays

    words = [[w.text for w in s.words] for s in lee().head(40).sentences]
    n_rows = sum(len(w) for w in words)
    rng = np.random.default_rng(0)
    hidden = [rng.standard_normal((n_rows, 8)).astype(np.float32) * np.arange(1, 9) + 3 for _ in range(2)]
    return write_store_from_arrays(tmp_path / "store", hidden, words)


def test_calibrate_reports_seconds_per_method(small_store):
    import time

    from lmgeom.stages.calibration import CalibrationOptions, calibrate_store, holds_fits, read_calibration

    methods = ["whitening", "abtt", "standardize"]
    progress = NoteProgress()
    started = time.perf_counter()
    result = calibrate_store(small_store, CalibrationOptions(methods=tuple(methods), layers=(0, 1)), progress=progress)
    elapsed = time.perf_counter() - started
    # a note names each layer's isotropy before calibration and each fit as it starts, then its time when done (one
    # count per fit)
    notes = [(n, note) for stage, n, note in progress.events if stage == "calibrate"]
    expected = []
    for fit in result.fits:
        if fit["method"] == methods[0]:  # a layer's isotropy before calibration, then its fits
            expected.append((0, f"isotropy of L{fit['layer']} before calibration"))
        expected += [(0, f"fitting L{fit['layer']} {fit['method']}"),
                     (1, f"L{fit['layer']} {fit['method']} fitted in {fit['seconds']:.1f} s")]
    assert notes == expected
    seconds = [fit["seconds"] for fit in result.fits]
    assert all(s >= 0 for s in seconds) and sum(seconds) <= elapsed
    document = read_calibration(small_store.path)
    assert [fit["seconds"] for fit in document["fits"]] == seconds
    assert "seconds" not in document["settings"]
    # a re-fit with the same options holds the same fits, whatever it took
    calibrate_store(small_store, CalibrationOptions(methods=("abtt",), layers=(0,)))
    assert holds_fits(small_store.path, result.fits)

    cli = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--methods", ",".join(methods), "--layers", "1"],
                             env={"COLUMNS": "80"}, terminal_width=80)
    assert cli.exit_code == 0, cli.output
    line = next(line for line in cli.output.splitlines() if line.startswith("fit seconds per method (layer 1): "))
    fits = {fit["method"]: fit["seconds"] for fit in read_calibration(small_store.path)["fits"] if fit["layer"] == 1}
    assert line.split(": ", 1)[1] == ", ".join(f"{m} {fits[m]:.1f} s" for m in methods)


def test_the_consoles_read_columns_when_they_print(monkeypatch):
    """rich fixes COLUMNS when a console is made; lmgeom's consoles follow the COLUMNS a command runs under."""
    from lmgeom.cli.common import VisibleConsole

    monkeypatch.setenv("COLUMNS", "80")
    console = VisibleConsole()
    monkeypatch.setenv("COLUMNS", "123")
    assert console.width == 123
    assert VisibleConsole(width=50).width == 50
