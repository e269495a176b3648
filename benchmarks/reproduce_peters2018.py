"""The tables of docs/reproduction/elmo.md (Peters et al. 2018) from docs/reproduction/results/.

    python benchmarks/reproduce_peters2018.py           writes the marked blocks into elmo.md
    python benchmarks/reproduce_peters2018.py --check   exits 1 if elmo.md differs from the results

Sources: `lmgeom experiment layers` results (layers-*, peters-*) and `lmgeom experiment wsd`
(peters-elmo-wsd). docs/reproduction/results/COMMANDS.md lists the command of each run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_common import Documents, main, markdown, number, p_text, results  # noqa: E402

DOC = "docs/reproduction/elmo.md"

SPLIT_METRIC_LABEL = {("test", "accuracy"): "test accuracy", ("test", "f1"): "test F1", ("dev", "accuracy"): "dev accuracy",
                      ("dev", "f1"): "dev F1", ("dev", "matthews"): "dev MCC", ("dev_out_of_domain", "matthews"): "dev out-of-domain MCC"}


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


def _mean_std(summary: dict[str, Any]) -> str:
    dagger = " †" if summary.get("uninformative") else ""
    return f"{summary['mean']:.4f} ± {summary['std']:.4f}{dagger}"


def layer_table(run: str, columns: Sequence[tuple[str, str]]) -> str:
    """One row per feature set: mean ± std over seeds, Δ (pooled, against the top layer) and the
    Holm-corrected p of the paired test, per (split, metric); then the trivial baselines if recorded."""
    document = results(run)
    features = list(dict.fromkeys(s["features"] for s in _summaries(document)))
    header = ["features"]
    for split, metric in columns:
        header += [SPLIT_METRIC_LABEL[(split, metric)], "Δ", "p (Holm)"]
    rows = []
    for name in features:
        row = [name]
        for split, metric in columns:
            summary = _find(document, name, split, metric)
            if summary.get("difference") is None:
                row += [_mean_std(summary), "baseline", ""]
            else:
                row += [_mean_std(summary), number(summary["difference"], 4, signed=True),
                        p_text(summary.get("p_holm"), summary.get("significant"))]
        rows.append(row)
    trivial = [_trivial(document, split, metric) for split, metric in columns]
    if any(trivial):
        row = ["trivial: " + ", ".join(dict.fromkeys(t["baseline"] for t in trivial if t))]
        for t in trivial:
            row += [number(t["value"], 4) if t else "", "", ""]
        rows.append(row)
    return markdown(header, rows, align="l" + "r" * (len(header) - 1))


def mix_weights(run: str, features: str = "mix") -> str:
    """The learned mix per seed: γ and the softmax weights (layer 0 first), from the records."""
    document = results(run)
    seen: dict[int, dict[str, Any]] = {}
    for record in document["records"]:
        if record["features"] == features and record.get("mix_weights") is not None:
            seen.setdefault(record["seed"], record)
    lines = []
    for seed in sorted(seen):
        record = seen[seed]
        weights = record["mix_weights"]
        top = sorted(range(len(weights)), key=lambda j: -weights[j])[:2]
        lines.append(f"- seed {seed}: γ = {record['mix_gamma']:.3f}; weights (layers 0–{len(weights) - 1}) "
                     + ", ".join(f"{w:.3f}" for w in weights)
                     + f"; largest on layers {top[0]} and {top[1]} ({weights[top[0]] + weights[top[1]]:.3f} together)")
    return "\n".join(lines)


ABLATION_LABELS = {"top": "last only", "mix l2=1": "all layers, λ = 1", "mix l2=0.001": "all layers, λ = 0.001",
                   "mix l2=1 ln": "all layers, λ = 1, layer norm", "mix l2=0.001 ln": "all layers, λ = 0.001, layer norm"}
# model -> (its column label, POS run, MRPC run)
ABLATION_RUNS = {"elmo": ("elmo-brown", "peters-elmo-pos", "peters-elmo-mrpc"),
                 "minilm": ("MiniLM", "peters-minilm-pos", "peters-minilm-mrpc")}


def ablation_table(model: str = "elmo") -> str:
    """Peters et al.'s Table 2 in our probe: last only vs the four mixes, POS and MRPC."""
    label, pos_run, mrpc_run = ABLATION_RUNS[model]
    pos, mrpc = results(pos_run), results(mrpc_run)
    columns = [(pos, "test", "accuracy"), (mrpc, "test", "f1"), (mrpc, "test", "accuracy")]
    rows = []
    for features, row_label in ABLATION_LABELS.items():
        row = [row_label]
        for document, split, metric in columns:
            summary = _find(document, features, split, metric)
            cell = _mean_std(summary)
            if summary.get("difference") is not None:
                p = p_text(summary.get("p_holm"), summary.get("significant"))
                dagger = " †" if summary.get("uninformative") else ""
                cell = f"{summary['mean']:.4f} ± {summary['std']:.4f} ({number(summary['difference'], 4, signed=True)}, p {p}){dagger}"
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
        best = _best_single(document, split, metric)
        top, mix = _find(document, "top", split, metric), _find(document, "mix", split, metric)
        singles = [s for s in _summaries(document) if s["split"] == split and s["metric"] == metric
                   and s["features"].startswith("layer:")]
        worst = min(singles, key=lambda s: s["mean"])
        top_note = " (worst)" if top["mean"] <= worst["mean"] else ""
        mix_note = " (above every layer)" if mix["mean"] > best["mean"] else ""
        test = f"{number(mix['difference'], 3, signed=True)}{' *' if mix['significant'] else ', n.s.'}"
        if also:
            other = _find(document, "mix", split, also)
            test += f" (F1 {number(other['difference'], 3, signed=True)}{' *' if other['significant'] else ', n.s.'})"
        rows.append([model, task, f"{best['features'].replace('layer:', 'layer ')}, {best['mean']:.4f}",
                     f"{top['mean']:.4f}{top_note}", f"{mix['mean']:.4f}{mix_note}", test])
    return markdown(["model", "task", "best single layer (mean)", "top layer", "learned mix", "mix vs top (pooled Δ, Holm)"],
                    rows, align="llllll")


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
    }
    blocks.update(wsd_tables())
    return {DOC: blocks}


if __name__ == "__main__":
    raise SystemExit(main(build))
