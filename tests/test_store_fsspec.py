"""Stores on fsspec URLs (memory://, file://): written through the sharded commit protocol, read and
analysed without a local copy, and readable after a crash between a part and its manifest."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
from fsspec.implementations.memory import MemoryFileSystem
import numpy as np
import pandas as pd
import pytest

from lmgeom.corpus import load_corpus
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import extract
from lmgeom.stages.analysis import analyze_store
from lmgeom.store import RepresentationStore
from lmgeom.store.location import Location
from lmgeom.store.sharded import SHARDS, ShardPartWriter

from helpers import CrashingEncoder, assert_same_store

CHUNK = 8


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("lee", limit=40)


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return load_encoder("tiny-bert", device="cpu")


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory, encoder: Encoder, corpus: Corpus) -> RepresentationStore:
    return extract(encoder, corpus, tmp_path_factory.mktemp("local") / "run", chunk_sentences=CHUNK)


def memory_url() -> str:
    return f"memory://lmgeom-tests/{uuid.uuid4().hex}"


def test_memory_store_equals_the_local_store_and_is_analysed_in_place(local_store, encoder, corpus, tmp_path):
    url = memory_url()
    remote = extract(encoder, corpus, url, chunk_sentences=CHUNK)
    assert remote.url == url and remote.meta["layout"] == "sharded" and len(remote.meta["shards"]) > 1
    # the same encoder on the same chunks: the same vectors, read back through fsspec
    assert_same_store(local_store, remote, atol=1e-6)
    with pytest.raises(ValueError, match="not a local folder"):
        remote.path
    # analysed without copying it locally; a local copy of the same bytes gives the same numbers
    fs = fsspec.filesystem("memory")
    fs.get(Location.of(url).root + "/", str(tmp_path / "copy"), recursive=True)
    copy = RepresentationStore.open(tmp_path / "copy")
    assert_same_store(copy, remote, atol=0)
    in_place, local = analyze_store(url, min_contexts=2), analyze_store(copy, min_contexts=2)
    assert in_place.store_path == url
    pd.testing.assert_frame_equal(in_place.layers, local.layers, rtol=1e-12, atol=1e-12)
    pd.testing.assert_frame_equal(in_place.words, local.words, rtol=1e-12, atol=1e-12)


def test_cli_writes_and_analyses_a_store_on_a_url(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    url = memory_url()
    runner = CliRunner()
    extracted = runner.invoke(app, ["extract", "tiny-gpt2", "--corpus", "lee", "--limit", "30", "--out", url, "--device", "cpu"])
    assert extracted.exit_code == 0, extracted.output
    analysed = runner.invoke(app, ["analyze", url, "--min-contexts", "2"])
    assert analysed.exit_code == 0, analysed.output
    document = json.loads(Location.of(url).read_bytes("contextuality.json"))
    store = RepresentationStore.open(url)
    expected = analyze_store(store, min_contexts=2)
    written = pd.DataFrame(document["records"]).astype({"raw": float})
    np.testing.assert_allclose(written["raw"].to_numpy(), expected.layers["raw"].to_numpy(), rtol=1e-12, equal_nan=True)
    # file:// URLs are local folders
    local = runner.invoke(app, ["analyze", url, "--min-contexts", "2", "--out", (tmp_path / "results").as_uri()])
    assert local.exit_code == 0, local.output
    assert (tmp_path / "results" / "contextuality.json").is_file()


def test_a_crash_between_part_and_manifest_leaves_a_readable_store(local_store, encoder, corpus):
    url = memory_url()
    location = Location.of(url)
    crash_at = 3 * CHUNK + 2  # inside the second chunk of shard 1 (two chunks per shard of 16)
    crashing = CrashingEncoder(encoder, crash_at=crash_at)
    with pytest.raises(KeyboardInterrupt):
        extract(crashing, corpus, url, chunk_sentences=CHUNK, sort_window=CHUNK)  # a shard part appended chunk by chunk
    shard_sentences = int(location.read_json("meta.json")["shard_sentences"])
    assert shard_sentences == 2 * CHUNK
    # shard 0 committed; shard 1's part holds its first chunk's rows but no manifest names it
    assert location.listdir(SHARDS)[0].startswith("000000-") and "000000.json" in location.listdir(SHARDS)
    assert "000001.json" not in location.listdir(SHARDS)
    assert any(name.startswith("000001-") for name in location.listdir(SHARDS))
    with pytest.raises(ValueError, match="unfinished extraction"):
        RepresentationStore.open(url)

    # the resume skips shard 0, writes shard 1 afresh, and removes the part no manifest names
    resuming = CrashingEncoder(encoder, crash_at=None)
    store = extract(resuming, corpus, url, chunk_sentences=CHUNK)
    assert resuming.chunks == list(range(shard_sentences, len(corpus), CHUNK))
    assert sorted(location.listdir(SHARDS)) == sorted([entry["part"] for entry in store.meta["shards"]]
                                                      + [f"{k:06d}.json" for k in range(len(store.meta["shards"]))])
    assert_same_store(local_store, store, atol=1e-6)

    # a complete store: another attempt at shard 1 crashes after writing rows, before its manifest;
    # readers see only the parts the manifest names
    part = ShardPartWriter(location, 1, first_sentence=shard_sentences, n_layers=encoder.n_layers, dim=encoder.dim,
                           dtype="float32")
    part.append(encoder.encode(corpus.sentences[:CHUNK]), [s.text for s in corpus.sentences[:CHUNK]])
    location.write_bytes(b"half a parq", SHARDS, part.part, "tokens.parquet")
    assert_same_store(local_store, RepresentationStore.open(url), atol=1e-6)


def test_location_keeps_urls_and_names_the_missing_filesystem(tmp_path):
    local = Location.of((tmp_path / "a").as_uri())
    assert local.is_local and local.local_path == tmp_path / "a"
    memory = Location.of("memory://bucket/run/")
    assert memory.child("layers", "0").url == "memory://bucket/run/layers/0" and not memory.is_local
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="s3fs"):
            Location.of("s3://bucket/run")


def test_writing_into_a_folder_holding_something_else_is_refused(encoder, corpus):
    url = memory_url()
    Location.of(url).write_bytes(b"x", "notes.txt")
    with pytest.raises(ValueError, match="not empty and holds no lmgeom store"):
        extract(encoder, corpus, url, chunk_sentences=CHUNK)


def test_ray_options_without_the_ray_engine_are_refused(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    outcome = CliRunner().invoke(app, ["extract", "tiny-bert", "--limit", "5", "--out", str(tmp_path / "x"), "--num-workers", "2"])
    assert outcome.exit_code == 2 and "apply to --engine ray" in " ".join(outcome.output.split())
    outcome = CliRunner().invoke(app, ["analyze", str(tmp_path / "x"), "--engine", "spark"])
    assert outcome.exit_code == 2


# ---- an object store that stops answering ----------------------------------------------------------

def endpoint_error() -> Exception:
    """What s3fs raises when its endpoint does not answer: botocore's EndpointConnectionError (an error of
    that name where botocore is not installed: `is_transient` goes by the name)."""
    try:
        from botocore.exceptions import EndpointConnectionError
    except ImportError:
        return type("EndpointConnectionError", (Exception,), {})('Could not connect to the endpoint URL: "http://127.0.0.1:9/"')
    return EndpointConnectionError(endpoint_url="http://127.0.0.1:9/")


class FlakyFileSystem(MemoryFileSystem):
    """An in-memory object store whose endpoint fails the next `failures` calls that touch it (then answers)."""

    protocol = "flaky"
    failures = 0
    calls = 0

    def _touch_endpoint(self) -> None:
        FlakyFileSystem.calls += 1
        if FlakyFileSystem.failures > 0:
            FlakyFileSystem.failures -= 1
            raise endpoint_error()

    def cat_file(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._touch_endpoint()
        return super().cat_file(path, *args, **kwargs)

    def pipe_file(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._touch_endpoint()
        return super().pipe_file(path, *args, **kwargs)

    def exists(self, path, **kwargs):  # type: ignore[no-untyped-def]
        self._touch_endpoint()
        return super().exists(path, **kwargs)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The flaky:// protocol, retries without waiting: the waits asked for."""
    from lmgeom.store import location

    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    FlakyFileSystem.failures = FlakyFileSystem.calls = 0
    waits: list[float] = []
    monkeypatch.setattr(location.time, "sleep", waits.append)
    return waits


def test_an_object_store_that_fails_a_few_times_is_retried_with_backoff(flaky: list[float]) -> None:
    from lmgeom.store import location as location_module

    where = Location.of(f"flaky://bucket/{uuid.uuid4().hex}")
    FlakyFileSystem.failures = 2
    where.write_json({"a": 1}, "meta.json")
    assert flaky == list(location_module.RETRY_DELAYS[:2])  # waited twice, each longer
    FlakyFileSystem.failures = 3
    assert where.read_json("meta.json") == {"a": 1}
    assert flaky[2:] == list(location_module.RETRY_DELAYS[:3])


def test_an_object_store_that_stays_down_is_one_line_saying_how_to_resume(flaky: list[float], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lmgeom.cli.main import app
    from lmgeom.errors import Unavailable
    from lmgeom.store import location as location_module

    url = f"flaky://bucket/{uuid.uuid4().hex}"
    Location.of(url).write_json({"a": 1}, "meta.json")
    FlakyFileSystem.failures, FlakyFileSystem.calls = 10**6, 0
    with pytest.raises(Unavailable, match="run the same command again to resume") as raised:
        Location.of(url).read_json("meta.json")
    tries = len(location_module.RETRY_DELAYS) + 1
    assert FlakyFileSystem.calls == tries and f"in {tries} tries" in str(raised.value) and url in str(raised.value)
    assert "EndpointConnectionError" in str(raised.value)
    result = CliRunner().invoke(app, ["analyze", url])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and output.startswith("error:") and "Traceback" not in result.output
    assert "did not answer" in output and "run the same command again to resume" in output
