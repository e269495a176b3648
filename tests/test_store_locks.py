"""Writer safety of a store: `--overwrite` removes only an lmgeom store, a writer holds a lock on its
`--out` (a second writer is refused, a stale lock after kill -9 is taken over), and a store rewritten
under a reader is detected by its generation."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import extract
from lmgeom import rundir
from lmgeom.stages.analysis import analyze_store
from lmgeom.stages.calibration import CalibrationOptions, calibrate_store
from lmgeom.engine import AnalysisOptions
from lmgeom.stages.isotropy import IsotropyOptions, measure_isotropy
from lmgeom.stages.static import static_embeddings
from lmgeom.store import RepresentationStore, StoreExistsError, StoreLockedError, StoreWriter, write_store_from_arrays
from lmgeom.store import lock as store_lock
from lmgeom.store.layout import LOCK, META
from lmgeom.store.location import Location
from lmgeom.store.sharded import ShardedStoreWriter
from helpers import BANK_SENTENCES, RecordedProgress

SRC = Path(__file__).resolve().parents[1] / "src"
SETTINGS = {"model_id": "synthetic", "n_layers": 2, "dim": 3, "dtype": "float32"}
SHARDED = {**SETTINGS, "n_corpus_sentences": 4, "shard_sentences": 2}
SENTENCES = BANK_SENTENCES
runner = CliRunner()


def flat(output: str) -> str:
    return " ".join(output.split())


def user_folder(path: Path) -> dict[str, bytes]:
    """A folder of someone's own files (one named meta.json, as many data folders have); returns its contents."""
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("mine")
    (path / "sub" / "data.csv").write_text("a,b\n1,2\n")
    (path / META).write_text(json.dumps({"dataset": "my own"}))
    return contents(path)


def contents(path: Path) -> dict[str, bytes]:
    return {str(file.relative_to(path)): file.read_bytes() for file in sorted(path.rglob("*")) if file.is_file()}


def layers(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = sum(len(sentence) for sentence in SENTENCES)
    return [rng.normal(size=(n, 4)) + layer for layer in range(3)]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host that is not a writer."""
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


def write_lock(location: Location, **holder: Any) -> None:
    """lock.json as a writer of this host would leave it; `holder` overrides its fields."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
              "started": datetime.now().astimezone().isoformat(timespec="seconds"), **holder}
    location.write_json(record, LOCK)


# ---- --overwrite -----------------------------------------------------------------------------


def test_overwrite_refuses_a_folder_of_other_files_and_leaves_every_file(tmp_path):
    folder = tmp_path / "mine"
    before = user_folder(folder)
    for overwrite in (False, True):
        with pytest.raises(StoreExistsError) as raised:
            StoreWriter(folder, settings=SETTINGS, overwrite=overwrite)
        message = str(raised.value)
        assert "holds no lmgeom store (its meta.json is not one lmgeom wrote)" in message
        assert "meta.json, notes.txt, sub" in message and "--overwrite" not in message
        with pytest.raises(StoreExistsError, match="notes.txt") as raised:
            ShardedStoreWriter(Location.of(folder), settings=SHARDED, overwrite=overwrite)
        assert "--overwrite" not in str(raised.value)
        with pytest.raises(StoreExistsError, match="notes.txt"):
            write_store_from_arrays(folder, layers(0), SENTENCES, overwrite=overwrite)
        assert contents(folder) == before  # not a file changed, none added (no lock either)

    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    Location.of(url).write_bytes(b"mine", "notes.txt")
    with pytest.raises(StoreExistsError, match=r"holds no lmgeom store \(no meta.json\): it holds notes.txt") as raised:
        ShardedStoreWriter(Location.of(url), settings=SHARDED, overwrite=True)
    assert "--overwrite" not in str(raised.value)
    assert Location.of(url).listdir() == ["notes.txt"] and Location.of(url).read_bytes("notes.txt") == b"mine"


def test_cli_overwrite_on_a_folder_of_other_files_exits_2_and_keeps_them(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The bank of the river.\nThe bank raised rates.\n")
    folder = tmp_path / "mine"
    before = user_folder(folder)
    for command in (["extract", "tiny-bert", "--corpus", str(corpus), "--out", str(folder), "--overwrite"],
                    ["run", "--model", "tiny-bert", "--corpus", str(corpus), "--out", str(folder), "--overwrite"],
                    # refused before Ray starts
                    ["extract", "tiny-bert", "--corpus", str(corpus), "--out", str(folder), "--overwrite", "--engine", "ray"]):
        result = runner.invoke(app, command)
        output = flat(result.output)
        assert result.exit_code == 2, result.output
        output = output[output.index("error:"):]  # `run` announces its first step on stderr before it
        assert "is not empty and holds no lmgeom store" in output
        assert "notes.txt" in output and "--overwrite" not in output
        assert contents(folder) == before
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"  # a URL: the sharded writer
    Location.of(url).write_bytes(b"mine", "notes.txt")
    result = runner.invoke(app, ["extract", "tiny-bert", "--corpus", str(corpus), "--out", url, "--overwrite"])
    assert result.exit_code == 2 and "it holds notes.txt" in flat(result.output) and "--overwrite" not in flat(result.output)
    assert Location.of(url).listdir() == ["notes.txt"]


def test_overwrite_removes_a_store_whole_complete_or_interrupted(tmp_path):
    path = tmp_path / "store"
    first = write_store_from_arrays(path, layers(0), SENTENCES)
    (path / "contextuality.json").write_text("{}")  # a result written next to the store
    # the store layer alone knows only the store's files: a run's result is not its to remove
    with pytest.raises(StoreExistsError, match="contextuality.json"):
        write_store_from_arrays(path, layers(1), SENTENCES)
    assert (path / "contextuality.json").exists()
    # the driver's rule (what lmgeom extract and run pass) counts a run's results as lmgeom's
    second = write_store_from_arrays(path, layers(1), SENTENCES, foreign=rundir.foreign_entries)
    assert second.meta["generation"] != first.meta["generation"]
    assert not (path / "contextuality.json").exists() and not (path / LOCK).exists()
    np.testing.assert_array_equal(np.asarray(second.layer(2)[:]), layers(1)[2].astype(np.float32))

    # an interrupted store of other settings (2 layers of 3 dimensions) is replaced as well
    writer = StoreWriter(tmp_path / "interrupted", settings=SETTINGS)
    writer.close()
    assert sorted(os.listdir(tmp_path / "interrupted")) == ["layers", META]
    with pytest.raises(StoreExistsError, match="`overwrite=True`"):  # a store: the advice stands
        write_store_from_arrays(tmp_path / "interrupted", layers(0), SENTENCES, overwrite=False)
    store = write_store_from_arrays(tmp_path / "interrupted", layers(0), SENTENCES)
    assert store.layers == [0, 1, 2] and store.dim == 4

    # a removal cut short leaves the mark of no run, which only --overwrite replaces
    (path / "layers").mkdir(exist_ok=True)
    (path / META).write_text(json.dumps({"lmgeom_version": "0", "generation": "g", "complete": False, "settings": {}}))
    with pytest.raises(StoreExistsError, match=r"removal \(`overwrite=True`\) was interrupted"):
        StoreWriter(path, settings=SETTINGS)
    with pytest.raises(ValueError, match="unfinished extraction"):
        RepresentationStore.open(path)
    assert write_store_from_arrays(path, layers(2), SENTENCES).meta["complete"]


def test_overwrite_of_a_store_beside_a_users_files_refuses_naming_them_and_removes_nothing(tmp_path):
    path = tmp_path / "store"
    first = write_store_from_arrays(path, layers(0), SENTENCES)
    (path / "NOTES.md").write_text("mine")
    (path / "mydata").mkdir()  # an empty folder of the user's
    (path / "figures").mkdir()
    (path / "figures" / "chart.png").write_bytes(b"png")  # what lmgeom writes next to a store
    (path / "sts.json").write_text(json.dumps({"kind": "sts"}))  # STS results, and their table
    (path / "sts.csv").write_text("a\n1\n")
    before = contents(path)
    with pytest.raises(StoreExistsError) as raised:
        write_store_from_arrays(path, layers(1), SENTENCES, overwrite=True, foreign=rundir.foreign_entries)
    assert "NOTES.md, mydata;" in str(raised.value) and "nothing was removed" in str(raised.value)
    assert "figures" not in str(raised.value) and "sts" not in str(raised.value)
    assert contents(path) == before and (path / "mydata").is_dir() and not (path / LOCK).exists()
    assert RepresentationStore.open(path).meta["generation"] == first.meta["generation"]

    # a hand-made or copied meta.json, as lmgeom writes one, protects nothing else either
    copied = tmp_path / "copied"
    copied.mkdir()
    (copied / META).write_bytes((path / META).read_bytes())
    (copied / "NOTES.md").write_text("mine")
    with pytest.raises(StoreExistsError, match="NOTES.md"):
        write_store_from_arrays(copied, layers(0), SENTENCES)
    assert sorted(os.listdir(copied)) == ["NOTES.md", META]

    # once the user's files are gone, the store goes with what lmgeom wrote next to it
    (path / "NOTES.md").unlink()
    (path / "mydata").rmdir()
    second = write_store_from_arrays(path, layers(1), SENTENCES, foreign=rundir.foreign_entries)
    assert second.meta["generation"] != first.meta["generation"]
    assert not (path / "figures").exists() and not (path / "sts.json").exists() and not (path / "sts.csv").exists()


def test_cli_overwrite_of_an_extracted_store_beside_a_users_files_exits_2_and_keeps_them(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The bank of the river.\nThe bank raised rates.\n")
    folder = tmp_path / "st"
    command = ["extract", "tiny-bert", "--corpus", str(corpus), "--out", str(folder), "--overwrite"]
    assert runner.invoke(app, command).exit_code == 0
    (folder / "NOTES.md").write_text("mine")
    (folder / "mydata").mkdir()
    before = contents(folder)
    result = runner.invoke(app, command)
    output = flat(result.output)
    assert result.exit_code == 2 and output.startswith("error:"), result.output
    assert "NOTES.md, mydata" in output and "nothing was removed" in output and "Traceback" not in result.output
    assert contents(folder) == before and (folder / "mydata").is_dir()


def test_overwrite_of_a_sharded_store_on_a_url_removes_it_whole():
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    location = Location.of(url)
    with ShardedStoreWriter(location, settings=SHARDED) as writer:
        location.write_bytes(b"x", "shards", "000000-abc", "layers", "0")
        first = writer.generation
    with pytest.raises(StoreExistsError, match="made with another model.*pass `overwrite=True`"):
        ShardedStoreWriter(location, settings={**SHARDED, "dim": 5})
    with ShardedStoreWriter(location, settings={**SHARDED, "dim": 5}, overwrite=True) as writer:
        assert location.listdir() == [LOCK, META] and writer.generation != first
        assert location.read_json(META)["settings"]["dim"] == 5
    assert location.listdir() == [META]


# ---- the lock ----------------------------------------------------------------------------------


def test_a_lock_of_a_live_process_refuses_a_second_writer_and_a_dead_ones_is_taken_over(tmp_path, sleeper):
    path = tmp_path / "store"
    path.mkdir()
    write_lock(Location.of(path), pid=sleeper.pid)
    with pytest.raises(StoreLockedError, match=re.escape(f"being written by another process (host {socket.gethostname()}, pid {sleeper.pid}, started ")):
        StoreWriter(path, settings=SETTINGS)
    assert os.listdir(path) == [LOCK]  # refused before anything was written
    result = runner.invoke(app, ["extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", str(path)])
    assert result.exit_code == 2 and f"pid {sleeper.pid}" in flat(result.output)

    # the same pid, now a process started after the lock was taken: the lock's process is gone
    write_lock(Location.of(path), pid=sleeper.pid, started="2001-01-01T00:00:00+00:00")
    StoreWriter(path, settings=SETTINGS).close()

    write_lock(Location.of(path), pid=sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    with StoreWriter(path, settings=SETTINGS) as writer:  # the stale lock is taken over
        holder = json.loads((path / LOCK).read_text())
        assert holder["pid"] == os.getpid() and holder["token"] == writer.lock.holder["token"]
        with pytest.raises(StoreLockedError, match="another writer of this process"):
            StoreWriter(path, settings=SETTINGS)
        with pytest.raises(ValueError, match=re.escape(f"is being written (host {socket.gethostname()}, pid {os.getpid()}, ")):
            RepresentationStore.open(path)
    assert not (path / LOCK).exists()
    with pytest.raises(ValueError, match="closed"):
        writer.commit([], [])


def test_a_lock_from_another_host_is_refused_naming_the_file_to_delete(tmp_path):
    path = tmp_path / "store"
    path.mkdir()
    write_lock(Location.of(path), host="elsewhere", pid=1)
    with pytest.raises(StoreLockedError, match=f"host elsewhere, pid 1.*if it does not, delete {re.escape(str(path / LOCK))}"):
        StoreWriter(path, settings=SETTINGS)


def test_the_lock_is_released_when_a_write_fails(tmp_path):
    writer = StoreWriter(tmp_path / "s", settings=SETTINGS)
    writer.close()
    with pytest.raises(StoreExistsError):
        StoreWriter(tmp_path / "s", settings={**SETTINGS, "dim": 4})  # refused under the lock, which it releases
    assert not (tmp_path / "s" / LOCK).exists()
    with pytest.raises(ValueError, match="NaN"):
        write_store_from_arrays(tmp_path / "nan", [np.full((sum(map(len, SENTENCES)), 2), np.nan)], SENTENCES)
    assert not (tmp_path / "nan" / LOCK).exists()


def test_a_memory_lock_refuses_a_second_writer_until_the_first_closes():
    location = Location.of(f"memory://lmgeom-tests/{uuid.uuid4().hex}")
    first = ShardedStoreWriter(location, settings=SHARDED)
    with pytest.raises(StoreLockedError, match="another writer of this process"):
        ShardedStoreWriter(location, settings=SHARDED)
    first.close()
    with ShardedStoreWriter(location, settings=SHARDED):
        assert json.loads(location.read_bytes(LOCK))["pid"] == os.getpid()
    assert LOCK not in location.listdir()


def test_on_an_object_store_without_exclusive_create_a_lock_overwritten_while_settling_backs_off(monkeypatch):
    location = Location.of(f"memory://lmgeom-tests/{uuid.uuid4().hex}")
    monkeypatch.setattr(store_lock, "_creates_exclusively", lambda location: False)
    intruder = {"host": "elsewhere", "pid": 7, "started": "2001-01-01T00:00:00+00:00", "token": "theirs"}
    # another writer's PUT lands while this one waits to read its lock back
    monkeypatch.setattr(store_lock, "time", SimpleNamespace(sleep=lambda seconds: location.write_json(intruder, LOCK)))
    with pytest.raises(StoreLockedError, match="host elsewhere, pid 7"):
        ShardedStoreWriter(location, settings=SHARDED)
    assert location.read_json(LOCK)["token"] == "theirs" and META not in location.listdir()
    monkeypatch.setattr(store_lock, "time", SimpleNamespace(sleep=lambda seconds: None))
    location.remove(LOCK)
    with ShardedStoreWriter(location, settings=SHARDED):  # read back as its own: it holds the lock
        assert location.read_json(LOCK)["pid"] == os.getpid()


_WRITER = """
    import sys, time
    from pathlib import Path
    from lmgeom.corpus import load_corpus
    from lmgeom.encoders.registry import load_encoder
    from lmgeom.stages import extract

    class StopAfterFirstChunk:
        def start(self, stage, total, *, unit="items"):
            pass

        def advance(self, stage, n=1, *, note=""):
            Path(sys.argv[2]).write_text("committed")
            time.sleep(300)  # killed here

    extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=40), sys.argv[1], chunk_sentences=8,
            sort_window=8, progress=StopAfterFirstChunk())
"""


def test_a_second_extraction_is_refused_while_the_first_runs_and_resumes_after_kill_9(tmp_path):
    out, ready = tmp_path / "run", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "stderr", "wb") as stderr:
        first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(out), str(ready)], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            assert first.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "the first writer did not commit a chunk in time"
            time.sleep(0.2)
        encoder, corpus = load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=40)
        with pytest.raises(StoreLockedError, match=f"pid {first.pid}, started "):
            extract(encoder, corpus, out, chunk_sentences=8)
        with pytest.raises(ValueError, match=re.escape(f"is being written (host {socket.gethostname()}, pid {first.pid}, ")):
            RepresentationStore.open(out)
        result = runner.invoke(app, ["extract", "tiny-bert", "--corpus", "lee", "--limit", "40", "--chunk-sentences", "8",
                                     "--out", str(out), "--overwrite"])  # not even --overwrite takes the store from a live writer
        assert result.exit_code == 2 and f"pid {first.pid}" in flat(result.output) and (out / "progress.json").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert json.loads((out / LOCK).read_text())["pid"] == first.pid  # left behind by the killed writer

    notes = RecordedProgress()
    resumed = extract(encoder, corpus, out, chunk_sentences=8, sort_window=8, progress=notes)
    assert notes.notes[0] == "resumed" and len(notes.notes) == 1 + 4  # chunk 1 of 5 was kept; 4 written now
    assert not (out / LOCK).exists() and resumed.meta["complete"]
    once = extract(encoder, corpus, tmp_path / "once", chunk_sentences=8, sort_window=8)
    for layer in once.layers:
        np.testing.assert_allclose(np.asarray(resumed.layer(layer)[:]), np.asarray(once.layer(layer)[:]), rtol=0, atol=1e-6)
    assert resumed.tokens.equals(once.tokens) and resumed.vocab.equals(once.vocab)


# ---- generation --------------------------------------------------------------------------------


def test_a_store_rewritten_under_a_reader_is_detected_by_every_step_that_reads_layers(tmp_path):
    path = tmp_path / "store"
    opened = write_store_from_arrays(path, layers(0), SENTENCES)
    opened.check_unchanged()
    before = opened.meta["generation"]
    analyze_store(opened, min_contexts=2)  # unchanged: no error
    rewritten = write_store_from_arrays(path, layers(1), SENTENCES)  # --overwrite
    after = rewritten.meta["generation"]
    assert after != before and len(after) == 32
    expected = f"was rewritten while it was being read \\(generation {before} → {after}\\); re-run the command"
    with pytest.raises(ValueError, match=expected):
        opened.check_unchanged()
    with pytest.raises(ValueError, match=expected):
        analyze_store(opened, min_contexts=2)
    with pytest.raises(ValueError, match=expected):
        measure_isotropy(opened, IsotropyOptions(AnalysisOptions(isotropy_clusters=2)), write=False)
    with pytest.raises(ValueError, match=expected):
        calibrate_store(opened, CalibrationOptions(methods=("whitening",), layers=(1,)), save=False)
    with pytest.raises(ValueError, match=expected):
        static_embeddings(opened, layer=1, min_contexts=2)
    rewritten.check_unchanged()

    # a store being rewritten (incomplete, or gone) is not the one opened either
    writer = StoreWriter(path, settings=SETTINGS, overwrite=True)
    with pytest.raises(ValueError, match=f"generation {after} → {writer.generation}"):
        rewritten.check_unchanged()
    writer.close()
    for name in os.listdir(path):
        Location.of(path).remove(name)
    with pytest.raises(ValueError, match=r"→ none \(removed\)"):
        rewritten.check_unchanged()
