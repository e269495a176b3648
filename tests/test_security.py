"""No user file runs code when loaded (a crafted pickle `.kv` stays inert unless trusted), words
render as text in the report's charts, analysis workers die with their parent, and the scratch and
temporary files a killed or failed write leaves behind are removed by the next run."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from gensim.models import KeyedVectors
from typer.testing import CliRunner

from lmgeom.atomic import atomic_write, atomic_write_text, owner_tag
from lmgeom.cli.analyze import register
from lmgeom.evaluate import load_static_vectors
from lmgeom.report.figures import Chart, Series, plotly_figure
from lmgeom.report.html import Page
from lmgeom.stages import analyze_store, export_static_embeddings
from lmgeom.pipeline import render_report
from lmgeom.store import write_store_from_arrays

SENTENCES = [
    "the cat sat on the mat".split(),
    "the dog sat by the cat".split(),
    "a dog and a cat".split(),
    "the car passed the bus".split(),
]


class _Payload:
    """Unpickled, it creates the file `marker` (what a hostile `.kv` could do instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (Path(str(self.marker)),))  # type: ignore[return-value]


def crafted_pickle(path: Path, marker: Path) -> Path:
    path.write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    return path


def small_store(directory: Path) -> Path:
    rng = np.random.default_rng(0)
    n_rows = sum(len(s) for s in SENTENCES)
    write_store_from_arrays(directory, [rng.normal(size=(n_rows, 5)) for _ in range(2)], SENTENCES)
    return directory


def test_the_crafted_pickle_does_run_code_when_unpickled(tmp_path: Path) -> None:
    """The payload the next tests refuse is live: plain unpickling creates its file."""
    marker = tmp_path / "ran"
    pickle.loads(crafted_pickle(tmp_path / "evil.kv", marker).read_bytes())
    assert marker.exists()


@pytest.mark.parametrize("name", ["evil.kv", "evil.KV", "vectors.txt", "vectors.bin"])
def test_a_pickle_is_refused_without_trust_and_runs_nothing(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    path = crafted_pickle(tmp_path / name, marker)
    with pytest.raises(ValueError, match="`trust_pickle=True`") as error:
        load_static_vectors(path)
    assert "trust_pickle=True" in str(error.value) and "save_word2vec_format" in str(error.value)
    assert not marker.exists()


def test_the_cli_refuses_a_pickle_kv_before_distilling_and_names_the_option(tmp_path: Path) -> None:
    store = small_store(tmp_path / "store")
    marker = tmp_path / "ran"
    evil = crafted_pickle(tmp_path / "evil.kv", marker)
    app = typer.Typer()
    register(app)
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store), "--layer", "1", "--static-vectors", str(evil)],
                                 env={"COLUMNS": "200"})
    assert outcome.exit_code == 2, outcome.output
    assert "--trust-pickle" in outcome.output and "word2vec" in outcome.output
    assert not marker.exists()
    assert not (store / "static").exists()  # refused before anything was distilled or written
    with pytest.raises(ValueError, match="trust_pickle"):
        export_static_embeddings(store, layer=1, static_vectors=[evil])
    assert not marker.exists()


def test_a_trusted_kv_and_word2vec_text_and_binary_load_the_same_vectors(tmp_path: Path) -> None:
    vectors = KeyedVectors(vector_size=3)
    vectors.add_vectors(["cat", "dog", "Bus"], np.array([[1, 0, 0], [0, 1, 0.5], [0.25, -2, 3]], dtype=np.float32))
    vectors.save(str(tmp_path / "mine.kv"))
    vectors.save_word2vec_format(str(tmp_path / "mine.txt"), binary=False)
    vectors.save_word2vec_format(str(tmp_path / "mine.bin"), binary=True)
    for name, trust in (("mine.kv", True), ("mine.txt", False), ("mine.bin", False)):
        loaded = load_static_vectors(tmp_path / name, trust_pickle=trust)
        assert loaded.index_to_key == ["cat", "dog", "Bus"], name
        np.testing.assert_allclose(loaded.vectors, vectors.vectors, atol=1e-6 if name == "mine.txt" else 0)


def test_the_cli_compares_a_trusted_kv(tmp_path: Path) -> None:
    store = small_store(tmp_path / "store")
    vectors = KeyedVectors(vector_size=2)
    vectors.add_vectors(["cat", "dog", "car"], np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32))
    vectors.save(str(tmp_path / "mine.kv"))
    app = typer.Typer()
    register(app)
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store), "--layer", "1", "--min-contexts", "1",
                                       "--static-vectors", str(tmp_path / "mine.kv"), "--trust-pickle"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert "static: mine.kv" in outcome.output


# ---- words render as text in the report's charts ---------------------------------------------------

LINK = "<a href='https://x'>w</a>"
BOLD = '<b>bold</b> <span style="color:red">red</span> & co'


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def test_every_string_of_a_plotly_chart_is_escaped() -> None:
    chart = Chart("c", f"title {LINK}", f"model {BOLD}", f"x {LINK}", f"y {LINK}", [Series(LINK, [0.0, 1.0], [0.5, 0.25])])
    figure = plotly_figure(chart)
    layout = figure["layout"]
    caption = re.search(r"<figcaption>(.*)</figcaption>", Page("t", "s").chart(chart)).group(1)  # type: ignore[union-attr]
    assert caption == ('<span class="chart-title">title &lt;a href=&#x27;https://x&#x27;&gt;w&lt;/a&gt;</span>'
                       '<span class="chart-subtitle">model &lt;b&gt;bold&lt;/b&gt; &lt;span style=&quot;color:red&quot;&gt;'
                       'red&lt;/span&gt; &amp; co</span>')  # the title and subtitle: page text, escaped
    assert layout["xaxis"]["title"]["text"] == "x &lt;a href='https://x'&gt;w&lt;/a&gt;"
    assert layout["yaxis"]["title"]["text"] == "y &lt;a href='https://x'&gt;w&lt;/a&gt;"
    assert figure["data"][0]["name"] == "&lt;a href='https://x'&gt;w&lt;/a&gt;"
    tags = {tag for text in _strings(figure) for tag in re.findall(r"<\s*/?\s*([a-zA-Z]+)", text)}
    assert tags <= {"br", "sup"}  # only the chart's own markup


def hostile_run(directory: Path) -> Path:
    """An analysed run whose most frequent word is a link and whose model id is markup."""
    rng = np.random.default_rng(4)
    vocabulary = [LINK, "<b>bold</b>", "cat", "dog", "car", "bus", "tree"]
    sentences = [[vocabulary[i] for i in rng.choice(len(vocabulary), size=6, p=[0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1])]
                 for _ in range(40)]
    n_rows = sum(map(len, sentences))
    hidden = [rng.normal(size=(n_rows, 6)) + layer for layer in range(3)]
    store = write_store_from_arrays(directory, hidden, sentences, model_id=BOLD)
    analyze_store(store, min_contexts=2, n_samples=100, seed=0).write()
    render_report(directory, explorer_neighbours=3)
    return directory


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_run(tmp_path_factory.mktemp("hostile") / "run")


def test_a_report_escapes_words_and_names_in_its_charts(hostile: Path) -> None:
    run = hostile
    page = (run / "report.html").read_text()
    figures = json.loads(re.search(r"const LMGEOM_FIGURES = (\{.*?\});\n", page, re.S).group(1))  # type: ignore[union-attr]
    assert figures
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert len(captions) == len(figures) and all("&lt;b&gt;bold&lt;/b&gt;" in caption for caption in captions)
    for figure in figures.values():
        assert not [text for text in _strings(figure) if "<b>" in text or "<span" in text or "<a href" in text]
    explorer = json.loads((run / "explorer.json").read_text())["data"]
    assert explorer["words"][0] == LINK  # the word the explorer's own chart is titled with


def test_the_explorer_chart_shows_a_link_word_as_text_in_a_browser(hostile: Path) -> None:
    executable = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if executable is None:
        pytest.skip("no Chromium found (install it: `bash scripts/install.sh --test` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright  # a test dependency: missing, it fails rather than skips

    run = hostile
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto((run / "report.html").as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 1")
            page.fill("#explorer-word", LINK)
            page.wait_for_selector("#explorer-chart .scatterlayer")
            title = page.text_content("#explorer-result figcaption")
            assert title is not None and title.startswith(f'"{LINK}" across layers')
            assert BOLD in title  # the caption names the model
            page_titles = page.eval_on_selector_all("figure.chart-box figcaption", "nodes => nodes.map(n => n.textContent)")
            assert len(page_titles) >= 2 and all(BOLD in text for text in page_titles)
            # no markup rendered in any chart or its title: no links, no bold or styled pieces
            assert page.eval_on_selector_all(".js-plotly-plot svg a, figcaption a", "nodes => nodes.length") == 0
            assert page.eval_on_selector_all("figcaption b, figcaption span[style]", "nodes => nodes.length") == 0
            styled = page.eval_on_selector_all(".js-plotly-plot tspan[style]", "nodes => nodes.map(n => n.getAttribute('style'))")
            assert not [style for style in styled if "bold" in style or "red" in style], styled
            assert errors == []
        finally:
            browser.close()


# ---- analysis workers die with their parent -----------------------------------------------------

POOL_SCRIPT = textwrap.dedent("""
    import os, sys
    import lmgeom.engine.executors as executors
    from lmgeom.stages import analyze_store

    if __name__ == "__main__":
        executors.POOL_MIN_LAYER_VALUES = 0  # a pool even for this small store
        os.cpu_count = lambda: 8
        analyze_store(sys.argv[1], min_contexts=2, n_samples=100, mev_memory_mb=0.02, device="cpu", num_workers=2,
                      write_to=False)
""")

WATCH_SCRIPT = textwrap.dedent("""
    import multiprocessing, pathlib, sys, time
    from lmgeom.engine.workers import exit_when_parent_ends

    def child():
        exit_when_parent_ends(multiprocessing.parent_process())  # the portable half, without prctl
        pathlib.Path(sys.argv[1]).touch()  # watching
        time.sleep(120)

    if __name__ == "__main__":
        process = multiprocessing.get_context("spawn").Process(target=child)
        process.start()
        print(process.pid, flush=True)
        time.sleep(120)
""")


def _parent_of(pid: int) -> int | None:
    """The parent pid of a running process (None when it is gone or a zombie), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
    return None if state in ("Z", "X") else int(ppid)


def _children(pid: int) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and _parent_of(int(entry.name)) == pid]


def _wait_until_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := [pid for pid in pids if _parent_of(pid) is not None]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def pool_store(directory: Path, n_sentences: int = 1500) -> Path:
    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, 301)
    sentences = [[f"w{i}" for i in rng.choice(300, size=8, p=weights / weights.sum())] for _ in range(n_sentences)]
    n_rows = sum(map(len, sentences))
    write_store_from_arrays(directory, [rng.normal(size=(n_rows, 32)).astype(np.float32) for _ in range(4)], sentences)
    return directory


HOST = owner_tag().split("@", 1)[1]


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR (this process's and any it starts) made an empty folder of this test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def spooling_analysis(directory: Path) -> None:
    """An analysis whose MEV word groups go through a scratch folder (a small `mev_memory_mb`)."""
    store = pool_store(directory, n_sentences=200)
    analyze_store(store, min_contexts=2, n_samples=50, mev_memory_mb=0.01, layers=[1], write_to=False)


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes through /proc (Linux)")


@needs_proc
def test_killing_the_parent_of_an_analysis_pool_leaves_no_worker_and_the_next_run_no_scratch(tmp_path: Path,
                                                                                            scratch: Path) -> None:
    store = pool_store(tmp_path / "store")
    (tmp_path / "pool.py").write_text(POOL_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "pool.py"), str(store)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        # both workers past their initializer, inside a layer each (a worker still importing its libraries
        # when its parent dies ends too, once its bootstrap finds its parent's data cut short)
        while not (len(children := _children(parent.pid)) >= 3 and len(list(scratch.glob("lmgeom-mev-*"))) >= 2):
            assert parent.poll() is None, f"the analysis ended before it was killed: {parent.stdout.read()!r}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the pool did not start in 120 s"
            time.sleep(0.02)
        parent.kill()
        parent.wait()
    finally:
        if parent.poll() is None:
            parent.kill()
    # the workers and multiprocessing's resource tracker, all children of the killed process
    assert _wait_until_gone(children, 5) == []
    # killed mid-layer, the workers left their scratch folders, named for them; the next analysis removes them
    left = [folder.name for folder in scratch.glob("lmgeom-mev-*")]
    assert len(left) >= 2 and all(int(name.split("-")[2].split("@")[0]) in children for name in left), left
    spooling_analysis(tmp_path / "next")
    assert list(scratch.iterdir()) == []


@needs_proc
def test_a_worker_without_prctl_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    (tmp_path / "watch.py").write_text(WATCH_SCRIPT)
    watching = tmp_path / "watching"
    parent = subprocess.Popen([sys.executable, str(tmp_path / "watch.py"), str(watching)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while not watching.exists():
            assert time.monotonic() < deadline and _parent_of(child) == parent.pid, "the child did not start"
            time.sleep(0.02)
        parent.kill()
        parent.wait()
    finally:
        if parent.poll() is None:
            parent.kill()
    assert _wait_until_gone([child], 5) == []


# ---- what killed or failed writes leave behind ---------------------------------------------------

def test_the_next_analysis_removes_scratch_folders_of_ended_processes_only(tmp_path: Path, scratch: Path) -> None:
    pid = dead_pid()
    stale = scratch / f"lmgeom-mev-{pid}@{HOST}-k1ll3d_x"
    mine = scratch / f"lmgeom-mev-{os.getpid()}@{HOST}-running"
    parents = scratch / f"lmgeom-mev-{os.getppid()}@{HOST}-parent"
    elsewhere = scratch / f"lmgeom-mev-{pid}@other-host.example-abc"
    untagged = scratch / "lmgeom-mev-abc123"
    for folder in (stale, mine, parents, elsewhere, untagged):
        folder.mkdir()
        (folder / "group-1.rows").write_bytes(b"\0" * 64)
    spooling_analysis(tmp_path / "store")
    assert sorted(p.name for p in scratch.iterdir()) == sorted(p.name for p in (mine, parents, elsewhere, untagged))
    assert (mine / "group-1.rows").exists()


def _no_space(tmp: Path) -> None:
    with open(tmp, "wb") as handle:
        handle.write(b"half of it")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))


def test_an_atomic_write_that_fails_leaves_no_temporary_file_and_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out" / "results.json"
    atomic_write_text(target, "old")
    with pytest.raises(OSError) as error:
        atomic_write(target, _no_space)
    assert error.value.errno == errno.ENOSPC
    assert sorted(p.name for p in target.parent.iterdir()) == ["results.json"] and target.read_text() == "old"


def test_the_next_write_in_a_folder_removes_temporary_files_of_ended_writers(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    killed = folder / f".summary.json.{dead_pid()}@{HOST}.tmp"
    running = folder / f".report.html.{os.getppid()}@{HOST}.tmp"  # a live writer's: kept
    other_host = folder / f".summary.json.{dead_pid()}@elsewhere.tmp"
    for path in (killed, running, other_host):
        path.write_text("partial")
    atomic_write_text(folder / "calibration.json", "{}")
    assert sorted(p.name for p in folder.iterdir()) == sorted(["calibration.json", running.name, other_host.name])


def test_a_chunk_write_that_fails_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replace = os.replace

    def no_space(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
        if re.fullmatch(r"\d+\.partial", Path(source).name):  # the writer's raw chunk files (zarr's carry a uuid)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source))
        replace(source, destination)

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space"):
        small_store(tmp_path / "store")
    assert (tmp_path / "store").exists() and not list((tmp_path / "store").rglob("*.partial"))
