"""Extraction and analysis on a local Ray cluster (one for the module: Ray starts once).

The Ray engine's store equals the local engine's (tables exactly; vectors to 1e-5, since each worker
batches and threads on its own), the driver streams the corpus holding only the shards in flight,
merged analysis states equal the one-pass analysis to 1e-12 (from Python and `lmgeom analyze
--engine ray`), and a worker killed mid-shard gets its shard redone: by a restarted actor within the
run, or on resume."""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from lmgeom.corpus import load_corpus  # noqa: E402
from lmgeom.corpus.corpus import Corpus, Sentence  # noqa: E402
from lmgeom.encoders.base import EncodedSentence  # noqa: E402
from lmgeom.encoders.registry import load_encoder  # noqa: E402
from lmgeom.stages import extract  # noqa: E402
from lmgeom.stages.analysis import analyze_store  # noqa: E402
from lmgeom.stages.distributed import extract_sharded  # noqa: E402
from lmgeom.engine import AnalysisOptions, plan_analysis  # noqa: E402
from lmgeom.store import RepresentationStore  # noqa: E402
from lmgeom.store.location import Location  # noqa: E402
from lmgeom.store.sharded import SHARDS  # noqa: E402

from helpers import ReadAhead, assert_same_store  # noqa: E402

CHUNK = 8
SHARD = 16  # 48 sentences: shards [0, 16), [16, 32), [32, 48) of two chunks each


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray import cloudpickle

    # the actors build this module's encoders; workers cannot import the test module by name
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("lee", limit=48)


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory, corpus: Corpus) -> RepresentationStore:
    return extract(load_encoder("tiny-bert", device="cpu"), corpus, tmp_path_factory.mktemp("local") / "run", chunk_sentences=CHUNK)


@pytest.fixture(scope="module")
def ray_store(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> RepresentationStore:
    """`lmgeom extract --engine ray` (through `extract_model`), with the corpus spec streamed: loading
    it whole fails the extraction."""
    from typer.testing import CliRunner

    import lmgeom.stages.extraction as extraction
    from lmgeom.cli.main import app

    def whole_corpus_loaded(*args: Any, **kwargs: Any) -> Corpus:
        raise AssertionError("the Ray engine must stream the corpus, not load it whole")

    out = tmp_path_factory.mktemp("ray") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extraction, "load_corpus", whole_corpus_loaded)
        outcome = CliRunner().invoke(app, ["extract", "tiny-bert", "--corpus", "lee", "--limit", "48", "--out", str(out),
                                           "--device", "cpu", "--engine", "ray", "--num-workers", "2",
                                           "--chunk-sentences", str(CHUNK), "--shard-sentences", str(SHARD)])
    assert outcome.exit_code == 0, (outcome.output, outcome.exception)
    return RepresentationStore.open(out)


class KillingEncoder:
    """The tiny model in a Ray actor whose process dies (os._exit) on reaching sentence `kill_at`,
    the first time only (a marker file remembers it across the restarted actor)."""

    def __init__(self, kill_at: int, marker: str) -> None:
        self.inner = load_encoder("tiny-bert", device="cpu")
        self.kill_at, self.marker = kill_at, marker
        self.model_id, self.n_layers, self.dim = self.inner.model_id, self.inner.n_layers, self.inner.dim

    def settings(self) -> dict[str, Any]:
        return self.inner.settings()

    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0) -> list[EncodedSentence]:
        if first_index <= self.kill_at < first_index + len(sentences) and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        return self.inner.encode(sentences, first_index=first_index)


def test_ray_extraction_with_two_workers_equals_the_local_engine(ray_store, local_store):
    """The Ray engine's store (extracted from the corpus spec, streamed: see `ray_store`) equals the local one."""
    assert ray_store.meta["layout"] == "sharded"
    assert [(s["first_sentence"], s["n_sentences"]) for s in ray_store.meta["shards"]] == [(0, 16), (16, 16), (32, 16)]
    assert_same_store(local_store, ray_store, atol=1e-5)
    # word ids are global: one vocabulary over all shards, in the local engine's order
    assert ray_store.tokens["word_id"].max() == len(ray_store.vocab) - 1


def test_the_driver_streams_the_corpus_holding_only_the_shards_in_flight(cluster, corpus, local_store, tmp_path):
    reader = ReadAhead([s.text for s in corpus])
    store = extract_sharded(partial(load_encoder, "tiny-bert", device="cpu"), reader.stream(corpus.name, corpus.source),
                            tmp_path / "streamed", engine="ray", num_workers=2, chunk_sentences=CHUNK, shard_sentences=CHUNK,
                            progress=reader.progress())
    # a counting pass, then six shards of 8 handed to 2 workers: the driver reads the next shard only
    # when a worker is free, so it never holds more than 2 shards' sentences (the corpus has 48)
    assert len(reader.passes) == 2 and reader.passes[0] == len(corpus)
    assert CHUNK < reader.passes[1] <= 2 * CHUNK
    assert_same_store(local_store, store, atol=1e-5)


def test_cli_analyze_on_ray_gives_the_local_engine_numbers(ray_store, local_store, tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    outcome = CliRunner().invoke(app, ["analyze", str(ray_store.path), "--engine", "ray", "--num-workers", "2",
                                       "--min-contexts", "2", "--mev-memory-mb", "0.05", "--out", str(tmp_path / "ray")])
    assert outcome.exit_code == 0, outcome.output
    written = json.loads((tmp_path / "ray" / "contextuality.json").read_text())
    on_ray = pd.DataFrame(written["records"]).astype({"raw": float})
    # the same store analysed in this process: float64 rounding apart
    same_store = analyze_store(ray_store, min_contexts=2, mev_memory_mb=0.05).layers
    np.testing.assert_allclose(on_ray["raw"].to_numpy(), same_store["raw"].to_numpy(), rtol=1e-12, atol=1e-12, equal_nan=True)
    # the local engine's own store (extracted in one process): its vectors agree to 1e-5
    local = analyze_store(local_store, min_contexts=2, mev_memory_mb=0.05).layers
    assert list(on_ray["metric"]) == list(local["metric"]) and list(on_ray["layer"]) == list(local["layer"])
    assert np.isfinite(on_ray["raw"]).sum() > 20
    np.testing.assert_allclose(on_ray["raw"].to_numpy(), local["raw"].to_numpy(), rtol=0, atol=1e-4, equal_nan=True)


def test_merged_ray_analysis_states_equal_the_local_analysis(ray_store):
    options = AnalysisOptions(min_contexts=2, mev_memory_mb=0.025)  # groups planned on float32 rows
    plan, _ = plan_analysis(ray_store, options)
    assert plan.n_groups >= 3  # per-word state split by word group: no task holds every word
    on_ray = analyze_store(ray_store, options, engine="ray", num_workers=2, row_parts=3)
    local = analyze_store(ray_store, min_contexts=2, mev_memory_mb=0.025)
    pd.testing.assert_frame_equal(on_ray.layers, local.layers, rtol=0, atol=1e-12)
    pd.testing.assert_frame_equal(on_ray.words, local.words, rtol=0, atol=1e-12)
    norms = on_ray.counts.pop("mean_norm_by_layer"), local.counts.pop("mean_norm_by_layer")
    np.testing.assert_allclose(list(norms[0].values()), list(norms[1].values()), rtol=1e-12)
    assert on_ray.counts == local.counts


def test_a_killed_worker_shard_is_redone(cluster, corpus, local_store, tmp_path):
    # within the run: the actor restarts and its shard is encoded again
    marker = tmp_path / "killed-once"
    store = extract_sharded(partial(KillingEncoder, 20, str(marker)), corpus, tmp_path / "retried", engine="ray",
                            chunk_sentences=CHUNK, shard_sentences=SHARD, num_workers=2, max_retries=2)
    assert marker.exists()
    assert_same_store(local_store, store, atol=1e-5)

    # without retries the run stops; the re-run skips the finished shards and redoes the killed one
    marker = tmp_path / "killed-again"
    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="shard 1 .*re-run the same command to resume"):
        extract_sharded(partial(KillingEncoder, 20, str(marker)), corpus, out, engine="ray",
                        chunk_sentences=CHUNK, shard_sentences=SHARD, num_workers=2, max_retries=0)
    location = Location.of(out)
    assert "000001.json" not in location.listdir(SHARDS)
    with pytest.raises(ValueError, match="unfinished extraction"):
        RepresentationStore.open(out)
    before = {name: location.read_json(SHARDS, name) for name in location.listdir(SHARDS) if name.endswith(".json")}
    # with another number of workers: the run keeps its shards
    resumed = extract_sharded(partial(KillingEncoder, 20, str(marker)), corpus, out, engine="ray",
                              chunk_sentences=CHUNK, num_workers=1, max_retries=0)
    assert resumed.meta["shard_sentences"] == SHARD
    parts = {entry["part"][:6]: entry["part"] for entry in resumed.meta["shards"]}
    for name, manifest in before.items():  # finished shards were kept, not rewritten
        assert parts[name[:6]] == manifest["part"]
    assert_same_store(local_store, resumed, atol=1e-5)
