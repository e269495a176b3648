"""Markdown tables of docs/reproduction/ethayarajh2019.md from finished run directories.

    python benchmarks/reproduce_ethayarajh2019.py tables RUN_DIR [RUN_DIR ...]
        prints, per run: the per-layer contextuality table (from `lmgeom analyze`'s
        contextuality_layers.csv), the three MEV variants, the least self-similar words and the
        static-embedding benchmark table (from `lmgeom static-embeddings`' static/<layer>.benchmarks.csv).

    python benchmarks/reproduce_ethayarajh2019.py first-word RUN_DIR --layers 0,1,12,30
        prints, per layer, how much the first word of each sentence (sequence position 0, where a
        decoder without a BOS token puts its attention-sink outlier) moves the baselines: median norm
        of first words vs the others, the share of the first words' squared norm in their largest
        coordinate, and anisotropy, IntraSim* and the sampled MEV baselines with and without the
        first words (same rows and seed as `lmgeom analyze`'s defaults otherwise).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from gensim.parsing.preprocessing import STOPWORDS
from scipy.stats import spearmanr

from lmgeom.runs.contextuality import layer_name
from lmgeom.metrics.contextuality import (
    MEV_VARIANTS,
    average_cosine,
    intra_sentence_similarity,
    occurrence_spectrum,
    row_norms,
    sample_indexes,
)
from lmgeom.store import RepresentationStore


def _cell(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(frame.columns))) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _wide(layers: pd.DataFrame, column: str) -> pd.DataFrame:
    return layers.pivot(index="layer", columns="metric", values=column)


def _require(path: Path, command: str) -> Path:
    if not path.exists():
        raise SystemExit(f"{path} does not exist; run `{command}` first")
    return path


def contextuality_tables(run: Path) -> str:
    _require(run / "contextuality_layers.csv", f"lmgeom analyze {run}")
    layers = pd.read_csv(run / "contextuality_layers.csv")
    report = json.loads((run / "contextuality.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    raw, adjusted = _wide(layers, "raw"), _wide(layers, "adjusted")
    n_sampled = int(layers.loc[layers["metric"] == "anisotropy_sampled", "n"].min())
    cosine = pd.DataFrame({
        "layer": [f"{layer} ({layer_name(layer)})" for layer in raw.index],
        "baseline exact": raw["anisotropy_exact"].map(_cell),
        f"baseline sampled (n={n_sampled})": raw["anisotropy_sampled"].map(_cell),
        "SelfSim": raw["self_similarity"].map(_cell),
        "SelfSim*": adjusted["self_similarity"].map(_cell),
        "IntraSim": raw["intra_sentence_similarity"].map(_cell),
        "IntraSim*": adjusted["intra_sentence_similarity"].map(_cell),
    })
    mev = pd.DataFrame({"layer": [f"{layer} ({layer_name(layer)})" for layer in raw.index]})
    for variant in MEV_VARIANTS:
        mev[f"{variant}"] = raw[f"mev_{variant}"].map(_cell).to_numpy()
        mev[f"{variant} baseline"] = _wide(layers, "baseline")[f"mev_{variant}"].map(_cell).to_numpy()
        mev[f"{variant}*"] = adjusted[f"mev_{variant}"].map(_cell).to_numpy()
    counts, settings, findings = report["counts"], report["settings"], report["findings"]
    least = findings["least_self_similar"]
    title = (f"### {meta['model_id']} on {meta['corpus_name']} ({meta['dtype']} store)\n\n"
             f"{counts['words_analysed']:,} words in ≥ {settings['min_contexts']} sentences, "
             f"{counts['rows_analysed']:,} tokens analysed ({counts['rows_punctuation_excluded']:,} punctuation excluded), "
             f"{counts['sentences']:,} sentences. Layer 0 = embedding output; * = adjusted (raw − baseline).")
    least_line = (f"Least self-similar words at layer {least['layer']}: "
                  + ", ".join(f"{w} ({s:.3f})" for w, s in zip(least["words"], least["self_similarity"]))
                  + f" — stopword share {least['stopword_share']:.0%} vs {least['stopword_share_among_all_analysed_words']:.0%} "
                  "of all analysed words.")
    return "\n\n".join([title, _markdown(cosine), "MEV (baseline: the same variant on the sampled occurrences):",
                        _markdown(mev), least_line])


def finding_figures(run: Path) -> str:
    """The numbers behind the paper's findings 1-5 that `lmgeom analyze` does not print itself."""
    layers = pd.read_csv(run / "contextuality_layers.csv")
    words = pd.read_csv(run / "contextuality_words.csv", keep_default_na=False, na_values=[""])
    raw, baseline, adjusted = _wide(layers, "raw"), _wide(layers, "baseline"), _wide(layers, "adjusted")
    upper = [layer for layer in raw.index if layer >= 1]
    lines = []
    exact = raw.loc[upper, "anisotropy_exact"]
    lines.append(f"finding 1: anisotropy_exact over layers ≥ 1: min {exact.min():.3f} (layer {exact.idxmin()}), "
                 f"max {exact.max():.3f} (layer {exact.idxmax()}), last layer {exact.iloc[-1]:.3f}; "
                 f"layer 0 (embedding output) {raw.loc[0, 'anisotropy_exact']:.3f}; "
                 f"layers ≥ 1 above layer 0: {int((exact > raw.loc[0, 'anisotropy_exact']).sum())}/{len(upper)}")
    for frame, kind in ((raw, "raw"), (adjusted, "adjusted")):
        self_sim = frame.loc[upper, "self_similarity"]
        lines.append(f"finding 2: SelfSim ({kind}) layer 1 → last: {self_sim.iloc[0]:.3f} → {self_sim.iloc[-1]:.3f}; "
                     f"minimum {self_sim.min():.3f} at layer {self_sim.idxmin()}; "
                     f"Spearman ρ(layer, SelfSim) = {spearmanr(upper, self_sim)[0]:+.2f}")
    shares = []
    for layer in raw.index:
        at = words.loc[(words["layer"] == layer) & words["self_similarity"].notna()]
        lowest = at.nsmallest(10, "self_similarity")["word"].str.lower()
        lowest50 = at.nsmallest(50, "self_similarity")["word"].str.lower()
        shares.append(f"{layer}: {lowest.isin(STOPWORDS).mean():.0%}/{lowest50.isin(STOPWORDS).mean():.0%}")
    overall = words.loc[words["layer"] == 0, "word"].str.lower().isin(STOPWORDS).mean()
    lines.append("finding 3: stopword share of the 10 / 50 least self-similar words, per layer — " + ", ".join(shares)
                 + f" (stopwords are {overall:.0%} of analysed words)")
    intra = adjusted.loc[upper, "intra_sentence_similarity"]
    lines.append(f"finding 4: IntraSim* layer 1 → last: {intra.iloc[0]:.3f} → {intra.iloc[-1]:.3f} (range {intra.min():.3f}–"
                 f"{intra.max():.3f}); Spearman ρ(layer, IntraSim*) = {spearmanr(upper, intra)[0]:+.2f}; "
                 f"IntraSim* − SelfSim* at the last layer {intra.iloc[-1] - adjusted.loc[upper[-1], 'self_similarity']:+.3f}")
    mixed = raw.loc[upper, "mev_centred"] - baseline.loc[upper, "mev_svd_ratio"]
    parts = [f"{variant}* max {adjusted.loc[upper, f'mev_{variant}'].max():.3f} / mean "
             f"{adjusted.loc[upper, f'mev_{variant}'].mean():.3f}" for variant in MEV_VARIANTS]
    lines.append("finding 5: adjusted MEV over layers ≥ 1: " + "; ".join(parts)
                 + f"; per-word centred (PCA) minus svd_ratio baseline (the mix in the PCA version of the released code): "
                 f"max {mixed.max():.3f} / mean {mixed.mean():.3f}")
    return "\n".join(f"- {line}" for line in lines)


_FIRST_BENCHMARKS = ["simlex999", "wordsim353", "google_analogies"]


def static_table(run: Path) -> str:
    files = sorted((run / "static").glob("*.benchmarks.csv"), key=lambda p: int(p.name.split(".")[0]))
    if not files:
        return f"(no static-embedding scores in {run}/static; run `lmgeom static-embeddings {run} --layer L`)"
    scores = pd.concat([pd.read_csv(path) for path in files], ignore_index=True)
    # layer-0 means are the same vectors whichever layer was distilled: keep one row of them
    layer0 = scores["vectors"].str.startswith("layer0_mean")
    scores = pd.concat([scores.loc[layer0].drop_duplicates(["vectors", "benchmark"]), scores.loc[~layer0]])
    scores = scores.loc[~(scores["vectors"].str.startswith("mean (layer 0)"))]
    scores["cell"] = [f"{_cell(s)} ({c}/{t})" for s, c, t in zip(scores["score"], scores["covered"], scores["total"])]
    order = list(dict.fromkeys(scores["vectors"]))
    present = set(scores["benchmark"])
    benchmarks = [name for name in _FIRST_BENCHMARKS if name in present] + sorted(present - set(_FIRST_BENCHMARKS))
    table = scores.pivot(index="vectors", columns="benchmark", values="cell").reindex(index=order, columns=benchmarks).reset_index()
    n_words = scores.groupby("vectors")["n_vectors"].first().reindex(order).to_numpy()
    table.insert(1, "words", n_words)
    return _markdown(table)


def first_word_table(run: Path, layers: list[int], *, n_samples: int = 1000, seed: int = 0) -> str:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tables = commands.add_parser("tables", help="markdown tables of finished runs")
    tables.add_argument("runs", nargs="+", type=Path)
    first_word = commands.add_parser("first-word", help="baselines with and without each sentence's first word")
    first_word.add_argument("run", type=Path)
    first_word.add_argument("--layers", required=True, help="comma-separated layers, e.g. 0,1,12,30")
    arguments = parser.parse_args()
    if arguments.command == "first-word":
        print(first_word_table(arguments.run, [int(layer) for layer in arguments.layers.split(",")]))
        return
    for run in arguments.runs:
        print(contextuality_tables(run))
        print()
        print(finding_figures(run))
        print()
        print(f"Static embeddings ({run}): Spearman ρ for word pairs, 3CosAdd accuracy for analogies; (covered/total)")
        print()
        print(static_table(run))
        print()


if __name__ == "__main__":
    main()
