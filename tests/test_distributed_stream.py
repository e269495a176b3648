"""Sharded extraction streams its corpus (never held whole: the driver reads ahead of the finished
shards by at most the shards in flight), writes the store a corpus in memory gives, and stops when
the corpus changes under it; `lmgeom run --out URL`."""

from __future__ import annotations

import json
import uuid
from typing import Iterator

import pandas as pd
import pytest

from lmgeom.corpus import Corpus, CorpusStream, load_corpus, open_corpus
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import extract
from lmgeom.pipeline import run
from lmgeom.stages.distributed import extract_sharded
from lmgeom.store import RepresentationStore

from helpers import TINY_RUN, CrashingEncoder, ReadAhead, assert_same_store

CHUNK, SHARD = 4, 8  # 40 sentences: 5 shards of 2 chunks


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("lee", limit=40)


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return load_encoder("tiny-bert", device="cpu")


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory, encoder: Encoder, corpus: Corpus) -> RepresentationStore:
    return extract(encoder, corpus, tmp_path_factory.mktemp("local") / "run", chunk_sentences=CHUNK)


def test_the_driver_holds_one_shard_of_the_stream_at_a_time(encoder, corpus, local_store):
    reader = ReadAhead([s.text for s in corpus])
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    store = extract_sharded(encoder, reader.stream(corpus.name, corpus.source), url, chunk_sentences=CHUNK,
                            shard_sentences=SHARD, progress=reader.progress())
    # one counting pass (nothing encoded yet), then the shards: never more than one shard ahead
    assert reader.passes == [40, SHARD]
    assert_same_store(local_store, store, atol=1e-6)
    assert {key: store.meta[key] for key in ("corpus_name", "corpus_fingerprint", "n_corpus_sentences", "pretokenized")} == \
        {key: local_store.meta[key] for key in ("corpus_name", "corpus_fingerprint", "n_corpus_sentences", "pretokenized")}


def test_a_resumed_stream_reads_past_the_finished_shards(encoder, corpus, local_store, tmp_path):
    reader = ReadAhead([s.text for s in corpus])
    with pytest.raises(KeyboardInterrupt):  # inside shard 2 (sentences 16-23), after shards 0 and 1 were committed
        extract_sharded(CrashingEncoder(encoder, crash_at=20), reader.stream(corpus.name, corpus.source), tmp_path / "run",
                        chunk_sentences=CHUNK, sort_window=CHUNK, shard_sentences=SHARD)  # windows of a chunk: encoded chunk by chunk
    resuming = CrashingEncoder(encoder, crash_at=None)
    store = extract_sharded(resuming, reader.stream(corpus.name, corpus.source), tmp_path / "run", chunk_sentences=CHUNK,
                            shard_sentences=SHARD)
    assert resuming.chunks == list(range(2 * SHARD, len(corpus), CHUNK))  # shard 2 redone, 0 and 1 skipped
    assert_same_store(local_store, store, atol=1e-6)


def test_a_spec_or_a_stream_writes_the_store_its_corpus_in_memory_writes(encoder, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(s.text for s in load_corpus("lee", limit=30).sentences[5:]) + "\n", encoding="utf-8")
    in_memory = extract_sharded(encoder, load_corpus(str(text)), tmp_path / "memory", chunk_sentences=CHUNK, shard_sentences=SHARD)
    from_spec = extract_sharded(encoder, str(text), tmp_path / "spec", chunk_sentences=CHUNK, shard_sentences=SHARD)
    streamed = extract_sharded(encoder, open_corpus(str(text), limit=20), tmp_path / "head", chunk_sentences=CHUNK,
                               shard_sentences=SHARD)
    assert_same_store(in_memory, from_spec, atol=0)
    assert from_spec.meta["settings"] == in_memory.meta["settings"]
    assert streamed.meta["corpus_name"] == "corpus[:20]" and streamed.meta["n_sentences"] == 20
    pd.testing.assert_frame_equal(streamed.sentences.drop(columns="first_row"),
                                  in_memory.sentences.iloc[:20].drop(columns="first_row"))


def test_a_corpus_that_changes_between_passes_stops_the_run(encoder, corpus, tmp_path):
    texts = [s.text for s in corpus]
    passes: list[int] = []

    def read() -> Iterator[str]:
        passes.append(1)
        # the second pass finds another last sentence
        yield from texts[:-1] + ([texts[-1]] if len(passes) == 1 else ["Another sentence altogether."])

    with pytest.raises(ValueError, match="the corpus changed while it was read .*its sentences differ"):
        extract_sharded(encoder, CorpusStream("changing", read), tmp_path / "run", chunk_sentences=CHUNK, shard_sentences=SHARD)
    with pytest.raises(ValueError, match="unfinished extraction"):
        RepresentationStore.open(tmp_path / "run")


def test_run_out_takes_a_file_url(tiny_run, tmp_path):
    """The run at a file:// URL is the run at the local path (the session's tiny run), number for number."""
    result = run("tiny-bert", "lee", out=(tmp_path / "via-url").as_uri(), **TINY_RUN)
    local = tiny_run
    assert result.store.path == tmp_path / "via-url" and (tmp_path / "via-url" / "report.html").is_file()
    for name in ("summary.json", "contextuality.json", "isotropy.json", "calibration.json"):
        records = [json.loads((folder / name).read_text()) for folder in (tmp_path / "via-url", local.store.path)]
        rows = [record.get("records", record.get("layers")) for record in records]
        assert pd.DataFrame(rows[0]).equals(pd.DataFrame(rows[1])), name
    assert [path.name for path in result.paths] == [path.name for path in local.paths]
