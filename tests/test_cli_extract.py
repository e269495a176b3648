"""`lmgeom extract` and `lmgeom run` from the command line."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.metrics.contextuality import average_cosine
from lmgeom.engine import select_rows
from lmgeom.store import RepresentationStore

runner = CliRunner()


def flat(output: str) -> str:
    """Rich wraps long lines at the terminal width; compare on single spaces."""
    return " ".join(output.split())


def test_extract_command_writes_a_store(tmp_path):
    corpus = tmp_path / "s.txt"
    corpus.write_text("The bank of the river.\nThe bank raised rates.\n")
    result = runner.invoke(app, ["extract", "tiny-llama", "--corpus", str(corpus), "--out", str(tmp_path / "run"), "--include-special", "--storage-dtype", "float16"])
    assert result.exit_code == 0, result.output
    assert "layer 0 = embedding output" in flat(result.output)
    store = RepresentationStore.open(tmp_path / "run")
    assert store.meta["special_tokens"] == "stored" and store.meta["dtype"] == "float16"
    assert store.tokens["word"].tolist()[:3] == ["<s>", "The", "bank"]
    assert len(store.occurrences("bank")) == 2
    again = runner.invoke(app, ["extract", "tiny-llama", "--corpus", str(corpus), "--out", str(tmp_path / "run")])
    assert again.exit_code == 2 and "holds another run (different dtype, special_tokens)" in flat(again.output)
    assert "--overwrite" in flat(again.output)


def test_run_command_summarises_every_layer(tiny_cli_run):
    out, output = tiny_cli_run  # `lmgeom run --model tiny-bert` on 60 Lee sentences, exit code 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["model_id"] == "tiny-bert"
    assert "layer 0 is the embedding output" in summary["layer_note"]
    store = RepresentationStore.open(out)
    rows = select_rows(store.tokens).rows
    assert not store.tokens.loc[rows, "is_punct"].any()
    for record in summary["layers"]:
        X = np.asarray(store.layer(record["layer"])[:], dtype=np.float64)[rows]
        assert np.isclose(record["average_cosine"], average_cosine(X), atol=1e-12)
        assert np.isclose(record["mean_norm"], np.linalg.norm(X, axis=1).mean(), rtol=1e-12)
        assert record["n_occurrences"] == len(rows)
    assert (out / "contextuality.json").exists() and "Findings" in output


def test_bad_input_exits_2_with_one_line(tmp_path):
    result = runner.invoke(app, ["extract", "./missing-model", "--corpus", "lee", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "model path ./missing-model does not exist" in flat(result.output)


def test_run_command_shows_every_benchmark_with_its_coverage(tiny_cli_run):
    """`lmgeom run` prints the first-PC vectors' covered-items score per benchmark and layer beside
    covered/total; on 60 sentences every benchmark is covered by too few items, so no score is a number."""
    out, output = tiny_cli_run
    records = [r for layer in (0, 3) for r in json.loads((out / "static" / f"{layer}.benchmarks.json").read_text())["records"]
               if r["vectors"].startswith("first_pc")]
    assert records and not any(r["enough_items"] for r in records)
    table = output[output.index("Static embeddings (first principal component)"):output.index("Findings")]
    rows = [line for line in table.splitlines() if line.startswith("│") and line.split("│")[1].strip()]
    assert len(rows) == len({r["benchmark"] for r in records})
    for row in rows:
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        record = next(r for r in records if r["benchmark"].startswith(cells[0].rstrip("…")))
        assert cells[2] == f"{record['covered']:,}/{record['total']:,}"
        assert cells[3:] == ["too few", "too few"]
    assert "too few: fewer covered items than 50,10%" in " ".join(table.split())
