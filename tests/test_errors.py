"""Bad input, damaged files and a full disk: exit 2 with one `error:` line naming the option or file and
the fix, no traceback; a bug (any other exception) shows its traceback and asks for a report (exit 1);
`lmgeom.errors.InputError` names the Python parameter, the CLI its option."""

from __future__ import annotations

import errno
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.common import cli_message
from lmgeom.cli.main import app
from lmgeom.errors import InputError, MissingInput
from lmgeom.store import layout
from lmgeom.store.arrays import write_store_from_arrays

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def one_error(code: int, output: str) -> str:
    """The `error:` line of a refused command (exit 2, one line, no traceback), its text joined."""
    assert code == 2, output
    assert "Traceback" not in output and output.count("error:") == 1, output
    return " ".join(output.split())


def small_store(path: Path, *, dim: int = 6, n_layers: int = 3, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    sentences = [[WORDS[i] for i in rng.integers(0, len(WORDS), size=5)] for _ in range(30)]
    n_rows = sum(map(len, sentences))
    write_store_from_arrays(path, [rng.standard_normal((n_rows, dim)).astype(np.float32) for _ in range(n_layers)],
                            sentences)
    return path


# ---- the exception type and the CLI's words for its parameters ---------------------------------

def test_input_error_names_python_parameters_and_the_cli_writes_its_flags() -> None:
    error = InputError("`min_contexts` must be at least 1; got 0", param="min_contexts",
                       fix="lower it, or pass `overwrite=True`, `device='cpu'` or `include_punct=False`")
    assert isinstance(error, ValueError) and error.params == ("min_contexts",)
    assert str(error) == ("`min_contexts` must be at least 1; got 0; lower it, or pass `overwrite=True`, "
                          "`device='cpu'` or `include_punct=False`")
    # only the parameters the error names are rewritten
    assert cli_message(error) == ("--min-contexts must be at least 1; got 0; lower it, or pass `overwrite=True`, "
                                  "`device='cpu'` or `include_punct=False`")
    every = InputError("`overwrite=True`, `device='cpu'`, `include_punct=False`, `include_punct=True`, `seed`",
                       param=("overwrite", "device", "include_punct"))
    assert cli_message(every) == "--overwrite, --device cpu, --exclude-punct, --include-punct, `seed`"


def test_input_errors_keep_their_parameters_through_pickle() -> None:
    # an error raised in a worker process reaches the parent whole
    for error in (InputError("`data` is empty", param="data", fix="give files"),
                  MissingInput("no `data` folder", param="data")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error) and again.params == ("data",)
    assert isinstance(MissingInput("x"), FileNotFoundError)


def test_a_library_error_names_the_parameter_and_the_cli_its_option(tmp_path: Path) -> None:
    from lmgeom.stages.analysis import analyze_store

    store = small_store(tmp_path / "s")
    with pytest.raises(InputError, match="`min_contexts` must be at least 2 for self_similarity") as raised:
        analyze_store(store, min_contexts=1)
    assert "--" not in str(raised.value) and raised.value.params == ("min_contexts",)


def test_a_bug_shows_its_traceback_and_asks_for_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lmgeom.stages.analysis

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("words")  # an internal error, not the user's input

    monkeypatch.setattr(lmgeom.stages.analysis, "analyze_store", broken)
    result = CliRunner().invoke(app, ["analyze", str(small_store(tmp_path / "s"))], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "Traceback" in result.output and "KeyError: 'words'" in result.output
    assert "bug in lmgeom" in result.output and "please report it" in result.output
    assert "error: 'words'" not in result.output


# ---- elmo train: --out and the checkpoint --------------------------------------------------------

def corpus_file(path: Path) -> Path:
    path.write_text("".join(f"the cat sat on mat number {i} .\n" for i in range(20)))
    return path


def test_elmo_train_refuses_an_unwritable_out_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import lmgeom.atomic

    trainer = importlib.import_module("lmgeom.elmo.train")  # the module (lmgeom.elmo.train is also its function)
    out = tmp_path / "locked"
    out.mkdir()
    out.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: the folder refuses as a read-only one would
        def read_only(*args: Any, **kwargs: Any) -> Any:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

        monkeypatch.setattr(lmgeom.atomic.tempfile, "mkstemp", read_only)

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the corpus was read: the check came after the work")

    monkeypatch.setattr(trainer, "split_corpus", no_training)
    try:
        line = one_error(*invoke("elmo", "train", "--out", out, "--corpus", corpus_file(tmp_path / "c.txt"),
                                 "--device", "cpu"))
    finally:
        out.chmod(0o700)
    assert f"--out {out} cannot be written (Permission denied)" in line and "give a folder you can write to" in line
    assert list(out.iterdir()) == []


def test_a_corrupt_checkpoint_is_named_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"not a torch file at all")
    line = one_error(*invoke("elmo", "train", "--out", out, "--corpus", corpus_file(tmp_path / "c.txt"),
                             "--device", "cpu", "--lstm-dim", "8", "--projection-dim", "4", "--max-steps", "1"))
    assert f"the checkpoint {out / 'checkpoint.pt'} cannot be read" in line
    assert "delete it to train from the start, or pass --overwrite" in line
    assert (out / "checkpoint.pt").read_bytes() == b"not a torch file at all"  # nothing replaced


# ---- damaged result files, vectors and benchmarks ----------------------------------------------

def test_report_on_a_garbage_words_table_names_the_file(tmp_path: Path) -> None:
    run = small_store(tmp_path / "run")  # a store is a run
    (run / "contextuality_words.csv").write_text("hello,there\n1,2\nx,y\n")
    line = one_error(*invoke("report", run))
    assert f"{run / 'contextuality_words.csv'} lacks the column(s) word, layer, count, contexts" in line
    assert "run `lmgeom analyze RUN" in line
    (run / "contextuality_words.csv").write_text("word,layer,count,contexts\nthe,zero,3,2\n")
    line = one_error(*invoke("report", run))
    assert "column(s) layer hold values that are not numbers" in line


@pytest.fixture(scope="module")
def exported_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_store(tmp_path_factory.mktemp("static") / "s")


def test_garbage_static_vectors_are_named(exported_store: Path, tmp_path: Path) -> None:
    garbage_kv = tmp_path / "mine.kv"
    garbage_kv.write_bytes(os.urandom(256))
    line = one_error(*invoke("static-embeddings", exported_store, "--layer", "1", "--out", tmp_path / "1.txt",
                             "--static-vectors", garbage_kv, "--trust-pickle", "--data-dir", tmp_path))
    assert f"static vectors file {garbage_kv} cannot be read as a gensim KeyedVectors .kv file" in line
    text = tmp_path / "vectors.txt"
    text.write_text("3 4\nthe 0.1 0.2\ncat nonsense here and more\n")
    line = one_error(*invoke("static-embeddings", exported_store, "--layer", "1", "--out", tmp_path / "2.txt",
                             "--static-vectors", text, "--data-dir", tmp_path))
    assert f"static vectors file {text} cannot be read as word2vec or GloVe text vectors" in line


def test_a_benchmark_with_no_pairs_is_named(exported_store: Path, tmp_path: Path) -> None:
    header_only = tmp_path / "pairs.txt"
    header_only.write_text("word1\tword2\tscore\n")
    line = one_error(*invoke("static-embeddings", exported_store, "--layer", "1", "--out", tmp_path / "1.txt",
                             "--benchmark", header_only, "--data-dir", tmp_path))
    assert f"{header_only} holds no word pairs (only a header line)" in line and "max()" not in line


# ---- a full disk, damaged chunks, damaged experiment caches ------------------------------------

def test_a_full_disk_names_the_folder_and_says_the_extraction_resumes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import lmgeom.store.writer as writer

    out = tmp_path / "store"
    real_write_rows, calls = writer._write_rows, {"n": 0}

    def write_rows(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 4:  # the first commits fit, then the disk is full
            raise OSError("1048576 requested and 1026048 written")  # numpy's tofile on a full disk: no errno
        return real_write_rows(*args)

    monkeypatch.setattr(writer, "_write_rows", write_rows)
    line = one_error(*invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "12", "--chunk-sentences", "2",
                             "--out", out, "--device", "cpu"))
    assert f"No space left on device: the disk holding {out} is full (1048576 requested and 1026048 written)" in line
    assert "run the same extraction again: it resumes after the last chunk it committed" in line
    monkeypatch.setattr(writer, "_write_rows", real_write_rows)
    code, output = invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "12", "--chunk-sentences", "2",
                          "--out", out, "--device", "cpu")
    assert code == 0, output
    assert json.loads((out / layout.META).read_text())["complete"] is True


def test_random_bytes_in_a_float32_chunk_blame_the_chunk_not_float16(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    chunk = next(p for p in (store / layout.LAYERS / "1").rglob("*") if p.is_file() and p.name[0].isdigit())
    data = bytearray(chunk.read_bytes())
    data[4 * 6 * 2 : 4 * 6 * 2 + 4] = np.array([np.nan], dtype=np.float32).tobytes()  # row 2 of the chunk
    chunk.write_bytes(bytes(data))
    from lmgeom.store import RepresentationStore
    from lmgeom.engine.loop import layer_chunks

    meta = json.loads((store / layout.META).read_text())
    with pytest.raises(InputError, match=r"layer 1: chunk file .* is damaged or was edited"):  # its checksum tells first
        list(layer_chunks(RepresentationStore(store, meta), 1))
    opened = RepresentationStore(store, {key: value for key, value in meta.items() if key != "integrity"})  # none recorded
    with pytest.raises(InputError) as raised:
        list(layer_chunks(opened, 1))
    message = str(raised.value)
    assert message.startswith(f"non-finite values (NaN or inf) in layer 1 row 2 of {opened.url}")
    assert "chunk file may be damaged; run `lmgeom verify" in message and "float16" not in message


def test_a_damaged_experiment_cell_is_computed_again(tmp_path: Path) -> None:
    from lmgeom.stages.experiments.core import Cell, CellStore

    cells = CellStore(tmp_path)
    cell = Cell({"method": "none"}, 0, [{"score": 1.0}], {"dev": [0.5]})
    cells.save(cell)
    assert cells.load(cell.config, 0) == cell
    path = cells.path(cell.config, 0)
    path.write_text(path.read_text()[:20])  # truncated
    with pytest.warns(UserWarning, match=f"experiment cell {path} is damaged .*computed again"):
        assert cells.load(cell.config, 0) is None


def test_a_damaged_feature_cache_is_computed_again(tmp_path: Path) -> None:
    from lmgeom.stages.experiments.features import FeatureCache

    folder = tmp_path / "cache"
    folder.mkdir()
    np.save(folder / "layer_00.npy", np.zeros((2, 3), dtype=np.float32))
    (folder / "index.json").write_text(json.dumps({"model": "m", "n_layers": 1, "keys": ["a", "b", "c"], "rows": [0, 1, 2]}))
    with pytest.warns(UserWarning, match=f"feature cache {folder} is damaged .*fewer rows than the index"):
        assert FeatureCache._open(folder) is None
    (folder / "layer_00.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.warns(UserWarning, match="is damaged"):
        assert FeatureCache._open(folder) is None


# ---- calibrators on few rows --------------------------------------------------------------------

@pytest.mark.parametrize("method, warns", [("whitening", True), ("cie", True), ("flow", True), ("conceptor", True),
                                           ("abtt", False), ("standardize", False)])
def test_calibrators_fitted_on_fewer_than_2d_rows_warn(method: str, warns: bool) -> None:
    from lmgeom.calibrate import make_calibrator
    from lmgeom.calibrate._base import FewRowsWarning

    rng = np.random.default_rng(0)
    few, enough = rng.standard_normal((15, 8)), rng.standard_normal((16, 8))
    calibrator = make_calibrator(method, seed=0)
    if method == "flow":
        calibrator.set_params(n_epochs=1)
    if method == "cie":
        calibrator.set_params(n_clusters=2, n_components=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrator.fit(few)
        calibrator.fit(enough)  # 2·d rows: no warning
    messages = [str(w.message) for w in caught if issubclass(w.category, FewRowsWarning)]
    if warns:
        assert messages == [f"{type(calibrator).__name__} fitted on 15 rows of 8 dimensions, fewer than 2·d = 16: "
                            "whitening, CIE and the flow collapse there (they fit the noise of so few rows, and the "
                            "calibrated vectors lose most of their meaning); fit on at least 16 rows"]
    else:
        assert messages == []


def test_the_sts_grid_marks_cells_fitted_on_few_sentences() -> None:
    from lmgeom.evaluate.sts import FEW_ROWS_MARK, headline_grid

    records = [{"aggregation": "all", "layer": "6", "method": m, "fit_on": f, "spearman": s, "few_fit_rows": few}
               for m, f, s, few in (("none", "none", 77.4, False), ("whitening", "transductive", 40.5, True),
                                    ("whitening", "lee", 70.0, False))]
    assert headline_grid(records) == (["layer", "none", "whitening", "whitening@lee"],
                                      [["6", "77.4", f"40.5{FEW_ROWS_MARK}", "70.0"]])
