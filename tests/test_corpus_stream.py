"""Corpus streams (`open_corpus`) yield exactly the sentences `load_corpus` holds in memory, read
from the source on every pass; a Hugging Face dataset is streamed."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

from lmgeom.corpus import Corpus, CorpusStream, load_corpus, open_corpus


def assert_same_corpus(stream: CorpusStream, corpus: Corpus) -> None:
    assert [(s.text, s.words) for s in stream] == [(s.text, s.words) for s in corpus]
    summary = stream.summary()
    assert (summary.n_sentences, summary.fingerprint, summary.pretokenized) == (len(corpus), corpus.fingerprint, corpus.pretokenized)
    assert (stream.name, stream.source) == (corpus.name, corpus.source)


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "lines.txt"
    # a BOM, CRLF line ends, a form feed and a lone CR (both inside their line), blank lines
    text.write_bytes("\ufeffThe cat sat.\r\n\r\nA dog ran\x0cto it.\rIt's 4:00 now.\n   \nLast line".encode("utf-8"))
    words = tmp_path / "words.txt"
    words.write_text("the cat  sat\n\nit ran .\n", encoding="utf-8")
    jsonl = tmp_path / "items.jsonl"
    jsonl.write_text("\n".join(json.dumps(record) for record in
                               [{"text": "A man eats.", "id": 1}, {"text": ["pre", "tokenized", "words"]}, {"text": "Dogs bark."}]) + "\n\n")
    brown = tmp_path / "brown"
    brown.mkdir()
    (brown / "cats.txt").write_text("ca01 news\nca02 news\n")
    (brown / "ca01").write_text("The/at dog/nn ran/vbd ./.\n\nIt/pps barked/vbd ./.\n")
    (brown / "ca02").write_text("Cats/nns sleep/vb ./.\n")
    sts = tmp_path / "sts" / "STS12-en-test"
    sts.mkdir(parents=True)
    (sts / "STS.input.x.txt").write_text("A man eats.\tA woman eats.\nA man eats.\tA dog runs.\n")
    return {"text": text, "words": words, "jsonl": jsonl, "brown": brown, "sts": sts.parent}


def test_every_spec_streams_the_sentences_it_loads(files):
    cases: list[tuple[str, dict[str, Any]]] = [
        ("lee", {"limit": 40}), ("lee", {"sample": 25, "seed": 3}), ("lee", {"sample": 25, "seed": 3, "limit": 10}),
        (str(files["text"]), {}), (str(files["words"]), {"pretokenized": True}), (str(files["jsonl"]), {}),
        (str(files["brown"]), {}), (f"brown:{files['brown']}", {"limit": 2}), (f"sts:{files['sts']}", {}),
    ]
    for spec, options in cases:
        assert_same_corpus(open_corpus(spec, **options), load_corpus(spec, **options))
    assert [s.text for s in open_corpus(str(files["text"]))] == ["The cat sat.", "A dog ran\x0cto it.\rIt's 4:00 now.", "Last line"]
    assert open_corpus(str(files["jsonl"])).summary().pretokenized and open_corpus(f"brown:{files['brown']}").summary().pretokenized
    # the whole Lee corpus, as loaded before streams existed (its pinned length)
    assert_same_corpus(open_corpus("lee"), load_corpus("lee"))
    assert open_corpus("lee").summary().n_sentences == 2680


def test_every_pass_reads_the_source_again(files):
    stream = open_corpus(str(files["text"]))
    assert [s.text for s in stream] == [s.text for s in stream]
    files["text"].write_text("Changed.\n", encoding="utf-8")
    assert [s.text for s in stream] == ["Changed."]


def test_bad_input_is_reported_as_when_loading(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("fine line\nna\xefve\n".encode("latin-1"))
    with pytest.raises(ValueError) as loaded:
        load_corpus(str(bad))
    with pytest.raises(ValueError) as streamed:
        list(open_corpus(str(bad)))
    assert str(streamed.value) == str(loaded.value)
    assert "line 2 is not valid UTF-8 (byte 0xef at offset 12)" in str(streamed.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="is empty"):
        open_corpus(str(empty)).summary()
    with pytest.raises(FileNotFoundError, match="neither a built-in corpus nor an existing file"):
        open_corpus(str(tmp_path / "missing.txt"))
    no_field = tmp_path / "x.jsonl"
    no_field.write_text('{"body": "A b."}\n')
    with pytest.raises(ValueError, match="line 1 has no field 'text'; pass `field`"):
        open_corpus(str(no_field)).summary()


def test_a_hugging_face_corpus_is_streamed(monkeypatch):
    calls: list[dict[str, Any]] = []
    records = [{"text": "First sentence here."}, {"text": "  "}, {"text": ["two", "words"]}, {"text": "Last one."}]

    def load_dataset(name: str, config: str | None, *, split: str, streaming: bool) -> Iterator[dict[str, Any]]:
        calls.append({"name": name, "config": config, "split": split, "streaming": streaming})
        return iter(records)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    stream = open_corpus("hf:wikitext/wikitext-2-raw-v1:test:text", limit=3)
    assert [s.text for s in stream] == ["First sentence here.", "two words", "Last one."]
    assert calls == [{"name": "wikitext", "config": "wikitext-2-raw-v1", "split": "test", "streaming": True}]
    assert stream.name == "wikitext:test:text[:3]" and stream.source == "hf://wikitext/wikitext-2-raw-v1/test/text"
    loaded = load_corpus("hf:wikitext/wikitext-2-raw-v1:test:text", limit=3)
    assert calls[-1]["streaming"] is False  # load_corpus loads the split (a local cache serves it offline)
    assert_same_corpus(stream, loaded)
    with pytest.raises(ValueError, match=r"no column 'body'; columns: \['text'\]"):
        list(open_corpus("hf:wikitext:test:body"))
