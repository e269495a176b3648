"""The geometry tables of docs/metrics.md (similarity between layers and models, the intrinsic-
dimension profile over depth, whether it picks the best probing layer, and the controls beside the
trained model) from committed files.

    python benchmarks/reproduce_geometry.py           writes the marked blocks into the doc and
                                                      the CKA heatmaps into docs/reproduction/figures/
    python benchmarks/reproduce_geometry.py --check   exits 1 if the doc differs from the files

Sources: `lmgeom similarity` results (docs/reproduction/results/similarity-*/similarity.json),
`lmgeom geometry` results (docs/reproduction/results/geometry-*/geometry.json) and the layer
experiments' results (docs/reproduction/results/layers-*/results.json), the controls' `lmgeom run
--control` results (docs/reproduction/results/controls-minilm-lee/*/) beside the main job's
(docs/reproduction/results/ethayarajh-minilm-lee/);
`lmgeom lens` and `lmgeom lens-join` results (docs/reproduction/results/lens-*/lens.json, lens_join.json);
`lmgeom ablate` results (docs/reproduction/results/ablation-*/ablation.json);
docs/reproduction/results/COMMANDS.md lists the command of each run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_common import ROOT, RESULTS, Documents, load_json, main, markdown, number  # noqa: E402

DOC = "docs/metrics.md"
FIGURES = ROOT / "docs" / "reproduction" / "figures"
# layer x layer within one model: (results folder, model label)
WITHIN = (("similarity-minilm-lee", "MiniLM"), ("similarity-elmo-brown-lee", "elmo-brown"),
          ("similarity-smollm2-lee", "SmolLM2"), ("similarity-gemma3-lee", "Gemma 3"))
# the deep models' tables show every k-th layer (and the last); their heatmaps show all
TABLE_STEP = {"similarity-smollm2-lee": 5, "similarity-gemma3-lee": 3}
# model x model over the same words: (results folder, label of store a, label of store b)
ACROSS = (("similarity-minilm-smollm2-lee", "MiniLM", "SmolLM2"), ("similarity-minilm-elmo-brown-lee", "MiniLM", "elmo-brown"),
          ("similarity-elmo-brown-smollm2-lee", "elmo-brown", "SmolLM2"), ("similarity-elmo-brown-gemma3-lee", "elmo-brown", "Gemma 3"),
          ("similarity-minilm-gemma3-lee", "MiniLM", "Gemma 3"))
# pairs of `lmgeom compare` shown only in the model x model matrix and as heatmaps (too wide for a table)
PAIRS_ONLY = (("similarity-gemma3-smollm2-lee", "Gemma 3", "SmolLM2"),)
# the model x model matrix: every pair above, by model label
MODELS = ("MiniLM", "SmolLM2", "Gemma 3", "elmo-brown")
# MiniLM x SmolLM2 with and without each sentence's first word (`--exclude-first-word`): (with, without)
FIRST_WORD = ("similarity-minilm-smollm2-lee", "similarity-minilm-smollm2-lee-no-first-word")
# intrinsic-dimension profiles: (results folder, model label)
PROFILES = (("geometry-minilm-lee", "MiniLM"), ("geometry-smollm2-lee", "SmolLM2"),
            ("geometry-gemma3-lee", "Gemma 3"), ("geometry-elmo-brown-lee", "elmo-brown"))
# the layer experiments the probe test reads (mean over 3 seeds)
PROBE_RUNS = ("layers-minilm-cola", "layers-minilm-mrpc", "layers-minilm-pos-full", "layers-smollm2-cola",
              "layers-smollm2-mrpc", "layers-smollm2-pos", "layers-elmo-cola", "layers-elmo-mrpc")


def similarity(run: str) -> dict[str, Any]:
    return load_json(RESULTS / run / "similarity.json")


def _matrix(document: dict[str, Any], measure: str) -> np.ndarray:
    return np.asarray(document["matrices"][measure], dtype=float)


def within_table(run: str) -> str:
    """Linear CKA of one model's layers against each other (every `TABLE_STEP`-th layer and the last)."""
    document = similarity(run)
    layers, cka = document["layers_a"], _matrix(document, "cka")
    step = TABLE_STEP.get(run, 1)
    shown = sorted({*range(0, len(layers), step), len(layers) - 1})
    rows = [[layers[i], *[f"{cka[i, j]:.2f}" for j in shown]] for i in shown]
    return markdown(["layer", *[str(layers[j]) for j in shown]], rows)


def model_matrix() -> str:
    """Model x model over the same Lee words: the debiased CKA of the two last layers, and the pair of
    layers with the highest debiased CKA."""
    pairs = {}
    for run, label_a, label_b in (*ACROSS, *PAIRS_ONLY):
        document = similarity(run)
        debiased = _matrix(document, "cka_debiased")
        best = np.unravel_index(int(np.argmax(debiased)), debiased.shape)
        layer_a, layer_b = document["layers_a"][best[0]], document["layers_b"][best[1]]
        summary = f"{debiased[-1, -1]:.2f}; best {debiased[best]:.2f}"
        pairs[label_a, label_b] = f"{summary} ({layer_a}, {layer_b})"
        pairs[label_b, label_a] = f"{summary} ({layer_b}, {layer_a})"
    rows = [[a, *["—" if a == b else pairs.get((a, b), "not run") for b in MODELS]] for a in MODELS]
    return markdown(["model (row layer first)", *MODELS], rows, align="l" * (len(MODELS) + 1))


def across_table(run: str, label_a: str, label_b: str) -> str:
    """Linear CKA (and the debiased one) of every layer of store b (rows) against every layer of store a."""
    document = similarity(run)
    cka, debiased = _matrix(document, "cka"), _matrix(document, "cka_debiased")
    header = [f"{label_b} layer", *[f"{label_a} {layer}" for layer in document["layers_a"]]]
    rows = [[layer_b, *[f"{cka[i, j]:.2f} ({debiased[i, j]:.2f})" for i in range(len(document["layers_a"]))]]
            for j, layer_b in enumerate(document["layers_b"])]
    return markdown(header, rows)


def matching_counts(run: str, label_a: str, label_b: str) -> str:
    """How the word matching of a model x model run went: matched rows and the rows each side dropped."""
    document = similarity(run)
    counts = document["counts"]
    rows = [[label, f"{counts[side + '_rows']:,}", f"{counts[side + '_rows_analysed']:,}",
             f"{counts[side + '_rows_unmatched']:,}"] for side, label in (("a", label_a), ("b", label_b))]
    table = markdown(["store", "stored rows", "selected rows (words)", "selected rows without a match (dropped)"], rows)
    return (f"{table}\n\nMatched word occurrences: {counts['rows_matched']:,}; RSA, mutual k-NN and the nulls on a "
            f"seeded subsample of {counts['sample']:,} of them.")


def first_word_effect(layer_a: int = 3, layer_b: int = 20) -> str:
    """How SmolLM2's sentence-initial words (its massive activations) move linear CKA against MiniLM."""
    with_first, without = (similarity(run) for run in FIRST_WORD)
    for document in (with_first, without):
        if document["settings"].get("exclude_first_word") != (document is without):
            raise SystemExit(f"{FIRST_WORD}: the second run must be the one with --exclude-first-word")

    def cka(document: dict[str, Any]) -> float:
        matrix = _matrix(document, "cka")
        return float(matrix[document["layers_a"].index(layer_a), document["layers_b"].index(layer_b)])

    def upper(document: dict[str, Any]) -> float:  # SmolLM2's layers 12-29 against every MiniLM layer
        matrix = _matrix(document, "cka")
        columns = [j for j, layer in enumerate(document["layers_b"]) if 12 <= layer <= 29]
        return float(matrix[:, columns].max())

    rows = without["counts"]["rows_matched"], with_first["counts"]["rows_matched"]
    return (f"MiniLM's layer {layer_a} against SmolLM2's layer {layer_b} over the words of all of Lee gives linear CKA "
            f"{cka(with_first):.2f} with the first words ({rows[1]:,} matched rows) and {cka(without):.2f} with "
            f"`--exclude-first-word` ({rows[0]:,}); the highest CKA of SmolLM2's layers 12–29 against any MiniLM "
            f"layer is {upper(with_first):.2f} and {upper(without):.2f}.")


def profile_table(run: str) -> str:
    """Per layer: duplicates removed, TwoNN with its bootstrap interval, MLE and GRIDE at n2 = 64."""
    rows = []
    for layer in load_json(RESULTS / run / "geometry.json")["layers"]:
        estimates = {(e["method"], e["n2"]): e for e in layer["intrinsic_dimension"]}
        twonn = estimates[("twonn", 2)]
        rows.append([layer["layer"], f"{layer['n_duplicates']:,}",
                     f"{twonn['dimension']:.1f} [{twonn['low']:.1f}, {twonn['high']:.1f}]",
                     f"{estimates[('mle', 20)]['dimension']:.1f}" if ("mle", 20) in estimates else "—",
                     f"{estimates[('gride', 64)]['dimension']:.1f}" if ("gride", 64) in estimates else "—"])
    return markdown(["layer", "duplicates", "TwoNN [95 % CI]", "MLE", "GRIDE n2 = 64"], rows)


def probe_tables() -> str:
    """`lmgeom geometry-probes` on the committed profiles and layer experiments, with TwoNN and MLE."""
    from lmgeom.stages.geometry import probe_layer_test

    geometry = [RESULTS / run / "geometry.json" for run, _ in PROFILES]
    experiments = [RESULTS / run / "results.json" for run in PROBE_RUNS]
    twonn, mle = (probe_layer_test(geometry, experiments, method=method) for method in ("twonn", "mle"))
    rows = [[case["model"], case["task"], case["best_layer"], case["peak_layer"],
             "—" if case["minimum_after_peak"] is None else case["minimum_after_peak"], case["n_layers"]]
            for case in twonn["cases"]]
    table = markdown(["model", "task", "best probing layer", "ID peak (Cheng et al. 2025)",
                      "minimum after the peak (Valeriani et al. 2023)", "layers"], rows, align="llrrrr")
    lines = [f"- {method}, {rule}: {outcome['hits']} of {outcome['cases']} hits, {outcome['expected_hits']:.2f} expected "
             f"by chance, p = {outcome['p_value']:.2g}"
             for method, test in (("TwoNN", twonn), ("MLE", mle)) for rule, outcome in test["tests"].items()]
    return table + "\n\n" + "\n".join(lines)


# MiniLM x Lee: the main job's run and its controls (`lmgeom run --control`), (results folder, column label)
CONTROLS = (("ethayarajh-minilm-lee", "trained"), ("controls-minilm-lee/random-init", "random-init"),
            ("controls-minilm-lee/shuffled", "shuffled"))
# (file, metric or measure, value column, table label): the contextuality and isotropy numbers compared
CONTROL_MEASURES = (("contextuality", "anisotropy_exact", "raw", "anisotropy (mean cosine)"),
                    ("contextuality", "self_similarity", "adjusted", "SelfSim adj"),
                    ("contextuality", "intra_sentence_similarity", "adjusted", "IntraSim adj"),
                    ("contextuality", "mev_svd_ratio", "adjusted", "MEV svd_ratio adj"),
                    ("isotropy", "isoscore", "value", "IsoScore"),
                    ("isotropy", "top1_variance_share", "value", "top-1 variance share"))


def _control_values(run: str) -> dict[tuple[str, int], float | None]:
    """(metric or measure, layer) -> value, from a run's contextuality.json and isotropy.json."""
    values: dict[tuple[str, int], float | None] = {}
    for record in load_json(RESULTS / run / "contextuality.json")["records"]:
        for column in ("raw", "adjusted"):
            values[f"{record['metric']}:{column}", int(record["layer"])] = record[column]
    for record in load_json(RESULTS / run / "isotropy.json")["records"]:
        values[f"{record['measure']}:value", int(record["layer"])] = record["value"]
    return values
# the logit lens: (results folder, model label)
LENS_RUNS = (("lens-smollm2-lee", "SmolLM2"), ("lens-gemma3-lee", "Gemma 3"))


def lens_table(run: str) -> str:
    """Per layer of a committed `lmgeom lens` run: mean and median entropy and KL to the last layer
    (nats), the median rank of the actual next token and the top-1 share."""
    document = load_json(RESULTS / run / "lens.json")
    rows = [[r["layer"], number(r["entropy_mean"], 2), number(r["entropy_median"], 2), number(r["kl_mean"], 2),
             number(r["kl_median"], 2), f"{r['rank_median']:.0f}", number(r["top1"])] for r in document["layers"]]
    return markdown(["layer", "entropy mean", "entropy median", "KL mean", "KL median", "rank median", "top-1"], rows)


def lens_join_table(run: str) -> str:
    """Per layer of a committed `lmgeom lens-join`: Spearman's rho of each word occurrence's lens entropy and
    next-token rank with its word's self-similarity, with the bootstrap interval over sentences; and the
    across-layer rho of the mean entropy with the TwoNN dimension."""
    document = load_json(RESULTS / run / "lens_join.json")

    def cell(entry: dict[str, Any]) -> str:
        return f"{number(entry['rho'], 2, signed=True)} [{number(entry['low'], 2, signed=True)}, {number(entry['high'], 2, signed=True)}]"

    rows = [[r["layer"], r["entropy"]["n"], cell(r["entropy"]), cell(r["rank"])] for r in document["by_layer"]]
    table = markdown(["layer", "n", "entropy vs self-similarity", "rank vs self-similarity"], rows)
    across = document.get("across_layers")
    if across:
        table += (f"\n\nLayer-mean entropy against the TwoNN dimension over {len(across['layers'])} layers: "
                  f"rho {cell(across)} (interval resampling layers).")
    return table


def controls_tables() -> dict[str, str]:
    """Per measure, MiniLM x Lee layer by layer: the trained model, its random-init control and its
    shuffled-words control (one table per measure, the three side by side), and the controls' settings."""
    runs = {label: _control_values(run) for run, label in CONTROLS}
    for run, label in CONTROLS[1:]:
        control = load_json(RESULTS / run / "contextuality.json").get("control") or {}
        if control.get("name") != label:
            raise SystemExit(f"{run}: its contextuality.json records control {control.get('name')!r}, not {label!r}")
    layers = sorted({layer for _, layer in runs["trained"]})
    blocks = {}
    for _, metric, column, label in CONTROL_MEASURES:
        rows = [[layer, *[number(runs[name].get((f"{metric}:{column}", layer))) for _, name in CONTROLS]] for layer in layers]
        blocks[f"controls-{metric}"] = markdown([f"{label}: layer", *[name for _, name in CONTROLS]], rows)
    return blocks


# attribution runs (`lmgeom attribute`): (results folder, label)
ATTRIBUTION_RUNS = (("attribution-smollm2-lee", "SmolLM2-135M, lee (300 sentences)"),)


def attribution_table(run: str) -> str:
    """Per layer of an attribution.json: each term's share of the mean direction, of the total variance
    (trace), and of the largest |x| entry, with the layer's largest |x| and the sum rule's residual."""
    document = load_json(RESULTS / run / "attribution.json")
    rows = []
    for record in document["layers"]:
        terms = record["terms"]
        top = record["massive"][0] if record.get("massive") else None
        rows.append([record["layer"], record["sum"],
                     *[number(record["mean_shares"][t], 2, signed=True) for t in terms],
                     *[number(record["variance_shares"][t]["total"], 2, signed=True) for t in terms],
                     *([number(top["shares"][t], 2, signed=True) for t in terms] if top else ["—"] * len(terms)),
                     number(record["max_abs"], 1), f"{record['residual']:.1e}"])
    terms = document["layers"][0]["terms"]
    header = ["layer", "sum", *[f"mean: {t}" for t in terms], *[f"variance: {t}" for t in terms],
              *[f"top |x|: {t}" for t in terms], "max |x|", "residual"]
    return markdown(header, rows, align="ll" + "r" * (3 * len(terms) + 2))


# ablation runs (`lmgeom ablate`): results folders
ABLATION_RUNS = ("ablation-smollm2-lee", "ablation-gemma3-lee", "ablation-minilm-lee")
ABLATION_MEASURES = (("loss", "loss (nats/token)"), ("attention_first_mean", "attention to 1st position"),
                     ("sts_layer", "STS-B ρ×100, ablated layer"), ("sts_last", "STS-B ρ×100, last layer"),
                     ("pos_layer", "POS probe, ablated layer"), ("pos_last", "POS probe, last layer"))


def ablation_tables(run: str) -> dict[str, str]:
    """Two blocks of a committed `lmgeom ablate` run: what the unablated pass found at each (site, layer),
    and each ablation's effect on each measure with its interval, beside the random controls."""
    document = load_json(RESULTS / run / "ablation.json")
    sites = [[r["layer"], r["site"], ", ".join(map(str, r["dimensions"]["rogue"])),
              ", ".join(map(str, r["dimensions"]["outlier"])) or "—", ", ".join(map(str, r["dimensions"]["massive"])) or "—",
              r["massive_entries"], number(r["massive_cutoff"], 1), number(r["max_abs"], 1), number(r["median_abs"], 3)]
             for r in document["sites"]]
    found = markdown(["layer", "site", "rogue dims", "outlier dims", "massive dims", "massive entries", "cutoff",
                      "max \\|h\\|", "median \\|h\\|"], sites, align="llllrrrrr")

    def interval(effect: dict[str, Any], key: str) -> str:
        low, high = effect.get(f"{key}_low"), effect.get(f"{key}_high")
        value = effect.get(key)
        if value is None:
            return "—"
        return number(value, 3, signed=True) + (f" [{number(low, 3, signed=True)}, {number(high, 3, signed=True)}]"
                                                if low is not None else "")

    rows = []
    for config in document["configs"]:
        for key, label in ABLATION_MEASURES:
            effect = config["effects"].get(key)
            if effect is None:
                continue
            randoms = effect.get("random") or []
            rows.append([config["layer"], config["site"], config["dims_kind"], config["how"],
                         f"{config['n_dims']} / {config['n_edited']:,}", label, number(effect["base"], 3),
                         number(effect["ablated"], 3), interval(effect, "delta"),
                         (f"{number(min(randoms) - effect['base'], 3, signed=True)} … "
                          f"{number(max(randoms) - effect['base'], 3, signed=True)}") if randoms else "—",
                         interval(effect, "excess")])
    effects_table = markdown(["layer", "site", "dims", "how", "dims / entries", "measure", "unablated", "ablated",
                              "Δ [95% CI]", "random Δ (min … max)", "Δ beyond random [95% CI]"], rows,
                             align="llllllrrrrr")
    trivial = document.get("trivial") or {}
    lines = []
    if "loss_unigram" in trivial:
        lines.append(f"unigram model of the same tokens: {number(trivial['loss_unigram'], 3)} nats/token")
    if "pos_most_frequent_tag" in trivial:
        lines.append(f"most-frequent-tag baseline: {number(trivial['pos_most_frequent_tag'], 3)}")
    counts = document["counts"]
    tokens = (f"{counts['n_predicted_tokens']:,} predicted tokens" if "loss_unigram" in trivial
              else f"{counts['n_positions']:,} positions")
    lines.append(f"{counts['n_sentences']} sentences, {tokens}, {counts['n_model_states']} model states, "
                 f"{document['seconds']:.0f} s")
    return {f"{run}-sites": found, run: effects_table + "\n\nTrivial baselines and size: " + "; ".join(lines) + "."}


def build() -> Documents:
    blocks = {run: within_table(run) for run, _ in WITHIN}
    blocks.update({run: attribution_table(run) for run, _ in ATTRIBUTION_RUNS})
    for run in ABLATION_RUNS:
        if (RESULTS / run / "ablation.json").exists():
            blocks.update(ablation_tables(run))
    for run, label_a, label_b in ACROSS:
        blocks[run] = across_table(run, label_a, label_b)
        blocks[f"{run}-rows"] = matching_counts(run, label_a, label_b)
    blocks["first-word-cka"] = first_word_effect()
    blocks["model-matrix"] = model_matrix()
    blocks.update({f"id-{run}": profile_table(run) for run, _ in PROFILES})
    blocks["id-probes"] = probe_tables()
    blocks.update(controls_tables())
    for run, _ in LENS_RUNS:
        blocks[run] = lens_table(run)
        if (RESULTS / run / "lens_join.json").exists():
            blocks[f"{run}-join"] = lens_join_table(run)
    return {DOC: blocks}


def write_figures() -> list[Path]:
    """A linear-CKA heatmap per committed similarity run (docs/reproduction/figures/cka-<run>.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    written = []
    for run, title, labels in ([(run, f"{label}, layer × layer", (label, label)) for run, label in WITHIN]
                               + [(run, f"{a} × {b}", (a, b)) for run, a, b in (*ACROSS, *PAIRS_ONLY)]):
        document = similarity(run)
        cka = _matrix(document, "cka")
        figure, axes = plt.subplots(figsize=(5.2, 4.4) if len(document["layers_b"]) > 10 else (4.2, 3.6))
        image = axes.imshow(cka.T, origin="lower", vmin=0, vmax=1, cmap="viridis", aspect="auto")
        step_a = 1 if len(document["layers_a"]) <= 10 else 5
        step_b = 1 if len(document["layers_b"]) <= 10 else 5
        axes.set_xticks(range(0, len(document["layers_a"]), step_a), [str(v) for v in document["layers_a"][::step_a]])
        axes.set_yticks(range(0, len(document["layers_b"]), step_b), [str(v) for v in document["layers_b"][::step_b]])
        axes.set_xlabel(f"{labels[0]} layer")
        axes.set_ylabel(f"{labels[1]} layer")
        axes.set_title(f"linear CKA, Lee: {title}", fontsize=10)
        figure.colorbar(image, ax=axes)
        figure.tight_layout()
        path = FIGURES / f"cka-{run.removeprefix('similarity-')}.png"
        figure.savefig(path, dpi=100, metadata={"Software": None})
        plt.close(figure)
        written.append(path)
    return written


if __name__ == "__main__":
    status = main(build)
    if status == 0 and "--check" not in sys.argv[1:]:
        for path in write_figures():
            print(f"{path.relative_to(ROOT)} written")
    raise SystemExit(status)
