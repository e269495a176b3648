"""The tables of docs/reproduction/ethayarajh2019.md (Ethayarajh 2019) from committed files.

    python benchmarks/reproduce_ethayarajh2019.py           writes the marked blocks into the doc
    python benchmarks/reproduce_ethayarajh2019.py --check   exits 1 if the doc differs from the files

Sources: the paper's released per-layer statistics and Table 1 (../shared/reference/ethayarajh2019:
layer_statistics.csv, table1_static_embeddings.csv) and lmgeom's results under
docs/reproduction/results/ethayarajh-*/ (contextuality.json of `lmgeom analyze`,
static/<layer>.benchmarks.json of `lmgeom static-embeddings`) and the stand-ins for GloVe / FastText
under docs/reproduction/results/standins-*/ (results.json of `lmgeom experiment static-baselines`);
docs/reproduction/results/COMMANDS.md
lists the commands of each run.

    python benchmarks/reproduce_ethayarajh2019.py first-word STORE --layers 0,1,12,30
        prints, per layer of a store, how much the first word of each sentence moves the baselines:
        median norm of first words vs the others, the share of the first words' squared norm in
        their largest coordinate, and anisotropy, IntraSim* and the sampled MEV baselines with and
        without the first words (same rows and seed as `lmgeom analyze`'s defaults otherwise).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_common import ROOT, RESULTS, Documents, load_json, main, markdown, number  # noqa: E402

DOC = "docs/reproduction/ethayarajh2019.md"
PAPER_MODELS = ("ELMo", "BERT", "GPT-2")
# lmgeom's runs shown beside the paper's models: (results folder, label, unit)
RUNS = (("ethayarajh-minilm-lee", "MiniLM, lee", "word"), ("ethayarajh-smollm2-lee", "SmolLM2, lee", "word"),
        ("ethayarajh-gemma3-lee", "Gemma 3 270M, lee", "word"),
        ("ethayarajh-minilm-sts", "MiniLM, STS sample", "word"),
        ("ethayarajh-minilm-sts-protocol-full", "MiniLM, STS scored (all), paper's protocol", "WordPiece piece"),
        ("ethayarajh-minilm-sts-protocol", "MiniLM, STS scored sample, paper's protocol", "WordPiece piece"),
        ("ethayarajh-elmo-brown-lee", "elmo-brown, lee", "word"))
# Table 1's benchmarks (the paper's names) -> lmgeom's
BENCHMARKS = {"SimLex999": "simlex999", "MEN": "men", "WS353": "wordsim353", "RW": "rw", "Google": "google_analogies",
              "MSR": "msr_analogies", "SemEval2012(2)": "semeval2012_2", "BLESS": "bless", "AP": "ap"}


def _reference_path() -> Path:
    shared = Path(os.environ["LMGEOM_DATA"]).parent if os.environ.get("LMGEOM_DATA") else ROOT.parent / "shared"
    return shared / "reference" / "ethayarajh2019"


def reference_folder_exists() -> bool:
    return _reference_path().is_dir()


def reference_folder() -> Path:
    """shared/reference/ethayarajh2019 (next to shared/data, which LMGEOM_DATA may name)."""
    folder = _reference_path()
    if not folder.is_dir():
        raise SystemExit(f"{folder} does not exist: the paper's released statistics live in shared/reference/ethayarajh2019")
    return folder


def released() -> pd.DataFrame:
    """model x layer x metric of the released statistics."""
    return pd.read_csv(reference_folder() / "layer_statistics.csv")


def contextuality(run: str) -> pd.DataFrame:
    """The per-layer records of a committed `lmgeom analyze` result."""
    return pd.DataFrame(load_json(RESULTS / run / "contextuality.json")["records"])


# measure -> (released metric, lmgeom metric, lmgeom field)
MEASURES: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "anisotropy": ("anisotropy_baseline_cosine",
                   [("exact", "anisotropy_exact", "raw"), ("sampled, 1,000 occurrences", "anisotropy_sampled", "raw")]),
    "selfsim-raw": ("self_similarity_mean_raw", [("", "self_similarity", "raw")]),
    "selfsim-adjusted": ("self_similarity_mean_adjusted", [("", "self_similarity", "adjusted")]),
    "intrasim-raw": ("intra_sentence_similarity_raw", [("", "intra_sentence_similarity", "raw")]),
    "intrasim-adjusted": ("intra_sentence_similarity_adjusted", [("", "intra_sentence_similarity", "adjusted")]),
    "mev-svd-ratio-raw": ("mev_mean_raw", [("", "mev_svd_ratio", "raw")]),
    "mev-svd-ratio-baseline": ("mev_baseline_random_words", [("", "mev_svd_ratio", "baseline")]),
    "mev-svd-ratio-adjusted": ("mev_mean_adjusted", [("", "mev_svd_ratio", "adjusted")]),
    "mev-uncentred": ("", [("raw", "mev_uncentred", "raw"), ("baseline", "mev_uncentred", "baseline"),
                           ("adjusted", "mev_uncentred", "adjusted")]),
    "mev-centred": ("", [("raw", "mev_centred", "raw"), ("baseline", "mev_centred", "baseline"),
                         ("adjusted", "mev_centred", "adjusted")]),
}


# the rows of a run in the paper's protocol (`--protocol ethayarajh2019`): the released code's sampled
# statistics, then lmgeom's exact ones on the same store
PROTOCOL_MEASURES: dict[str, list[tuple[str, str, str]]] = {
    "anisotropy": [("released code's estimate, 1,000 pairs", "anisotropy_released", "raw"),
                   ("exact", "anisotropy_exact", "raw")],
    "selfsim-raw": [("released code's estimate", "self_similarity_released", "raw"), ("exact", "self_similarity", "raw")],
    "selfsim-adjusted": [("released code's estimate", "self_similarity_released", "adjusted"),
                         ("exact", "self_similarity", "adjusted")],
    "intrasim-raw": [("released code's estimate, 1,000 sentences", "intra_sentence_similarity_released", "raw"),
                     ("exact, every sentence", "intra_sentence_similarity", "raw")],
    "intrasim-adjusted": [("released code's estimate, 1,000 sentences", "intra_sentence_similarity_released", "adjusted"),
                          ("exact, every sentence", "intra_sentence_similarity", "adjusted")],
    "mev-svd-ratio-raw": [("released code's (rounded, clipped at 1)", "mev_svd_ratio_released", "raw"),
                          ("exact", "mev_svd_ratio", "raw")],
    "mev-svd-ratio-baseline": [("released code's: the 1,000 sampled words", "mev_svd_ratio_released", "baseline"),
                               ("1,000 sampled occurrences", "mev_svd_ratio", "baseline")],
    "mev-svd-ratio-adjusted": [("released code's", "mev_svd_ratio_released", "adjusted"), ("exact", "mev_svd_ratio", "adjusted")],
}


def is_protocol_run(run: str) -> bool:
    return load_json(RESULTS / run / "contextuality.json")["settings"].get("protocol") is not None


def layer_columns() -> range:
    """Layers 0 to the deepest of the paper's models and lmgeom's runs."""
    deepest = max(max(load_json(RESULTS / run / "contextuality.json")["settings"]["layers"]) for run, _, _ in RUNS)
    return range(max(deepest, 12) + 1)


def measure_table(name: str) -> str:
    paper_metric, default = MEASURES[name]
    layers = layer_columns()
    header = ["model", "source", *[str(layer) for layer in layers]]
    rows = []
    if paper_metric:
        stats = released()
        for model in PAPER_MODELS:
            values = stats[(stats.model == model) & (stats.metric == paper_metric)].set_index("layer")["value"]
            last = int(stats[stats.model == model]["layer"].max())
            rows.append([model, "released (kawine/contextual)",
                         *[number(values.get(layer)) if layer <= last else "" for layer in layers]])
    for run, label, _ in RUNS:
        records = contextuality(run)
        ours = PROTOCOL_MEASURES.get(name, default) if is_protocol_run(run) else default
        for variant, metric, field in ours:
            values = records[records.metric == metric].set_index("layer")[field]
            source = "lmgeom" + (f", {variant}" if variant else "")
            rows.append([label, source, *[number(values.get(layer)) if layer in values.index else "" for layer in layers]])
    return markdown(header, rows, align="ll" + "r" * len(layers))


def run_summary() -> str:
    rows = []
    for run, label, unit in RUNS:
        document = load_json(RESULTS / run / "contextuality.json")
        counts, settings = document["counts"], document["settings"]
        rows.append([label, document["model_id"], settings.get("protocol") or "lmgeom's default", unit,
                     f"{counts['sentences']:,}", f"{counts['rows']:,}", f"{counts['rows_analysed']:,}",
                     f"{counts['words_analysed']:,}", f"≥ {settings['min_contexts']} {settings.get('count_by', 'sentences')}",
                     f"`results/{run}/`"])
    return markdown(["run", "model", "protocol", "unit", "sentences", "stored units", "units analysed", "distinct analysed",
                     "threshold", "results"], rows, align="llllrrrrll")


def findings(run: str) -> str:
    """The run's findings as today's tests give them, re-derived from its committed numbers
    (`lmgeom.stages.contextuality.retest_findings`), not the sentences the run wrote."""
    from lmgeom.stages.contextuality import retest_findings

    _, statements = retest_findings(load_json(RESULTS / run / "contextuality.json"))
    return "\n".join(f"- {statement}" for statement in statements)


def _static_records(run: str) -> pd.DataFrame:
    files = sorted((RESULTS / run / "static").glob("*.benchmarks.json"), key=lambda p: int(p.name.split(".")[0]))
    records = pd.DataFrame([r for path in files for r in load_json(path)["records"]])
    return records[records["vectors"].str.startswith("first_pc")]


# static vectors trained here in place of GloVe / FastText (`lmgeom experiment static-baselines`): (results folder, corpus)
STANDINS = (("standins-lee", "Lee"), ("standins-brown", "Brown"))
PAPER_STATIC = ("GloVe", "FastText")  # the paper's rows the stand-ins stand in for


def _scored_rows(label: str, source: str, at: pd.DataFrame) -> list[list[str]]:
    """A vector set's three rows: all items, covered items only, coverage (`at`: its records by benchmark)."""
    return [[label, f"{source}, all items (OOV = mean)", *[number(at.loc[b, "score_oov_mean"]) for b in BENCHMARKS.values()]],
            ["", f"{source}, covered items only", *[number(at.loc[b, "score"]) for b in BENCHMARKS.values()]],
            ["", "coverage", *[f"{int(at.loc[b, 'covered']):,}/{int(at.loc[b, 'total']):,}" for b in BENCHMARKS.values()]]]


def standins(run: str) -> dict[str, Any]:
    return load_json(RESULTS / run / "results.json")


def standin_rows() -> list[list[str]]:
    rows = []
    for run, corpus in STANDINS:
        records = pd.DataFrame(standins(run)["records"])
        for vectors in dict.fromkeys(records["vectors"]):
            at = records[records.vectors == vectors].set_index("benchmark")
            rows += _scored_rows(f"{vectors} (trained here on {corpus})", "stand-in", at)
    return rows


def standin_settings() -> str:
    """The stand-ins' corpora and hyper-parameters, from their results."""
    rows = []
    for run, corpus in STANDINS:
        document = standins(run)
        settings, records = document["settings"], pd.DataFrame(document["records"])
        words = ", ".join(f"{v} {n:,}" for v, n in records.groupby("vectors", sort=False)["n_vectors"].first().items())
        rows.append([corpus, f"{settings['sentences']:,}", f"{settings['tokens']:,}", words, str(settings["dim"]),
                     str(settings["window"]), str(settings["min_count"]), str(settings["epochs"]), str(settings["negative"]),
                     f"{settings['min_n']}–{settings['max_n']}, {settings['bucket']:,}", f"{settings['seed']}, {settings['workers']}",
                     settings["gensim"], f"`results/{run}/`"])
    return markdown(["corpus", "sentences", "words", "vectors (vocabulary)", "dim", "window", "min_count", "epochs",
                     "negative", "fastText n-grams, buckets", "seed, workers", "gensim", "results"], rows, align="lrrlrrrrrllll")


def table1() -> str:
    paper = pd.read_csv(reference_folder() / "table1_static_embeddings.csv")
    rows = []
    labels = list(dict.fromkeys(paper["row_label"]))
    last_static = max(labels.index(label) for label in PAPER_STATIC)
    for position, label in enumerate(labels):
        cells = paper[paper.row_label == label].set_index("benchmark")
        rows.append([label, "paper (Table 1)",
                     *[f"**{cells.loc[b, 'value']:.3f}**" if cells.loc[b, "bold_in_table"] else f"{cells.loc[b, 'value']:.3f}"
                       for b in BENCHMARKS]])
        if position == last_static:
            rows += standin_rows()
    for run, label, _ in RUNS:
        records = _static_records(run).set_index(["layer", "benchmark"])
        for layer in sorted({layer for layer, _ in records.index}):
            rows += _scored_rows(f"{label}, layer {layer}", "lmgeom", records.loc[layer])
    return markdown(["vectors", "protocol", *BENCHMARKS], rows, align="ll" + "r" * len(BENCHMARKS))


def static_words(run: str) -> int:
    return int(_static_records(run)["n_vectors"].iloc[0])


def build() -> Documents:
    blocks = {f"measure-{name}": measure_table(name) for name in MEASURES}
    blocks["runs"] = run_summary()
    blocks["table1"] = table1()
    blocks["standins"] = standin_settings()
    for run, _, _ in RUNS:
        blocks[f"findings-{run.removeprefix('ethayarajh-')}"] = findings(run)
    return {DOC: blocks}


def first_word_table(run: Path, layers: list[int], *, n_samples: int = 1000, seed: int = 0) -> str:
    from lmgeom.metrics.contextuality import average_cosine, intra_sentence_similarity, row_norms, sample_indexes
    from lmgeom.metrics.mev import occurrence_spectrum
    from lmgeom.stages.contextuality import layer_name
    from lmgeom.store import RepresentationStore

    store = RepresentationStore.open(run)
    tokens = store.tokens
    analysed = ~tokens["is_special"].to_numpy() & ~tokens["is_punct"].to_numpy()
    first = tokens["position"].to_numpy() == 0
    sentence_ids = tokens["sentence_id"].to_numpy()
    pools = {"all": np.flatnonzero(analysed), "no first": np.flatnonzero(analysed & ~first)}
    samples = {name: sample_indexes(pool, n_samples, seed) for name, pool in pools.items()}
    rows = []
    for layer in layers:
        X = np.asarray(store.layer(layer)[:], dtype=np.float64)
        norms = row_norms(X)
        energy = (X[analysed & first] ** 2).sum(axis=0)
        row = {"layer": f"{layer} ({layer_name(layer)})",
               "norm first / others (median)": f"{np.median(norms[analysed & first]) / np.median(norms[analysed & ~first]):.1f}",
               "first words' energy in their top coordinate": f"{energy.max() / energy.sum():.2f} (#{energy.argmax()})"}
        for name, pool in pools.items():
            baseline = average_cosine(X[pool])
            intra = intra_sentence_similarity(X[pool], sentence_ids[pool]).mean() - baseline
            spectrum = occurrence_spectrum(X[samples[name]])
            row[f"anisotropy ({name})"] = _cell(baseline)
            row[f"IntraSim* ({name})"] = _cell(intra)
            row[f"MEV baseline centred / svd_ratio ({name})"] = f"{_cell(spectrum.mev('centred'))} / {_cell(spectrum.mev('svd_ratio'))}"
        rows.append(row)
    return _markdown(pd.DataFrame(rows))


def _first_word_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reproduce_ethayarajh2019.py first-word")
    parser.add_argument("run", type=Path)
    parser.add_argument("--layers", required=True, help="comma-separated layers, e.g. 0,1,12,30")
    arguments = parser.parse_args(argv)
    print(first_word_table(arguments.run, [int(layer) for layer in arguments.layers.split(",")]))
    return 0


def _cell(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown(frame: pd.DataFrame) -> str:
    return markdown(list(frame.columns), frame.itertuples(index=False))


if __name__ == "__main__":
    if sys.argv[1:2] == ["first-word"]:
        raise SystemExit(_first_word_main(sys.argv[2:]))
    raise SystemExit(main(build))
