"""No user file runs code when loaded (a crafted pickle `.kv` stays inert unless trusted), words
render as text in the report's charts, analysis workers die with their parent, and the scratch and
temporary files a killed or failed write leaves behind are removed by the next run."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import typer
from gensim.models import KeyedVectors
from typer.testing import CliRunner

from lmgeom.cli.analyze import register
from lmgeom.evaluate import load_static_vectors
from lmgeom.runs import export_static_embeddings
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
    with pytest.raises(ValueError, match="--trust-pickle") as error:
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
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store), "--layer", "1", "--static-vectors",
                                       str(tmp_path / "mine.kv"), "--trust-pickle"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert "static: mine.kv" in outcome.output
