"""The tables of docs/reproduction/elmo.md (Peters et al. 2018) from docs/reproduction/results/.

    python benchmarks/reproduce_peters2018.py           writes the marked blocks into elmo.md
    python benchmarks/reproduce_peters2018.py --check   exits 1 if elmo.md differs from the results

Sources: `lmgeom experiment layers` results (layers-*, peters-*) and `lmgeom experiment wsd`
(peters-elmo-wsd). docs/reproduction/results/COMMANDS.md lists the command of each run.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_common import Documents, main, markdown, number, p_text, results  # noqa: E402

DOC = "docs/reproduction/elmo.md"

SPLIT_METRIC_LABEL = {("test", "accuracy"): "test accuracy", ("test", "f1"): "test F1", ("dev", "accuracy"): "dev accuracy",
                      ("dev", "f1"): "dev F1", ("dev", "matthews"): "dev MCC", ("dev_out_of_domain", "matthews"): "dev out-of-domain MCC"}


# Peters et al. (2018), "Deep contextualized word representations", NAACL 2018 (arXiv:1802.05365v2),
# transcribed from the text of the arXiv v2 PDF (github.com/nassersala/arabic-abstracts,
# full_papers/elmo-2018/elmo_full_text.txt at 18a60af9553e0ef4470a61349f50f495a5bb8892) and checked
# against a second transcription of the same version's tables. Table 5 is the same in the ICLR 2018
# submission; that submission's Tables 2 and 6 print other numbers (not used here).
PETERS_TABLE2 = {  # development set; task -> (baseline, last only, all layers lambda=1, all layers lambda=0.001)
    "SQuAD (F1)": (80.8, 84.7, 85.0, 85.2),
    "SNLI (accuracy)": (88.1, 89.1, 89.3, 89.5),
    "SRL (F1)": (81.6, 84.1, 84.6, 84.8),
}
PETERS_TABLE5 = {  # all-words fine-grained WSD F1, SemCor 3.0 training, Raganato et al.'s framework
    "WordNet 1st Sense Baseline": 65.9, "Raganato et al. (2017a)": 69.9, "Iacobacci et al. (2016)": 70.1,
    "CoVe, First Layer": 59.4, "CoVe, Second Layer": 64.7, "biLM, First layer": 67.4, "biLM, Second layer": 69.0,
}
PETERS_TABLE6 = {  # test set POS tagging accuracy, PTB (WSJ), linear classifier on one layer
    "Collobert et al. (2011)": 97.3, "Ma and Hovy (2016)": 97.6, "Ling et al. (2015)": 97.8,
    "CoVe, First Layer": 93.3, "CoVe, Second Layer": 92.8, "biLM, First Layer": 97.3, "biLM, Second Layer": 96.8,
}
# The trivial baselines of the whole MRPC dev and test splits (the all-positive prediction does not
# depend on training); the layers-*-mrpc runs record none, calib-minilm-mrpc scores the same splits.
MRPC_TRIVIAL_RUN = "calib-minilm-mrpc"


def _summaries(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in document["summaries"] if s.get("method", "none") == "none"]


def _find(document: dict[str, Any], features: str, split: str, metric: str) -> dict[str, Any]:
    for summary in _summaries(document):
        if (summary["features"], summary["split"], summary["metric"]) == (features, split, metric):
            return summary
    raise KeyError(f"no summary for {features} {split} {metric}")


def _trivial(document: dict[str, Any], split: str, metric: str) -> dict[str, Any] | None:
    """The trivial baseline of a split and metric (for F1 the all-positive prediction, which F1 is about)."""
    rows = [row for row in document.get("trivial_baselines") or [] if (row["split"], row["metric"]) == (split, metric)]
    rows.sort(key=lambda row: row["baseline"] != "all positive")
    return rows[0] if rows else None


def _holm(p_values: Sequence[float]) -> list[float]:
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _seed_values(document: dict[str, Any], features: str, split: str, metric: str) -> dict[int, float]:
    return {r["seed"]: r["value"] for r in document["records"] if r.get("method", "none") == "none"
            and (r["features"], r["split"], r["metric"]) == (features, split, metric)}


def _paired_t(differences: Sequence[float]) -> float:
    """Two-sided p of the paired t-test on per-seed differences (df = seeds - 1)."""
    n = len(differences)
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1)) if n > 1 else 0.0
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1))


def seed_tests(document: dict[str, Any]) -> dict[tuple[str, str, str], tuple[list[float], float, float]]:
    """Each row with a pooled test against the top layer, tested again with the seed as the unit: the
    per-seed differences of the metric (row minus top, same seed), the paired t-test's two-sided p and
    its Holm correction over the same family as the pooled test (the rows of one split and metric)."""
    families: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for summary in _summaries(document):
        if summary.get("difference") is not None:
            families.setdefault((summary["split"], summary["metric"]), []).append(summary)
    out = {}
    for (split, metric), rows in families.items():
        found = []
        for summary in rows:
            base = summary["baseline"].split("=", 1)[1]
            ours, top = _seed_values(document, summary["features"], split, metric), _seed_values(document, base, split, metric)
            seeds = sorted(set(ours) & set(top))
            differences = [ours[k] - top[k] for k in seeds]
            found.append((summary["features"], differences, _paired_t(differences)))
        for (features, differences, p), p_holm in zip(found, _holm([f[2] for f in found])):
            out[(features, split, metric)] = (differences, p, p_holm)
    return out


def seed_item_tests(document: dict[str, Any]) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """Each row's crossed seeds x examples bootstrap against the top layer (`seed_item` of results.json, kept
    by runs made since it exists): its interval and its p, Holm-corrected over the rows of one split and
    metric that are tests of their own (a row identical to the top layer is none). Empty for older runs."""
    families: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for summary in _summaries(document):
        if summary.get("seed_item") and summary.get("p_holm") is not None:
            families.setdefault((summary["split"], summary["metric"]), []).append(summary)
    out = {}
    for (split, metric), rows in families.items():
        distinct = [row for row in rows if not row.get("holm_duplicate_of")]  # a twin (static = layer:0) counts once
        adjusted = dict(zip((row["features"] for row in distinct), _holm([row["seed_item"]["p_value"] for row in distinct])))
        for row in rows:
            p_holm = adjusted[row.get("holm_duplicate_of") or row["features"]]
            out[(row["features"], split, metric)] = (row["seed_item"]["low"], row["seed_item"]["high"], p_holm)
    return out


def _seed_p(tests: dict[tuple[str, str, str], tuple[list[float], float, float]], features: str, split: str,
            metric: str) -> str:
    _, _, p_holm = tests[(features, split, metric)]
    return p_text(p_holm, p_holm < 0.05)


def _mean_std(summary: dict[str, Any]) -> str:
    dagger = " †" if summary.get("uninformative") else ""
    return f"{summary['mean']:.4f} ± {summary['std']:.4f}{dagger}"


def layer_table(run: str, columns: Sequence[tuple[str, str]]) -> str:
    """One row per feature set: mean ± std over seeds, Δ (pooled, against the top layer), the
    Holm-corrected p of the paired permutation test on the pooled predictions and that of the paired
    t-test over seeds, per (split, metric); then the trivial baselines if recorded."""
    document = results(run)
    tests = seed_tests(document)
    crossed = seed_item_tests(document)
    features = list(dict.fromkeys(s["features"] for s in _summaries(document)))
    header = ["features"]
    for split, metric in columns:
        header += [SPLIT_METRIC_LABEL[(split, metric)], "Δ", "p (Holm)", "p seeds (Holm)"]
        if crossed:
            header.append("seeds × examples: 95% CI, p (Holm)")
    rows = []
    for name in features:
        row = [name]
        for split, metric in columns:
            summary = _find(document, name, split, metric)
            if summary.get("difference") is None:
                row += [_mean_std(summary), "baseline", "", ""] + ([""] if crossed else [])
            else:
                row += [_mean_std(summary), number(summary["difference"], 4, signed=True),
                        p_text(summary.get("p_holm"), summary.get("significant")), _seed_p(tests, name, split, metric)]
                if crossed:
                    found = crossed.get((name, split, metric))
                    row.append("" if found is None else
                               f"[{number(found[0], 4, signed=True)}, {number(found[1], 4, signed=True)}], "
                               f"{p_text(found[2], found[2] < 0.05)}")
        rows.append(row)
    trivial = [_trivial(document, split, metric) for split, metric in columns]
    if any(trivial):
        row = ["trivial: " + ", ".join(dict.fromkeys(t["baseline"] for t in trivial if t))]
        for t in trivial:
            row += [number(t["value"], 4) if t else "", "", "", ""] + ([""] if crossed else [])
        rows.append(row)
    return markdown(header, rows, align="l" + "r" * (len(header) - 1))


def mix_weights(run: str, features: str = "mix") -> str:
    """The learned mix over the seeds: γ and each layer's softmax weight (layer 0 first) as the mean
    with the range over seeds, and which two layers weigh most in how many seeds, from the records."""
    document = results(run)
    seen: dict[int, dict[str, Any]] = {}
    for record in document["records"]:
        if record["features"] == features and record.get("mix_weights") is not None:
            seen.setdefault(record["seed"], record)
    chosen = [seen[seed] for seed in sorted(seen)]
    gammas = [record["mix_gamma"] for record in chosen]
    weights = [record["mix_weights"] for record in chosen]
    n_layers = len(weights[0])
    per_layer = [[w[j] for w in weights] for j in range(n_layers)]
    pairs: dict[tuple[int, ...], int] = {}
    for w in weights:
        pair = tuple(sorted(sorted(range(n_layers), key=lambda j: -w[j])[:2]))
        pairs[pair] = pairs.get(pair, 0) + 1
    pair_text = "; ".join(f"layers {a} and {b} in {count}" for (a, b), count in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])))
    shares = [w[a] + w[b] for w in weights for (a, b) in [tuple(sorted(range(n_layers), key=lambda j: -w[j])[:2])]]
    return (f"- {len(chosen)} seeds; γ = {sum(gammas) / len(gammas):.3f} ({min(gammas):.3f}–{max(gammas):.3f})\n"
            f"- weights, layers 0–{n_layers - 1} (mean, min–max over seeds): "
            + ", ".join(f"{sum(v) / len(v):.3f} ({min(v):.3f}–{max(v):.3f})" for v in per_layer)
            + f" (uniform: {1 / n_layers:.3f})\n"
            f"- the two largest: {pair_text} of {len(chosen)} seeds ({min(shares):.3f}–{max(shares):.3f} together)")


ABLATION_LABELS = {"top": "last only", "mix l2=1": "all layers, λ = 1", "mix l2=0.001": "all layers, λ = 0.001",
                   "mix l2=1 ln": "all layers, λ = 1, layer norm", "mix l2=0.001 ln": "all layers, λ = 0.001, layer norm"}
# model -> (its column label, POS run, MRPC run)
ABLATION_RUNS = {"elmo": ("elmo-brown", "peters-elmo-pos", "peters-elmo-mrpc"),
                 "minilm": ("MiniLM", "peters-minilm-pos", "peters-minilm-mrpc")}


def ablation_table(model: str = "elmo") -> str:
    """Peters et al.'s Table 2 in our probe: last only vs the four mixes, POS and MRPC."""
    label, pos_run, mrpc_run = ABLATION_RUNS[model]
    pos, mrpc = results(pos_run), results(mrpc_run)
    tests = {id(pos): seed_tests(pos), id(mrpc): seed_tests(mrpc)}
    crossed = {id(pos): seed_item_tests(pos), id(mrpc): seed_item_tests(mrpc)}
    columns = [(pos, "test", "accuracy"), (mrpc, "test", "f1"), (mrpc, "test", "accuracy")]
    rows = []
    for features, row_label in ABLATION_LABELS.items():
        row = [row_label]
        for document, split, metric in columns:
            summary = _find(document, features, split, metric)
            cell = _mean_std(summary)
            if summary.get("difference") is not None:
                p = p_text(summary.get("p_holm"), summary.get("significant"))
                seeds = _seed_p(tests[id(document)], features, split, metric)
                found = crossed[id(document)].get((features, split, metric))
                both = "" if found is None else (f"; seeds × examples [{number(found[0], 4, signed=True)}, "
                                                 f"{number(found[1], 4, signed=True)}], p {p_text(found[2], found[2] < 0.05)}")
                dagger = " †" if summary.get("uninformative") else ""
                cell = (f"{summary['mean']:.4f} ± {summary['std']:.4f} ({number(summary['difference'], 4, signed=True)}, "
                        f"p {p}; seeds p {seeds}{both}){dagger}")
            row.append(cell)
        rows.append(row)
    trivial = []
    for document, split, metric in columns:
        t = _trivial(document, split, metric)
        trivial.append("" if t is None else f"{t['baseline']} {t['value']:.4f}")
    rows.append(["trivial baseline", *trivial])
    return markdown([label, "POS test accuracy", "MRPC test F1", "MRPC test accuracy"], rows, align="llll")


def ablation_mix_weights(run: str) -> str:
    """The learned weights of each of the four mixes, per seed."""
    return "\n".join(f"- {f}:\n" + "\n".join("  " + line for line in mix_weights(run, f).splitlines())
                     for f in ("mix l2=1", "mix l2=0.001", "mix l2=1 ln", "mix l2=0.001 ln"))


def _p_bound(p: float) -> str:
    return "p < 1e-300" if p == 0 else f"p {p:.3g}"


def ablation_trivial_tests(model: str) -> str:
    """Each ablation row against its task's trivial baseline (the experiment's test per seed, the
    largest p over seeds), the tests named below the table; then the range of the MRPC mixes' weights."""
    label, pos_run, mrpc_run = ABLATION_RUNS[model]
    pos, mrpc = results(pos_run), results(mrpc_run)
    columns = [(pos, "POS", "test", "accuracy"), (mrpc, "MRPC", "test", "f1"), (mrpc, "MRPC", "test", "accuracy")]
    tests: dict[str, int] = {}
    rows = []
    for features, row_label in ABLATION_LABELS.items():
        row = [row_label]
        for document, _, split, metric in columns:
            trivial = _find(document, features, split, metric)["trivial"]
            mark = tests.setdefault(trivial["test"], len(tests) + 1)
            row.append(f"{'beats' if trivial['beats'] else 'does not beat'} it, {_p_bound(trivial['p_value'])} ({mark})")
        rows.append(row)
    header = [f"{label} against the trivial baseline"]
    for document, task, split, metric in columns:
        baseline = _trivial(document, split, metric)
        header.append(f"{task} {split} {SPLIT_METRIC_LABEL[(split, metric)].split()[-1]}"
                      + ("" if baseline is None else f" ({baseline['baseline']} {baseline['value']:.4f})"))
    notes = [f"({mark}) {test}." for test, mark in tests.items()]
    mixes = [record["mix_weights"] for record in mrpc["records"] if record.get("mix_weights")]
    weights = [w for mix in mixes for w in mix]
    notes.append(f"On MRPC every mix's weights (every seed) lie within {min(weights):.3f}–{max(weights):.3f} "
                 f"(uniform over its {len(mixes[0])} layers: {1 / len(mixes[0]):.3f}).")
    return markdown(header, rows, align="llll") + "\n\n" + "\n\n".join(notes)


def _best_single(document: dict[str, Any], split: str, metric: str) -> dict[str, Any]:
    singles = [s for s in _summaries(document) if s["split"] == split and s["metric"] == metric
               and s["features"].startswith("layer:")]
    return max(singles, key=lambda s: s["mean"])


def reading_table() -> str:
    """Best single layer, top, mix and the mix's test against the top, per model and task."""
    runs = [("MiniLM (6 layers)", "POS", "layers-minilm-pos-full", "test", "accuracy", None),
            ("SmolLM2 (30 layers)", "POS", "layers-smollm2-pos", "test", "accuracy", None),
            ("elmo-brown (2 biLSTM layers)", "POS", "layers-elmo-pos", "test", "accuracy", None),
            ("MiniLM", "CoLA, in-domain MCC", "layers-minilm-cola", "dev", "matthews", None),
            ("SmolLM2", "CoLA, in-domain MCC", "layers-smollm2-cola", "dev", "matthews", None),
            ("elmo-brown", "CoLA, in-domain MCC", "layers-elmo-cola", "dev", "matthews", None),
            ("MiniLM", "MRPC, test accuracy", "layers-minilm-mrpc", "test", "accuracy", "f1"),
            ("SmolLM2", "MRPC, test accuracy", "layers-smollm2-mrpc", "test", "accuracy", "f1"),
            ("elmo-brown", "MRPC, test accuracy", "layers-elmo-mrpc", "test", "accuracy", "f1")]
    rows = []
    for model, task, run, split, metric, also in runs:
        document = results(run)
        tests = seed_tests(document)
        best = _best_single(document, split, metric)
        top, mix = _find(document, "top", split, metric), _find(document, "mix", split, metric)
        singles = [s for s in _summaries(document) if s["split"] == split and s["metric"] == metric
                   and s["features"].startswith("layer:")]
        worst = min(singles, key=lambda s: s["mean"])
        top_note = " (worst)" if top["mean"] <= worst["mean"] else ""
        mix_note = " (above every layer)" if mix["mean"] > best["mean"] else ""
        test = f"{number(mix['difference'], 3, signed=True)}{' *' if mix['significant'] else ', n.s.'}"
        crossed = seed_item_tests(document)
        n_seeds = len(document["settings"]["seeds"])

        def seed_test(metric_: str) -> str:
            seed_p = tests[("mix", split, metric_)][2]
            text = f"{seed_p:.3g}{' *' if seed_p < 0.05 else ', n.s.'}"
            found = crossed.get(("mix", split, metric_))
            if found is not None:
                text += (f"; [{number(found[0], 3, signed=True)}, {number(found[1], 3, signed=True)}], "
                         f"{found[2]:.3g}{' *' if found[2] < 0.05 else ', n.s.'}")
            return text

        seeds = f"{n_seeds}: {seed_test(metric)}"
        if also:
            other = _find(document, "mix", split, also)
            test += f" (F1 {number(other['difference'], 3, signed=True)}{' *' if other['significant'] else ', n.s.'})"
            seeds += f" (F1 {seed_test(also)})"
        dagger = {id(row): " †" if row.get("uninformative") else "" for row in (best, top, mix)}
        rows.append([model, task, f"{best['features'].replace('layer:', 'layer ')}, {best['mean']:.4f}{dagger[id(best)]}",
                     f"{top['mean']:.4f}{top_note}{dagger[id(top)]}", f"{mix['mean']:.4f}{mix_note}{dagger[id(mix)]}",
                     test, seeds])
    table = markdown(["model", "task", "best single layer (mean)", "top layer", "learned mix",
                      "mix vs top (pooled Δ, permutation test, Holm)",
                      "seeds: mix vs top (paired t over seeds, Holm p; seeds × examples 95% CI, Holm p)"],
                     rows, align="lllllll")
    trivial = results(MRPC_TRIVIAL_RUN)["trivial_baselines"]
    positive = {row["metric"]: row["value"] for row in trivial if row["baseline"] == "all positive" and row["split"] == "test"}
    lines = []
    for model, _, run, split, metric, also in runs:
        if also is None:
            continue
        document = results(run)
        found = {(f, m): _find(document, f, split, m) for f in ("top", "mix") for m in (metric, also)}

        def against(features: str, metric_: str) -> str:
            summary = found[(features, metric_)]
            verdict = summary.get("trivial")
            if verdict is None:  # a run made before the experiment tested it: the mean set against it
                return f"not tested, {'below' if summary['mean'] < positive[metric_] else 'above'} it"
            return (f"{'beats it' if verdict['beats'] else 'does not beat it'} in every seed, largest p over seeds "
                    f"{verdict['p_value']:.2g}")

        lines.append(f"{model}: top-layer test F1 {found[('top', also)]['mean']:.4f} ({against('top', also)}), "
                     f"mix {found[('mix', also)]['mean']:.4f} ({against('mix', also)}); "
                     f"top-layer test accuracy {found[('top', metric)]['mean']:.4f} ({against('top', metric)})")
    note = (f"† : the row does not beat its trivial baseline in every seed, or its top layer does not. MRPC test, "
            f"the all-positive prediction (the same 1,725 test pairs): F1 {positive['f1']:.4f}, accuracy "
            f"{positive['accuracy']:.4f}; against it (the experiment's tests per seed): " + "; ".join(lines) + ".")
    return table + "\n\n" + note


def wsd_tables() -> dict[str, str]:
    document = results("peters-elmo-wsd")
    sets = document["settings"]["datasets"]
    header = ["", *sets, "ALL"]
    coverage = ["covered / instances",
                *[f"{document['coverage'][name]['covered']:,} / {document['coverage'][name]['instances']:,}" for name in sets],
                f"{document['coverage']['ALL']['covered']:,} / {document['coverage']['ALL']['instances']:,}"]
    rows = [coverage]
    for row in document["scores"]:
        rows.append([row["label"], *[f"{100 * row['f1'][name]:.1f}" for name in [*sets, "ALL"]]])
    table = markdown(header, rows)
    tests = []
    for test in document["tests"]:
        tests.append([test["comparison"], test["subset"], f"{test['n']:,}", f"{test['only_first']:,}",
                      f"{test['only_second']:,}", f"{test['p_value']:.3g}",
                      p_text(test["p_holm"], test["p_holm"] < 0.05)])
    test_table = markdown(["comparison (first vs second)", "instances", "n", "only first correct", "only second correct",
                           "exact McNemar p (two-sided)", "p (Holm)"], tests, align="llrrrrr")
    return {"wsd-f1": table, "wsd-tests": test_table}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def published_table2() -> str:
    """Peters et al.'s Table 2 in its layout, and our ablation's means (x 100) in the same columns."""
    rows: list[list[str]] = [[f"Peters et al.: {task}, dev", *(f"{v:.1f}" for v in values)]
                             for task, values in PETERS_TABLE2.items()]
    features = ["top", "mix l2=1", "mix l2=0.001"]
    for model in ("elmo", "minilm"):
        label, pos_run, mrpc_run = ABLATION_RUNS[model]
        for run, task, split, metric in ((pos_run, "EWT POS (accuracy)", "test", "accuracy"),
                                         (mrpc_run, "MRPC subsample (F1)", "test", "f1")):
            document = results(run)
            trivial = _trivial(document, split, metric)
            summaries = [_find(document, f, split, metric) for f in features]
            dagger = " †" if any(s.get("uninformative") for s in summaries) else ""
            rows.append([f"{label}: {task}, test{dagger}",
                         "—" if trivial is None else f"{_pct(trivial['value'])} ({trivial['baseline']})",
                         *(_pct(s["mean"]) for s in summaries)])
    return markdown(["Task", "Baseline", "Last Only", "All layers, λ=1", "All layers, λ=0.001"], rows, align="lrrrr")


def published_table5() -> str:
    """Peters et al.'s Table 5 in its layout, our elmo-brown F1 (ALL) beside the rows we ran."""
    scores = {row["label"]: row["f1"]["ALL"] for row in results("peters-elmo-wsd")["scores"]}
    ours = {"WordNet 1st Sense Baseline": "WordNet first sense", "biLM, First layer": "layer 1",
            "biLM, Second layer": "layer 2"}
    rows = [[model, f"{value:.1f}", _pct(scores[ours[model]]) if model in ours else "—"]
            for model, value in PETERS_TABLE5.items()]
    rows += [["layer 0 (character CNN)", "—", _pct(scores["layer 0"])],
             ["most frequent training sense", "—", _pct(scores["most frequent training sense"])]]
    return markdown(["Model", "F1, Peters et al. (SemCor; four test sets)", "F1, elmo-brown (ALL; leave one set out)"],
                    rows, align="lrr")


def published_table6() -> str:
    """Peters et al.'s Table 6 in its layout, our elmo-brown accuracy (mean over seeds) beside it."""
    document = results("layers-elmo-pos")
    mean = {s["features"]: s["mean"] for s in _summaries(document) if (s["split"], s["metric"]) == ("test", "accuracy")}
    ours = {"biLM, First Layer": "layer:1", "biLM, Second Layer": "layer:2"}
    rows = [[model, f"{value:.1f}", _pct(mean[ours[model]]) if model in ours else "—"]
            for model, value in PETERS_TABLE6.items()]
    trivial = _trivial(document, "test", "accuracy")
    rows += [["layer 0 (character CNN)", "—", _pct(mean["layer:0"])], ["learned mix", "—", _pct(mean["mix"])]]
    if trivial is not None:
        rows.append([trivial["baseline"], "—", _pct(trivial["value"])])
    n_seeds = len(document["settings"]["seeds"])
    return markdown(["Model", "Acc., Peters et al. (PTB WSJ test)", f"Acc., elmo-brown (UD EWT test, mean of {n_seeds} seeds)"],
                    rows, align="lrr")


def build() -> Documents:
    blocks = {
        "minilm-pos-full": layer_table("layers-minilm-pos-full", [("test", "accuracy")]),
        "minilm-pos-full-mix": mix_weights("layers-minilm-pos-full"),
        "minilm-pos-subsample": layer_table("layers-minilm-pos", [("test", "accuracy")]),
        "minilm-pos-subsample-mix": mix_weights("layers-minilm-pos"),
        "elmo-pos": layer_table("layers-elmo-pos", [("test", "accuracy")]),
        "elmo-pos-mix": mix_weights("layers-elmo-pos"),
        "smollm2-pos": layer_table("layers-smollm2-pos", [("test", "accuracy")]),
        "smollm2-pos-mix": mix_weights("layers-smollm2-pos"),
        "minilm-cola": layer_table("layers-minilm-cola", [("dev", "matthews"), ("dev_out_of_domain", "matthews")]),
        "minilm-cola-mix": mix_weights("layers-minilm-cola"),
        "minilm-mrpc": layer_table("layers-minilm-mrpc", [("dev", "accuracy"), ("dev", "f1"), ("test", "accuracy"), ("test", "f1")]),
        "minilm-mrpc-mix": mix_weights("layers-minilm-mrpc"),
        "elmo-cola": layer_table("layers-elmo-cola", [("dev", "matthews"), ("dev_out_of_domain", "matthews")]),
        "elmo-cola-mix": mix_weights("layers-elmo-cola"),
        "elmo-mrpc": layer_table("layers-elmo-mrpc", [("dev", "accuracy"), ("dev", "f1"), ("test", "accuracy"), ("test", "f1")]),
        "elmo-mrpc-mix": mix_weights("layers-elmo-mrpc"),
        "smollm2-cola": layer_table("layers-smollm2-cola", [("dev", "matthews"), ("dev_out_of_domain", "matthews")]),
        "smollm2-cola-mix": mix_weights("layers-smollm2-cola"),
        "smollm2-mrpc": layer_table("layers-smollm2-mrpc", [("dev", "accuracy"), ("dev", "f1"), ("test", "accuracy"), ("test", "f1")]),
        "smollm2-mrpc-mix": mix_weights("layers-smollm2-mrpc"),
        "peters-ablation": ablation_table("elmo"),
        "peters-ablation-mix-pos": ablation_mix_weights("peters-elmo-pos"),
        "peters-ablation-minilm": ablation_table("minilm"),
        "peters-ablation-minilm-mix-pos": ablation_mix_weights("peters-minilm-pos"),
        "peters-ablation-minilm-trivial": ablation_trivial_tests("minilm"),
        "peters-reading": reading_table(),
        "peters-table2-published": published_table2(),
        "peters-table5-published": published_table5(),
        "peters-table6-published": published_table6(),
    }
    blocks.update(wsd_tables())
    return {DOC: blocks}


if __name__ == "__main__":
    raise SystemExit(main(build))
