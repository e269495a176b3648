"""The tables of docs/reproduction/ding2022.md (Ding et al. 2022, the downstream calibration
experiment) and docs/reproduction/calibration.md (STS and isotropy calibration) from committed files.

    python benchmarks/reproduce_ding2022.py           writes the marked blocks into the docs
    python benchmarks/reproduce_ding2022.py --check   exits 1 if a doc differs from the files

Sources: `lmgeom experiment calibration` results (docs/reproduction/results/calib-*/results.json),
the fine-tuning pre-check (docs/reproduction/results/ding-precheck-minilm/precheck.json), the
cells of the flow-inside-fine-tuning diagnostic (docs/reproduction/results/ding-flow-fixes-minilm-cola/),
`lmgeom sts` results (docs/reproduction/results/sts-<model>/sts.json, for the models STS_RUNS
lists) and the isotropy.json and calibration.json of `lmgeom run` on Lee (the folders LEE_RUNS
lists); docs/reproduction/results/COMMANDS.md
lists the command of each run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_common import RESULTS, Documents, load_json, main, markdown, number, p_text, results  # noqa: E402
from lmgeom.evaluate.stats import holm  # noqa: E402

DING = "docs/reproduction/ding2022.md"
CALIBRATION = "docs/reproduction/calibration.md"
CALIBRATION_RUNS = ("calib-smollm2-cola", "calib-minilm-mrpc", "calib-tiny-bert-cola", "calib-minilm-cola", "calib-minilm-cola-ft", "calib-minilm-cola-full", "calib-minilm-pos", "calib-elmo-pos", "calib-elmo-cola",
                    "calib-elmo-mrpc", "calib-smollm2-pos", "calib-smollm2-mrpc")
# the fine-tuning grid of scripts/ding_grid.sh, one folder per informative task (filled as cells finish)
GRID_RUNS = ("ding-grid-minilm-cola", "ding-grid-minilm-sst2", "ding-grid-minilm-mrpc", "ding-grid-minilm-rte",
             "ding-grid-minilm-sicke")
# scripts/ding_batch_refits.sh: whitening, all-but-the-top and conceptor negation re-fitted every step from
# batch moments, at the grid's size, one folder per task (a table once its run has finished)
BATCH_REFIT_RUNS = ("ding-batch-refits-minilm-cola", "ding-batch-refits-minilm-sicke", "ding-batch-refits-minilm-sst2",
                    "ding-batch-refits-minilm-mrpc")
# DING_VARIANT=cie-guard scripts/ding_batch_refits.sh: CIE with the guard at the grid's size
CIE_GUARD_RUNS = ("ding-cie-guard-minilm-cola", "ding-cie-guard-minilm-sicke")
FINETUNE_RUNS = GRID_RUNS + BATCH_REFIT_RUNS + CIE_GUARD_RUNS  # every fine-tuned results folder, each shown once it has results.json
# model -> results folder of a committed `lmgeom sts` run (its sts.json); calibration.md marks a block
# `sts-<model>-delta` and `sts-<model>-full` for each
STS_RUNS: dict[str, str] = {"minilm": "sts-minilm"}
# `lmgeom run` on Lee: (results folder holding its isotropy.json and calibration.json, label)
LEE_RUNS = (("ethayarajh-minilm-lee", "MiniLM"), ("ethayarajh-smollm2-lee", "SmolLM2"), ("ethayarajh-gemma3-lee", "Gemma 3 270M"))


def calibration_table(run: str) -> str:
    """One row per (split, head, method, metric) summary: mean ± std over seeds, Δ against `none`
    (pooled) and the paired test's p, raw and Holm-corrected across the methods; a degenerate method
    is a failure, not a Δ; with the trivial-baseline comparison in the results, its verdict per row
    (`core.trivial_verdict`)."""
    from lmgeom.stages.experiments.core import trivial_verdict

    summaries = results(run)["summaries"]
    with_trivial = any("trivial" in s for s in summaries)
    with_power = any("detectable_difference" in s for s in summaries)
    crossed = crossed_holm(summaries)
    rows = []
    for s in summaries:
        baseline = s.get("difference") is None and not s.get("degenerate")
        delta = ("degenerate (failure)" if s.get("degenerate") else
                 "baseline" if baseline else number(s["difference"], 4, signed=True))
        tested = not baseline and not s.get("degenerate")
        rows.append([s["split"], s["head"], s["method"], s["metric"], f"{s['mean']:.4f} ± {s['std']:.4f}", s["n_seeds"],
                     delta, p_text(s.get("p_value")) if tested else "",
                     p_text(s.get("p_holm"), s.get("significant")) if tested else "",
                     *([f"±{s['detectable_difference']:.4f}" if tested and s.get("detectable_difference") is not None
                        else ""] if with_power else []),
                     *([_crossed_text(crossed.get(id(s))) if tested else ""] if crossed else []),
                     *([trivial_verdict({k: v for k, v in s.items() if k != "degenerate"})] if with_trivial else [])])
    return markdown(["split", "head", "method", "metric", "mean ± std", "seeds", "Δ vs none", "p", "p (Holm)",
                     *(["detectable Δ (80 %)"] if with_power else []),
                     *(["seeds × examples: 95% CI, p (Holm)"] if crossed else []), *(["vs trivial"] if with_trivial else [])],
                    rows, align="lllllrrrr" + ("r" if with_power else "") + ("r" if crossed else "")
                    + ("l" if with_trivial else ""))


def crossed_holm(summaries: list[dict]) -> dict[int, tuple[float, float, float]]:
    """Per summary (by id) with a crossed seeds x examples bootstrap (`seed_item`) and not degenerate:
    its interval and its p Holm-corrected over the methods of the same split, head and metric (the
    family of the pooled test's Holm). Empty for runs summarised before the bootstrap existed."""
    families: dict[tuple, list[dict]] = {}
    for s in summaries:
        if s.get("seed_item") and s.get("difference") is not None and not s.get("degenerate"):
            families.setdefault((s["split"], s.get("head"), s["metric"]), []).append(s)
    out = {}
    for rows in families.values():
        for s, adjusted in zip(rows, holm([row["seed_item"]["p_value"] for row in rows])):
            out[id(s)] = (s["seed_item"]["low"], s["seed_item"]["high"], float(adjusted))
    return out


def _crossed_text(found: tuple[float, float, float] | None) -> str:
    if found is None:
        return ""
    low, high, p_holm = found
    return f"[{number(low, 4, signed=True)}, {number(high, 4, signed=True)}], {p_text(p_holm, p_holm < 0.05)}"


# ---- STS (calibration.md) ------------------------------------------------------------------------
def sts_records(model: str) -> pd.DataFrame:
    return pd.DataFrame(load_json(RESULTS / STS_RUNS[model] / "sts.json")["records"])


def sts_delta_table(model: str) -> str:
    """Change in the seven-set average Spearman (all aggregation) against `none`, per layer and method × fit."""
    records = sts_records(model)
    pooled = records[records["aggregation"] == "all"]
    average = pooled.groupby(["layer", "method", "fit_on"], sort=False)["spearman"].mean().reset_index()
    baseline = average[average["method"] == "none"].set_index("layer")["spearman"]
    calibrated = average[average["method"] != "none"]
    columns = list(dict.fromkeys(zip(calibrated["method"], calibrated["fit_on"])))
    header = ["layer", "none: avg (all)"] + [f"{m} ({'trans' if f == 'transductive' else f})" for m, f in columns]
    rows = []
    for layer in dict.fromkeys(average["layer"]):
        at = calibrated[calibrated["layer"] == layer].set_index(["method", "fit_on"])["spearman"]
        rows.append([layer, f"{baseline[layer]:.2f}", *[f"{at[c] - baseline[layer]:+.2f}" for c in columns]])
    return markdown(header, rows)


def sts_full_table(model: str) -> str:
    """Spearman x 100 per set and aggregation, the seven-set average and the isotropy of the vectors
    (`lmgeom.evaluate.sts.summary_table`, the table `lmgeom sts --markdown` writes)."""
    from lmgeom.evaluate.sts import summary_table

    header, rows = summary_table(load_json(RESULTS / STS_RUNS[model] / "sts.json")["records"])
    return markdown(header, rows)


# ---- isotropy and calibration of the word vectors of `lmgeom run` (calibration.md) ------------
# isotropy.json / calibration.json measure -> (label, short label, digits)
ISOTROPY_MEASURES = {
    "average_cosine": ("average cosine", "avg cos", 3),
    "average_cosine_without_rogue": ("average cosine without the 3 rogue dimensions", "without rogue", 3),
    "average_cosine_standardized": ("average cosine after standardisation", "standardised", 3),
    "rogue_top_share": ("top 3 rogue dimensions' share of the average cosine", "top-3 rogue share", 3),
    "isoscore": ("IsoScore", "IsoScore", 3),
    "log_partition_isotropy": ("log I(W)", "log I(W)", 2),
    "log_partition_isotropy_centered": ("log I(W), centred", "log I(W) centred", 2),
    "effective_rank": ("effective rank", "eff. rank", 1),
    "top1_variance_share": ("top principal component's variance share", "top-PC share", 3),
}


def isotropy_table() -> str:
    """Per measure, each Lee run's values by layer (isotropy.json)."""
    frames = {run: pd.DataFrame(load_json(RESULTS / run / "isotropy.json")["records"]) for run, _ in LEE_RUNS}
    layers = range(max(int(frame["layer"].max()) for frame in frames.values()) + 1)
    rows = []
    for measure, (name, _, digits) in ISOTROPY_MEASURES.items():
        for run, label in LEE_RUNS:
            values = frames[run][frames[run].measure == measure].set_index("layer")["value"]
            rows.append([name, label, *[number(values.get(layer), digits) if layer in values.index else "" for layer in layers]])
    return markdown(["measure", "run", *[str(layer) for layer in layers]], rows, align="ll" + "r" * len(layers))


def lee_calibration_table() -> str:
    """Each Lee run's calibrated layers: the isotropy of the word vectors before (`none`) and after
    each calibrator (calibration.json)."""
    rows = []
    for run, label in LEE_RUNS:
        document = load_json(RESULTS / run / "calibration.json")
        records = pd.DataFrame(document["records"]).set_index(["layer", "method", "measure"])
        for layer in document["settings"]["layers"]:
            first = document["settings"]["methods"][0]
            rows.append([label, layer, "none", *[number(records.loc[(layer, first, m), "before"], d)
                                                 for m, (_, _, d) in ISOTROPY_MEASURES.items()]])
            for method in document["settings"]["methods"]:
                rows.append(["", "", method, *[number(records.loc[(layer, method, m), "after"], d)
                                               for m, (_, _, d) in ISOTROPY_MEASURES.items()]])
    return markdown(["run", "layer", "method", *[short for _, short, _ in ISOTROPY_MEASURES.values()]], rows,
                    align="lrl" + "r" * len(ISOTROPY_MEASURES))


# runs whose isotropy before and after each method's layer the isotropy check reads: the frozen runs
# and the fine-tuning grid (its `before` is the fine-tuned pooled vector, the layer's input)
ISOTROPY_CHECK_RUNS = tuple(run for run in CALIBRATION_RUNS if run not in ("calib-tiny-bert-cola", "calib-minilm-cola-ft")) + (
    *(grid for grid in FINETUNE_RUNS if (RESULTS / grid / "results.json").exists()),)


def isotropy_check_table() -> str:
    """Did each method do what it claims? Per run and method: IsoScore and local IsoScore of the
    vectors the head reads, before and after the method's layer, means over the run's cells on its
    first evaluation split (the records' `*_before` / `*_after`), and which of the two fell."""
    rows = []
    for run in ISOTROPY_CHECK_RUNS:
        path = RESULTS / run / "results.json"
        if not path.exists():
            continue
        records = pd.DataFrame(load_json(path)["records"])
        records = records[records["method"] != "none"]
        split = records["split"].iloc[0]
        grouped = records[records["split"] == split].groupby("method", sort=False)
        for method, group in grouped:
            values = {c: float(group[c].mean()) for c in
                      ("isoscore_before", "isoscore_after", "local_isoscore_before", "local_isoscore_after")}
            fell = [name for name, key in (("IsoScore", "isoscore"), ("local IsoScore", "local_isoscore"))
                    if values[f"{key}_after"] <= values[f"{key}_before"]]
            degenerate = bool(group["degenerate"].fillna(False).astype(bool).any()) if "degenerate" in group else False
            no_layer = bool((group["isoscore_before"] == group["isoscore_after"]).all())
            check = ("no layer (a training penalty): not a calibration of the head's input" if no_layer
                     else ("did not rise: " + ", ".join(fell)) if fell else "both rose")
            rows.append([run, method, f"{values['isoscore_before']:.4f} → {values['isoscore_after']:.4f}",
                         f"{values['local_isoscore_before']:.4f} → {values['local_isoscore_after']:.4f}", check,
                         "yes" if degenerate else ""])
    return markdown(["run", "method", "IsoScore before → after", "local IsoScore before → after", "check",
                     "degenerate cell"], rows, align="llrrll")


# `lmgeom experiment thesis` runs: (results folder, label, required: False for a run made only once its inputs exist)
THESIS_RUNS = (("ding-thesis-frozen", "frozen runs", True),
               ("ding-thesis-frozen/sensitivity-keep-unverified",
                "frozen runs, configurations without a verdict kept (sensitivity)", True),
               ("ding-thesis-finetune", "fine-tuning grid", True),
               ("ding-thesis-finetune/with-batch-refits", "fine-tuning grid and the batch-moment re-fits", False))


def thesis_table() -> str:
    """Each thesis run's tests (thesis.json): Spearman's rho with its cluster-bootstrap interval and
    permutation p, and what it rests on (pairs, configurations, clusters, pairs dropped)."""
    rows = []
    for run, label, required in THESIS_RUNS:
        if not required and not (RESULTS / run / "thesis.json").exists():
            continue
        document = load_json(RESULTS / run / "thesis.json", "thesis")
        dropped = "; ".join(f"{d['n_pairs']} ({d['reason']})" for d in document.get("dropped", []))
        for test in [*document["tests"], *document.get("level_tests", [])]:
            if not test.get("n_pairs"):
                continue
            rho = ("no ρ: " + str(test.get("note", "")).split(" (")[0]) if test.get("rho") is None else (
                f"{test['rho']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}], p = {test['p_value']:.2g}")
            what = (f"standardised Δ score vs Δ {test['measure']} IsoScore" if test["measure"] in ("global", "local")
                    else "standardised mean Δ score vs `none`'s local IsoScore (level)")
            rows.append([label, test["regime"], what, rho, test["n_pairs"], test.get("n_configurations", ""),
                         test.get("n_clusters", ""), dropped])
            dropped = ""
    return markdown(["run", "regime", "test", "ρ [95 % cluster interval], p", "pairs", "configurations", "clusters",
                     "pairs dropped"], rows, align="llllrrrl")


# each model's run on lee whose isotropy.json gives the raw-space level of its top layer: (model, results folder)
RAW_LEVEL_RUNS = (("minilm", "ethayarajh-minilm-lee"), ("smollm2", "ethayarajh-smollm2-lee"),
                  ("elmo-brown", "ethayarajh-elmo-brown-lee"))
# the thesis runs whose level-test points give each configuration's mean Δ score (every configuration once)
LEVEL_POINT_RUNS = ("ding-thesis-frozen/sensitivity-keep-unverified", "ding-thesis-finetune")


def raw_level_table() -> str:
    """The raw-space level of local isotropy of each model (Cai et al.'s clustered measure: IsoScore and
    the mean cosine within k-means clusters of the top layer's word vectors, centred per cluster, from
    the model's lee run), beside each configuration's mean Δ score of the methods against `none` and
    `none`'s local IsoScore of the head's input (the thesis runs' level points)."""
    levels: dict[str, tuple[int, dict[str, float], int] | None] = {}
    for model, run in RAW_LEVEL_RUNS:
        if not (RESULTS / run / "isotropy.json").exists():  # a run that kept no isotropy.json: not measured
            levels[model] = None
            continue
        document = load_json(RESULTS / run / "isotropy.json")
        top = max(document["settings"]["layers"])
        at = {r["measure"]: r["value"] for r in document["records"] if r["layer"] == top}
        levels[model] = (top, at, document["settings"]["n_clusters"])
    rows = []
    for run in LEVEL_POINT_RUNS:
        document = load_json(RESULTS / run / "thesis.json", "thesis")
        kept = {(c["source"], c["head"], c["split"], c["metric"]): c for c in document["configurations"]}
        for test in document.get("level_tests", []):
            for point in test.get("points", []):
                model = point["model"]
                if model not in levels:
                    continue
                level = levels[model]
                configuration = kept.get((point["source"], point["head"], point["split"], point["metric"]), {})
                raw = (["not measured", "—", "—", "—"] if level is None else
                       [f"{level[0]} (k = {level[2]})", number(level[1].get("local_isoscore")),
                        number(level[1].get("local_average_cosine_centered")), number(level[1].get("isoscore"))])
                rows.append([model, *raw, point["regime"], point["task"], point["head"],
                             f"{point['split']} {point['metric']}", configuration.get("status", ""),
                             number(point["level"]), f"{point['mean_delta_score']:+.3f} ± {point['sd_delta_score']:.3f}",
                             str(point["n_pairs"]), f"`{Path(point['source']).parent.name}`"])
    rows.sort(key=lambda row: (row[0], row[5], row[6], row[7]))
    return markdown(["model", "top layer (clusters)", "raw local IsoScore", "raw local mean cosine (centred)", "raw IsoScore",
                     "regime", "task", "head", "split, metric", "`none` vs trivial", "`none`'s head-input local IsoScore",
                     "mean Δ score ± sd", "pairs", "results"], rows, align="llrrrllllrrrrl")


# scripts/ding_flow_fixes.sh: one folder per variant (each holding `none`'s cell and the variant's), in
# the order the table lists them (those not run yet are left out)
FLOW_FIXES = "ding-flow-fixes-minilm-cola"
FLOW_FIX_VARIANTS = ("flow-grid", "flow-joint", "flow-joint-encoder", "flow-guard", "flow-penalty", "flow-refit10",
                     "whitening-grid", "whitening-batch", "whitening-penalty", "abtt-grid", "abtt-batch", "conceptor-grid",
                     "conceptor-batch", "cie-grid", "cie-guard")


def _cells(folder: Path) -> list[dict]:
    return [load_json(path) for path in sorted((folder / "cells").glob("*.json"))]


def _dev(cell: dict, split: str = "dev") -> dict:
    return next(r for r in cell["records"] if r["split"] == split and r["metric"] == "matthews")


def flow_fixes_table() -> str:
    """The flow (and whitening) inside fine-tuning with each way of keeping the layer fitted
    (scripts/ding_flow_fixes.sh; one seed): per variant, what differs from the grid's settings
    (`--recalibrate-every`, `CalibrationOptions`), dev and out-of-domain MCC with Δ against `none`,
    whether the cell is degenerate, IsoScore of the layer's input → output on dev, and the fit in
    use's checks during training (collapsed / all, lowest IsoScore)."""
    root = RESULTS / FLOW_FIXES
    rows = []
    none: dict | None = None
    for variant in FLOW_FIX_VARIANTS:
        cells = _cells(root / variant)
        if not any(c["config"]["method"] != "none" for c in cells):
            continue
        if none is None:
            none = next((c for c in cells if c["config"]["method"] == "none"), None)
            if none is not None:
                dev, ood = _dev(none), _dev(none, "dev_out_of_domain")
                rows.append(["none", "none", "", f"{dev['value']:.4f}", "", f"{ood['value']:.4f}", "", "no",
                             f"{dev['isoscore_after']:.4f}", "", ""])
        for cell in (c for c in cells if c["config"]["method"] != "none"):
            options = cell["config"]["options"]
            changed = [f"recalibrate every {options['recalibrate_every']}"] if options.get("recalibrate_every", 100) != 100 else []
            changed += [f"{key}={value}" for key, value in options.get("calibration", {}).items()]
            dev, ood = _dev(cell), _dev(cell, "dev_out_of_domain")
            reasons = cell["extra"].get("degenerate_reasons", [])
            checks = cell["extra"].get("layer_checks", [])
            stale = [r for r in reasons if r.startswith("collapsed during training")]
            final = [r for r in reasons if not r.startswith("collapsed during training")]
            lowest = min((c["isoscore"] for c in checks), default=float("nan"))
            guard = cell["extra"].get("layer_log", {}).get("guard_refits")
            note = "; ".join([*final, *([f"{len(guard)} guard re-fits"] if guard is not None else [])]).replace("|", "\\|")
            delta = ("" if none is None else number(dev["value"] - _dev(none)["value"], 4, signed=True))
            delta_ood = ("" if none is None else number(ood["value"] - _dev(none, "dev_out_of_domain")["value"], 4, signed=True))
            rows.append([variant, cell["config"]["method"], ", ".join(changed) or "as the grid",
                         f"{dev['value']:.4f}", delta, f"{ood['value']:.4f}", delta_ood,
                         "yes" if reasons else "no", f"{dev['isoscore_before']:.4f} → {dev['isoscore_after']:.4f}",
                         f"{len(stale)} / {len(checks)}, lowest IsoScore {lowest:.2g}" if checks else "", note])
    return markdown(["variant", "method", "differs from the grid", "dev MCC", "Δ vs none", "out-of-domain MCC", "Δ vs none",
                     "degenerate", "IsoScore in → out (dev)", "fit in use: collapsed / checks", "final-layer reasons, guard"],
                    rows, align="lllrrrrllll")


def precheck_table(run: str) -> str:
    """The fine-tuning pre-check's status per task (`lmgeom experiment finetune-precheck`'s precheck.json)."""
    from lmgeom.stages.experiments.finetuning import precheck_status_table

    return precheck_status_table(load_json(RESULTS / run / "precheck.json")).rstrip("\n")


def build() -> Documents:
    documents: Documents = {DING: {run: calibration_table(run) for run in CALIBRATION_RUNS}}
    documents[DING]["ding-precheck-minilm"] = precheck_table("ding-precheck-minilm")
    documents[DING]["ding-isotropy-check"] = isotropy_check_table()
    documents[DING]["ding-thesis"] = thesis_table()
    documents[DING]["ding-raw-level"] = raw_level_table()
    for grid in FINETUNE_RUNS:
        if (RESULTS / grid / "results.json").exists():
            documents[DING][grid] = calibration_table(grid)
    if (RESULTS / FLOW_FIXES).exists():
        documents[DING][FLOW_FIXES] = flow_fixes_table()
    blocks = {"isotropy-lee": isotropy_table(), "calibration-lee": lee_calibration_table()}
    for model in STS_RUNS:
        blocks[f"sts-{model}-delta"] = sts_delta_table(model)
        blocks[f"sts-{model}-full"] = sts_full_table(model)
    documents[CALIBRATION] = blocks
    return documents


if __name__ == "__main__":
    raise SystemExit(main(build))
