"""`build_report`: one run's result files → RUN/report.html and RUN/figures/*.png|svg."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Sequence

import pandas as pd

from lmgeom.controlspec import control_label
from lmgeom.errors import InputError
from lmgeom.report.data import (
    PRODUCERS,
    RunData,
    context_specific_words,
    step_seconds,
    load_run,
    summarise_experiments,
)
from lmgeom.report.explorer import read_explorer
from lmgeom.engine.registry import measures
from lmgeom.report.figures import (CONTROL_STYLE, DRAWN, Chart, run_charts, run_subtitle, save_figure, sts_pivot,
                                   takes_control)
from lmgeom.report.ablation import ablation_section
from lmgeom.report.attribution import attribution_section
from lmgeom.report.geometry import geometry_section
from lmgeom.report.html import Page, definition_list, esc, explorer_section, missing, not_measured, table
from lmgeom.report.labels import MEV_ADJ_NOTE, label, labelled, number
from lmgeom.report.lens import lens_section
from lmgeom.report.similarity import similarity_section
from lmgeom.report.thesis import thesis_section
from lmgeom import rundir
from lmgeom.report.missing_data import skipped_inputs
from lmgeom.rundir import REPORT

N_WORDS_SHOWN = 10


def _layers_stored(meta: dict[str, Any]) -> str:
    """"7 layers", or "layers 0, 3, 6 of 7" for a store of some of its model's layers."""
    stored, total = meta.get("stored_layers"), meta.get("n_layers", "—")
    if not isinstance(stored, list) or len(stored) == total:
        return f"{total} layers"
    return f"layers {', '.join(map(str, stored))} of {total}"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "—"


def _metadata(run: RunData) -> list[tuple[str, Any]]:
    meta, contextuality = run.meta, run.contextuality_document or {}
    settings = contextuality.get("settings", {})
    items: list[tuple[str, Any]] = [
        ("model", run.model_id),
        ("model class / revision or fingerprint", f"{meta.get('model_class', '—')} / "
                                                    f"{meta.get('model_revision') or meta.get('model_fingerprint') or '—'}"),
        ("corpus", f"{run.corpus} (fingerprint {meta.get('corpus_fingerprint') or contextuality.get('corpus_fingerprint') or '—'})"),
        ("store", f"{_count(meta.get('n_sentences'))} sentences, {_count(meta.get('n_tokens'))} tokens, "
                  f"{_count(meta.get('n_vocab'))} distinct words; {_layers_stored(meta)} x {meta.get('dim', '—')} dims, "
                  f"{meta.get('pooling', '—')} pooling, {meta.get('dtype', '—')}, special tokens {meta.get('special_tokens', '—')}"
         if meta else "no meta.json: the store is not in this directory"),
        ("analysis", run.counts_caption() + (
            f"; words in ≥ {settings.get('min_contexts')} sentences; punctuation "
            f"{'included' if settings.get('include_punct', not settings.get('exclude_punct', True)) else 'excluded'}; "
            f"seed {settings.get('seed')}" if settings else "")),
        ("layers", "layer 0 = embedding output; layer l ≥ 1 = output of transformer block l"),
        *([("control", f"{control_label(run.control)}: {run.control.get('what', '')}")] if run.control else []),
        ("lmgeom version", contextuality.get("lmgeom_version") or meta.get("lmgeom_version", "—")),
        ("extracted", meta.get("created", "—")),
    ]
    seconds = step_seconds(run.path)
    if seconds:
        steps = ", ".join(f"{name} {value:,.1f} s" for name, value in seconds.items())
        items.append(("time taken (lmgeom run steps, last time each ran)", f"{steps}; total {sum(seconds.values()):,.1f} s"))
    return items


def layer_table(run: RunData) -> pd.DataFrame:
    """One row per layer: its mean norm and every contextuality measure, raw and (as
    `<metric>_adjusted`, the column names of contextuality_words.csv) adjusted where it has a baseline."""
    assert run.contextuality is not None
    wide = run.contextuality.pivot(index="layer", columns="metric", values=["raw", "adjusted"])
    columns: dict[str, Any] = {"layer": wide.index}
    for metric in dict.fromkeys(run.contextuality["metric"]):
        columns[metric] = wide[("raw", metric)].to_numpy()
        if run.contextuality.loc[run.contextuality["metric"] == metric, "adjusted"].notna().any():
            columns[f"{metric}_adjusted"] = wide[("adjusted", metric)].to_numpy()
    frame = pd.DataFrame(columns)
    if run.summary is not None:
        frame.insert(1, "mean_norm", frame["layer"].map(run.summary.set_index("layer")["mean_norm"]))
    return frame


def _words_section(run: RunData) -> str:
    if run.words is None or run.words.empty:
        return missing(run.notes.get("words", f"no word results; run `{PRODUCERS['words']}`"))
    layers = sorted(int(layer) for layer in run.words["layer"].unique())
    last = layers[-1]
    most, least = context_specific_words(run.words, last, n=N_WORDS_SHOWN)
    body = (
        f"<p class=\"note\">Self-similarity at the last layer ({last}, {rundir.layer_name(last)}); low = the word's "
        "representations change most with context.</p>"
        f"<h3>Most context-specific (lowest self-similarity), layer {last}</h3>{table(labelled(most))}"
        f"<h3>Least context-specific (highest self-similarity), layer {last}</h3>{table(labelled(least))}"
    )
    per_layer = []
    for layer in layers:
        low, high = context_specific_words(run.words, layer, n=N_WORDS_SHOWN)
        per_layer.append({"layer": layer, "most context-specific": ", ".join(low["word"]),
                          "least context-specific": ", ".join(high["word"])})
    return body + "<h3>Per layer</h3>" + table(pd.DataFrame(per_layer))


def _counts(values: pd.Series) -> str:
    """'N' when every layer has the same count, else 'a–b (by layer)'."""
    low, high = int(values.min()), int(values.max())
    return f"{low:,}" if low == high else f"{low:,}–{high:,} (by layer)"


def calibration_rows_note(records: pd.DataFrame) -> str:
    """The rows the calibration records say each method was fitted on and the isotropy measured on."""
    per_fit = records.drop_duplicates(["layer", "method"])
    fitted = "; ".join(f"{method} {_counts(group['n_fit_rows'])}" for method, group in per_fit.groupby("method", sort=False))
    return (f"Rows per layer (the records' n_fit_rows and n_eval_rows): fitted on {fitted}; every measure before and "
            f"after on the same {_counts(per_fit.drop_duplicates('layer')['n_eval_rows'])} rows (a seeded subsample).")


REDUNDANT_MEASURES = ("partition_isotropy", "partition_isotropy_centered")  # exp of the log ones, 0 once those are below -745

WHITENING_NOTE = (
    "Why whitening can lower log I(W) while IsoScore rises towards 1: IsoScore depends only on the covariance's "
    "eigenvalues, which whitening sets to 1 on the rows it was fitted on. log I(W) = min_c log Z(c) − max_c log Z(c), "
    "with Z(c) = Σ_w exp(cᵀw) over the eigenvectors c of WᵀW (both signs), is a log-sum-exp, dominated by the rows "
    "with the largest projection on c. Whitening scales every direction to unit variance, the low-variance ones "
    "included; where a direction's variance came from a few outlying rows, their projections grow to as much as √n "
    "(the squared projections of n rows sum to n), so max_c log Z(c) grows while directions of typical rows keep "
    "log Z(c) near log n + ½, and log I(W) falls. Equal variances in every direction are not equal exponential moments."
)


def whitening_note(records: pd.DataFrame) -> str:
    """WHITENING_NOTE, with the layers of these records where whitening lowers log I(W) and raises IsoScore."""
    rows = records.loc[records["method"] == "whitening"].pivot_table(index="layer", columns="measure", values=["before", "after"])
    if rows.empty or ("before", "log_partition_isotropy") not in rows or ("before", "isoscore") not in rows:
        return ""
    cases = [
        f"layer {int(layer)}: log I(W) {row[('before', 'log_partition_isotropy')]:.3g} → {row[('after', 'log_partition_isotropy')]:.3g}, "
        f"IsoScore {row[('before', 'isoscore')]:.3f} → {row[('after', 'isoscore')]:.3f}"
        for layer, row in rows.iterrows()
        if row[("after", "log_partition_isotropy")] < row[("before", "log_partition_isotropy")]
        and row[("after", "isoscore")] > row[("before", "isoscore")]
    ]
    return WHITENING_NOTE + (f" In this run, {'; '.join(cases)}." if cases else "")


def _calibration_section(run: RunData, charts: list[tuple[Chart, list[str]]], page: Page) -> str:
    isotropy = "".join(page.chart(chart, files=files) for chart, files in charts if chart.name.startswith("isotropy_"))
    if run.isotropy is None:
        isotropy = missing(run.notes["isotropy"])
    if run.calibration is None:
        return isotropy + missing(run.notes["calibration"])
    body = isotropy + "".join(page.chart(chart, files=files) for chart, files in charts if chart.name.startswith("calibration_"))
    settings = run.calibration_settings
    methods = ", ".join(map(str, settings.get("methods", []))) or ", ".join(dict.fromkeys(run.calibration["method"].astype(str)))
    note = (f"<p class=\"note\">Methods {esc(methods)}; seed {esc(settings.get('seed', '—'))}. "
            f"{esc(calibration_rows_note(run.calibration))}</p>")
    explained = whitening_note(run.calibration) if (run.calibration["method"] == "whitening").any() else ""
    return (note + body + (f"<p class=\"note\">{esc(explained)}</p>" if explained else "")
            + "<h3>Every isotropy measure, before and after each method</h3><p class=\"note\">I(W) = exp(log I(W)) is in "
            f"{rundir.CALIBRATION_CSV.name}.</p>"
            + table(labelled(calibration_table(run.calibration).drop(columns=list(REDUNDANT_MEASURES), errors="ignore")), digits=3))


def calibration_table(records: pd.DataFrame) -> pd.DataFrame:
    """One row per layer and state (before, after METHOD), one column per isotropy measure."""
    before = records.drop_duplicates(["layer", "measure"]).assign(state="before")
    after = records.assign(state="after " + records["method"].astype(str))
    states = pd.concat([before.assign(value=before["before"]), after.assign(value=after["after"])], ignore_index=True)
    order = {state: i for i, state in enumerate(dict.fromkeys(states["state"]))}
    wide = states.pivot_table(index=["layer", "state"], columns="measure", values="value", sort=False).reset_index()
    wide = wide.sort_values(["layer", "state"], key=lambda c: c.map(order) if c.name == "state" else c, kind="stable")
    wide.columns.name = None
    return wide.reset_index(drop=True)


def _sts_section(run: RunData, page: Page, figure_of: dict[str, tuple[Chart, list[str]]]) -> str:
    assert run.sts is not None
    datasets = list(dict.fromkeys(run.sts.loc[run.sts["aggregation"] == "all", "dataset"].astype(str)))
    note = ("<p class=\"note\">Spearman × 100 between gold scores and the cosines of mean-pooled sentence vectors, "
            "the 'all' aggregation (the pooled pairs of every subset); rows are layers or layer combinations, columns "
            f"the calibrations (method@corpus when fitted on a corpus). Mean over {len(datasets)} dataset"
            f"{'s' if len(datasets) != 1 else ''}: {esc(', '.join(datasets))}.</p>")
    chart = page.chart(figure_of["sts"][0], files=figure_of["sts"][1]) if "sts" in figure_of else ""
    by_dataset = table(labelled(sts_pivot(run.sts, by_dataset=True)), digits=2)
    return (note + chart + "<h3>Mean over datasets</h3>" + table(labelled(sts_pivot(run.sts)), digits=2)
            + f"<details><summary>Per dataset</summary>{by_dataset}</details>")


def _experiments_section(run: RunData) -> str:
    if run.experiments is None:
        return missing(run.notes["experiments"])
    summary = summarise_experiments(run.experiments, run.experiment_tests)
    summary["mean ± std"] = [f"{m:.4f} ± {s:.4f}" for m, s in zip(summary["mean"], summary["std"])]
    note = "Mean ± standard deviation over seeds."
    if "p" in summary:
        summary["p vs baseline"] = [f"{p:.3g}{' *' if significant is True else ''}" if pd.notna(p) else ""
                                    for p, significant in zip(summary["p"], summary["significant"])]
        summary = summary.drop(columns=["p", "significant"])
        note += (" p: the experiment's paired test of the configuration against its baseline (Holm-adjusted "
                 "where the results give it); * marks a difference significant at 0.05.")
    shown = summary.drop(columns=["mean", "std"]).rename(columns={"n": "seeds"})
    return f"<p class=\"note\">{note}</p>" + "".join(
        f"<h3>{esc(name)}</h3>{table(group.drop(columns=['experiment']))}"
        for name, group in shown.groupby("experiment", sort=True)
    )


# the layer-to-layer changes the findings claim (SelfSim falling with depth; the adjusted measures)
ADJACENT_LAYER_CLAIMS = (("self_similarity", "raw"), ("self_similarity", "adjusted"), ("intra_sentence_similarity", "adjusted"),
                         ("mev_svd_ratio", "adjusted"))


def adjacent_layer_findings(contextuality: dict[str, Any], alpha: float = 0.05) -> list[str]:
    """One sentence per claimed change: each step between adjacent non-input layers with its paired
    bootstrap difference, interval and p-value (contextuality.json's `bootstrap.adjacent_layers`)."""
    design = contextuality.get("bootstrap") or {}
    sentences = []
    for metric, kind in ADJACENT_LAYER_CLAIMS:
        steps = [t for t in design.get("adjacent_layers", []) if t["metric"] == metric and t["value"] == kind
                 and t["previous_layer"] >= 1]
        if not steps:
            continue
        significant = sum(1 for t in steps if t["p_value"] is not None and t["p_value"] < alpha)
        parts = "; ".join(f"{t['previous_layer']}→{t['layer']} {number(t['difference'], 3)} "
                          f"[{number(t['lo'], 3)}, {number(t['hi'], 3)}], p {number(t['p_value'], 3)}" for t in steps)
        sentences.append(f"{label(metric)} ({kind}) from layer to layer (paired bootstrap, B = {design['B']:,}, "
                         f"{design['level']:.0%} intervals): differs at {significant} of {len(steps)} steps (p < {alpha}, uncorrected): {parts}")
    return sentences


def static_table(static: pd.DataFrame) -> pd.DataFrame:
    """The report's word-benchmark rows: each score to 3 decimals, a covered-items score on too few items
    (`enough_items` false) as "too few items (n of N)", and covered/total with its share."""
    from lmgeom.evaluate.wordbench import coverage_text, covered_score_text

    records = static.to_dict("records")
    shown = pd.DataFrame({
        **{c: static[c] for c in ("layer", "vectors", "benchmark", "metric") if c in static},
        "score": [covered_score_text(r, lambda value: number(value, 3)) for r in records],
        "covered": [f"{coverage_text(int(r['covered']), int(r['total']))} ({r['coverage']:.0%})" for r in records],
        "score_oov_mean": [number(r["score_oov_mean"], 3) for r in records],
    })
    return shown


def _min_coverage(static: pd.DataFrame) -> str:
    """The static step's `min_coverage`, as its result files record it (one value, or each)."""
    from lmgeom.evaluate.wordbench import DEFAULT_MIN_COVERAGE

    values = static["min_coverage"].dropna().unique() if "min_coverage" in static else []
    return " or ".join(map(str, values)) or str(DEFAULT_MIN_COVERAGE)


def site_runs(run: RunData) -> list[tuple[str, RunData]]:
    """(site, its results read as a run) for each capture site `lmgeom run --sites` analysed in this run
    (`rundir.SITE_RESULTS`: RUN/site_results/<site>/), by folder name."""
    found = []
    documents = rundir.ResultFile(f"{rundir.SITE_RESULTS.pattern}/{rundir.CONTEXTUALITY.name}", rundir.SITE_RESULTS.producer)
    for path in sorted(documents.find(run.path), key=str):
        folder = rundir.target(str(path).replace(os.sep, "/").rsplit("/", 1)[0])
        site_run = load_run(folder)
        settings = (site_run.contextuality_document or {}).get("settings", {})
        found.append((str(settings.get("site", rundir.name_of(folder))), site_run))
    return found


def _sites_section(run: RunData, page: Page, out_path: rundir.Target) -> str:
    """Each analysed capture site's contextuality and isotropy charts (`takes_control`'s), titled with
    the site; empty for a run of resid_post only."""
    body = ""
    for site, site_run in site_runs(run):
        charts = [replace(chart, name=f"site_{site_run.name}_{chart.name}", title=f"{site}: {chart.title}")
                  for chart in run_charts(site_run) if takes_control(chart.name)]
        body += f"<h3>{esc(site)}</h3><p class=\"note\">{esc(site_run.counts_caption())}; layers {', '.join(map(str, site_run.layer_numbers))} (a site besides resid_post exists at layers 1..L only).</p>"
        body += "".join(page.chart(chart, files=[rundir.link(out_path, p) for p in save_figure(chart, run.path)])
                        for chart in charts) or missing(site_run.notes.get("contextuality", f"no results for {site}"))
    return body


def require_control_of(run: RunData, control: RunData) -> None:
    """`control` must be a control run (`RunData.control`) of the model of `run`, itself a run of the
    model: anything else is an `InputError` naming `control`."""
    if control.control is None:
        raise InputError(f"`control` {control.path} is not a control run: its store records no control; give the run "
                         "directory of `lmgeom run --control random-init` (or shuffled) of this model", param="control")
    if run.control is not None:
        raise InputError(f"{run.path} is itself a control run ({control_label(run.control)}); give the model's run as RUN "
                         "and the control's as `control`", param="control")
    if control.model_id != run.model_id:
        raise InputError(f"`control` {control.path} is a control of {control.model_id}, not of {run.model_id}; give a "
                         "control run of this run's model", param="control")


def build_report(
    run_dir: str | os.PathLike | RunData,
    *,
    include: Sequence[str | os.PathLike] = (),
    out: str | os.PathLike[str] | None = None,
    control: str | os.PathLike | RunData | None = None,
) -> rundir.Target:
    """Render RUN/report.html (or `out`) and RUN/figures/ from a run's result files (or the run
    `load_run` read); no model is needed. The run may be a local folder or an fsspec URL.

    `include` adds folders of experiment results (results.json, or */results.json) and of thesis tests
    (thesis.json, or */thesis.json: `lmgeom.report.thesis`). The word explorer
    shows RUN/explorer.json, which `lmgeom.pipeline.render_report` computes from the store. `control`:
    a control run of the same model (`lmgeom.controlspec`; `require_control_of`), whose lines the
    contextuality and isotropy figures draw beside the run's (`lmgeom.report.figures.with_control`).
    """
    run = run_dir if isinstance(run_dir, RunData) else load_run(run_dir, include=include)
    compared = None if control is None else control if isinstance(control, RunData) else load_run(control)
    if compared is not None:
        require_control_of(run, compared)
    out_path = rundir.target(out) if out is not None else REPORT.at(run.path)
    charts = [(chart, save_figure(chart, run.path)) for chart in run_charts(run, compared)]
    relative = {chart.name: [rundir.link(out_path, p) for p in paths] for chart, paths in charts}
    figure_of = {chart.name: (chart, relative[chart.name]) for chart, _ in charts}

    page = Page(f"lmgeom report: {run.label}", run_subtitle(run) + f"; run directory {run.name}")
    compared_with = [("control run shown beside it", f"{compared.label} ({compared.name}): {CONTROL_STYLE}")] if compared else []
    page.section("run", "Run", definition_list(_metadata(run) + compared_with))
    contextuality = run.contextuality_document
    if contextuality is None:
        page.section("findings", "Findings", missing(run.notes["contextuality"]))
    else:
        statements = "".join(f"<li>{esc(s)}</li>" for s in contextuality.get("statements", []) + adjacent_layer_findings(contextuality))
        page.section("findings", "Findings (computed from this run)", f"<ul>{statements}</ul>")

    def chart_or_note(name: str) -> str:
        if name in figure_of:
            chart, files = figure_of[name]
            return page.chart(chart, files=files)
        return missing(run.notes.get("contextuality", f"no values for {name} in {rundir.CONTEXTUALITY.name}"))

    page.section("anisotropy", "Anisotropy baseline by layer",
                 "<p class=\"note\">Mean cosine between word occurrences at random: the baseline that the adjusted "
                 "measures subtract. Exact = all pairs in closed form; sampled = the paper's estimate.</p>"
                 + chart_or_note("anisotropy"))
    page.section("self-similarity", "Self-similarity", chart_or_note("self_similarity"))
    page.section("intra-sentence", "Intra-sentence similarity", chart_or_note("intra_sentence_similarity"))
    page.section("mev", "Maximum explainable variance",
                 "<p class=\"note\">Share of a word's occurrence variance explained by its first principal direction, "
                 "in three named variants; adjusted = raw minus the same variant on sampled occurrences.</p>"
                 + chart_or_note("mev") + chart_or_note("mev_adjusted"))
    for m in measures():  # any other measure a statistic declares, where this run has it
        if m.chart and m.name not in DRAWN and run.contextuality is not None and (run.contextuality["metric"] == m.name).any():
            page.section(m.name.replace("_", "-"), m.title, chart_or_note(m.name))
    if run.contextuality is not None:
        page.section("layers", "All measures by layer",
                     f"<p class=\"note\">{esc(MEV_ADJ_NOTE)}.</p>" + table(labelled(layer_table(run)), digits=3))
    page.section("words", "Least and most context-specific words", _words_section(run))

    explorer = read_explorer(run.path)
    if run.words is None or run.words.empty:
        page.section("explorer", "Word explorer", missing(run.notes["words"]))
    elif explorer is None:
        page.section("explorer", "Word explorer", missing(f"no word explorer data yet; `lmgeom report {run.path}` computes it from the store"))
    else:
        body, script = explorer_section(explorer, run_subtitle(run))
        page.section("explorer", "Word explorer", body)
        page.scripts.append(script)

    if run.static is None:
        page.section("static", "Static embeddings on word benchmarks", missing(run.notes["static"]))
    else:
        unscored = not_measured(entry for entry in skipped_inputs(run.path) if entry.step == "static_embeddings")
        page.section("static", "Static embeddings on word benchmarks", unscored +
                     "<p class=\"note\">First-principal-component, mean and layer-0-mean word vectors (the layer-0 means "
                     "once, under layer 0); Spearman for similarity, 3CosAdd accuracy for analogies, mean Spearman for "
                     "SemEval-2012 Task 2, purity for categorisation; benchmarks matched lowercase. Covered items (the "
                     "headline, as it measures the vectors themselves): the score of the items whose words all have "
                     "vectors, shown as \u201ctoo few items\u201d when they are fewer than "
                     f"{esc(_min_coverage(run.static))} (items, share of the benchmark); OOV words as the mean vector: every "
                     "item (the paper's protocol, which also charges the vectors for the words the corpus lacks).</p>"
                     + table(labelled(static_table(run.static)), text_columns=["score", "score_oov_mean", "covered"]))
    page.section("calibration", "Isotropy and calibration", _calibration_section(run, [v for v in figure_of.values()], page))
    sites = _sites_section(run, page, out_path)
    if sites:
        page.section("sites", "Capture sites", sites)
    page.section("similarity", "Similarity between layers", similarity_section(page, run.path, run.label))
    page.section("geometry", "Intrinsic dimension, outlier dimensions and massive activations",
                 geometry_section(run, page, out_path))
    attribution = attribution_section(run, page, out_path)  # None: no attribution.json, no section
    if attribution is not None:
        page.section("attribution", "Attribution of each layer to the terms that write it", attribution)
    lens = lens_section(run, page, out_path)  # None: neither lens.json nor lens_join.json, no section
    if lens is not None:
        page.section("lens", "Logit lens", lens)
    ablation = ablation_section(run, page, out_path)  # None: no ablation.json, no section
    if ablation is not None:
        page.section("ablation", "Ablations", ablation)
    if run.sts is None:
        page.section("sts", "Sentence similarity (STS)", missing(run.notes["sts"]))
    else:
        page.section("sts", "Sentence similarity (STS)", _sts_section(run, page, figure_of))
    page.section("experiments", "Experiment results", _experiments_section(run))
    thesis = thesis_section(run, page, out_path)  # None: no thesis.json in experiments/ or an included folder
    if thesis is not None:
        page.section("thesis", "Local isotropy and task gains (Ding et al.'s thesis)", thesis)

    return rundir.write_text(out_path, page.render())
