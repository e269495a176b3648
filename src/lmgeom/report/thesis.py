"""The report's thesis section, from each thesis.json (`lmgeom experiment thesis`) in RUN/experiments/*/
or an `include` folder: Ding et al.'s local-isotropy thesis tested over experiments' results. Per file:
what it rests on (its sources, the pairs formed and kept, what was dropped and why, each
configuration's trivial-baseline verdict), its tests as a table (Spearman's rho of the standardised Δ
task score against the standardised Δ global and Δ local IsoScore of the head's input, per regime, and
the level test of the standardised mean Δ score against `none`'s local IsoScore), a chart of every rho
with its cluster-bootstrap interval and a line at 0, and per regime the pairs' scatter (standardised Δ
score against standardised Δ local IsoScore, one colour per method)."""

from __future__ import annotations

import json
import math
import posixpath
from typing import Any, Mapping

import pandas as pd

from lmgeom import rundir
from lmgeom.report.data import RunData
from lmgeom.report.figures import Chart, Effect, EffectChart, Series, chart_subtitle, safe_name, save_effects, save_figure
from lmgeom.report.html import Page, definition_list, esc, table

MEASURE_NAMES = {"global": "Δ score vs Δ global IsoScore", "local": "Δ score vs Δ local IsoScore"}
LEVEL_NAME = "mean Δ score vs none's local IsoScore (level)"
CONFIGURATION_COLUMNS = ("regime", "task", "model", "head", "features", "pooling", "split", "metric", "status", "n_pairs",
                         "baseline", "baseline_value", "p_value", "none_mean")
"""The columns of a thesis.json's configurations the report's table shows (with the source's folder)."""


def thesis_label(path: rundir.Target) -> str:
    """A thesis.json by its folder's name (RUN/experiments/NAME/thesis.json -> NAME)."""
    return rundir.name_of(posixpath.dirname(str(path).rstrip("/"))) or str(path)


def _test_name(test: Mapping[str, Any], level: bool) -> str:
    return LEVEL_NAME if level else MEASURE_NAMES.get(str(test.get("measure")), str(test.get("measure")))


def _value(value: Any) -> float:
    return math.nan if value is None else float(value)


def tests_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per test of the document (the Δ tests, then the level tests): regime, test, rho, its
    interval, p (exact or Monte Carlo), pairs, configurations, clusters, and why a test has no rho."""
    confidence = float(document["settings"].get("confidence", 0.95))
    rows = []
    for level, tests in ((False, document["tests"]), (True, document["level_tests"])):
        for test in tests:
            has_rho = test.get("rho") is not None
            p = test.get("p_value")
            rows.append({
                "regime": test["regime"], "test": _test_name(test, level), "ρ": _value(test.get("rho")),
                f"{confidence:.0%} interval": (f"[{test['low']:+.2f}, {test['high']:+.2f}]"
                                               if has_rho and test.get("low") is not None else ""),
                "p": "" if p is None else f"{p:.2g} ({'exact' if test.get('p_exact') else 'Monte Carlo'})",
                "pairs": int(test.get("n_pairs") or 0), "configurations": int(test.get("n_configurations") or 0),
                "clusters": int(test.get("n_clusters") or 0), "note": "" if has_rho else str(test.get("note", "")),
            })
    return pd.DataFrame(rows)


def configurations_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """Each configuration the document formed pairs in: its source's folder, its keys, whether it was
    kept (informative: `none` beats the strongest trivial baseline) and that verdict's numbers."""
    rows = [{"source": thesis_label(entry.get("source", "")),
             **{column: entry.get(column, "") for column in CONFIGURATION_COLUMNS},
             "p_value": "" if entry.get("p_value") is None else f"{entry['p_value']:.2g}"}
            for entry in document["configurations"]]
    frame = pd.DataFrame(rows)
    return frame.dropna(axis=1, how="all") if len(frame) else frame


def rho_chart(document: Mapping[str, Any], name: str, label: str) -> EffectChart | None:
    """Every test's rho with its cluster-bootstrap interval (error bars) and a line at 0; None when no
    test has a rho."""
    settings = document["settings"]
    effects = [Effect(f"{test['regime']}: {'level' if level else 'Δ ' + str(test['measure'])}",
                      float(test["rho"]), _value(test.get("low")), _value(test.get("high")))
               for level, tests in ((False, document["tests"]), (True, document["level_tests"]))
               for test in tests if test.get("rho") is not None]
    if not effects:
        return None
    confidence = float(settings.get("confidence", 0.95))
    subtitle = chart_subtitle(label, f"{len(document['sources'])} results files",
                              f"{document.get('n_pairs_kept', 0)} of {document.get('n_pairs_formed', 0)} pairs kept",
                              f"{settings.get('n_resamples')} cluster-bootstrap resamples")
    return EffectChart(name, "Local-isotropy thesis: Spearman's ρ of each test", subtitle, "regime: test",
                       "Spearman's ρ", effects, value_name=f"ρ, {confidence:.0%} cluster-bootstrap interval",
                       note="Δ global, Δ local: standardised Δ task score against standardised Δ IsoScore (global, "
                            "local) of the head's input, within configuration; level: standardised mean Δ score against "
                            "none's local IsoScore. At 0 isotropy and score move independently, as the thesis expects.")


def pairs_chart(document: Mapping[str, Any], regime: str, name: str, label: str) -> Chart | None:
    """The regime's pairs: standardised Δ task score against standardised Δ local IsoScore, one series
    (markers only) per method; None when the regime has no pair with both."""
    pairs = pd.DataFrame(document["pairs"])
    if pairs.empty or not {"regime", "method", "z_delta_local", "z_delta_score"} <= set(pairs.columns):
        return None
    part = pairs[(pairs["regime"] == regime)].dropna(subset=["z_delta_local", "z_delta_score"])
    if part.empty:
        return None
    series = [Series(str(method), group["z_delta_local"].astype(float).tolist(), group["z_delta_score"].astype(float).tolist(),
                     points=True) for method, group in part.groupby("method", sort=True)]
    test: Mapping[str, Any] = next((t for t in document["tests"] if t["regime"] == regime and t["measure"] == "local"), {})
    rho = ("ρ n/a" if test.get("rho") is None else
           f"ρ = {test['rho']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}], p = {test['p_value']:.2g}")
    subtitle = chart_subtitle(label, f"{regime}", f"{len(part)} pairs", f"{part['task'].nunique()} tasks" if "task" in part else "",
                              rho)
    return Chart(name, f"Standardised Δ task score against standardised Δ local IsoScore ({regime})", subtitle,
                 "Δ local IsoScore of the head's input (z within configuration)", "Δ task score (z within configuration)",
                 series, integer_x=False, zero_line=True,
                 note="One point per (configuration, method, seed): the method's value minus none's of the same seed.")


def _dropped(document: Mapping[str, Any]) -> str:
    items = [f"{drop['n_pairs']} pairs" + (f" ({drop['n_configurations']} configurations)" if "n_configurations" in drop else "")
             + f" at {drop.get('stage', '')}: {drop['reason']}" for drop in document["dropped"]]
    return "<ul>" + "".join(f"<li>{esc(item)}</li>" for item in items) + "</ul>" if items else "<p>Nothing dropped.</p>"


def thesis_body(document: Mapping[str, Any], path: rundir.Target, index: int, run: RunData, page: Page,
                out_path: rundir.Target) -> str:
    """One thesis.json's part of the section (`index` keeps its figures' names apart from another's)."""
    label = thesis_label(path)
    stem = f"thesis_{index}_{safe_name(label)}"
    settings = document["settings"]
    body = (f"<h3>{esc(label)}</h3><p class=\"note\">{esc(rundir.link(out_path, path))}: "
            f"{len(document['sources'])} results files, {document.get('n_pairs_formed', 0)} pairs formed, "
            f"{document.get('n_pairs_kept', 0)} kept "
            f"({'configurations without a trivial-baseline verdict kept' if settings.get('keep_unverified') else 'informative configurations only'}).</p>")
    body += table(tests_table(document), digits=2)
    chart = rho_chart(document, f"{stem}_rho", label)
    if chart is not None:
        body += page.chart(chart, files=[rundir.link(out_path, p) for p in save_effects(chart, run.path)])
    regimes = list(dict.fromkeys(str(p.get("regime")) for p in document["pairs"]))
    for regime in regimes:
        scatter = pairs_chart(document, regime, f"{stem}_pairs_{safe_name(regime)}", label)
        if scatter is not None:
            body += page.chart(scatter, files=[rundir.link(out_path, p) for p in save_figure(scatter, run.path)])
    figure = rundir.THESIS_FIGURE.at(posixpath.dirname(str(path)))
    if rundir.exists(figure):
        body += (f"<p class=\"note\">Every panel (global and local, each regime): "
                 f"<a href=\"{esc(rundir.link(out_path, figure))}\">{esc(rundir.THESIS_FIGURE.name)}</a></p>")
    body += "<h4>Dropped</h4>" + _dropped(document)
    body += ("<details><summary>How the pairs, the standardisation and the tests are made (its settings)</summary>"
             + definition_list([(key, value if isinstance(value, str) else json.dumps(value))
                                for key, value in settings.items()]) + "</details>")
    configurations = configurations_table(document)
    if len(configurations):
        body += (f"<details><summary>Configurations ({len(configurations)}) and their trivial-baseline verdicts</summary>"
                 f"{table(configurations, digits=3)}</details>")
    return body


def thesis_section(run: RunData, page: Page, out_path: rundir.Target) -> str | None:
    """The section's body, or None when the run (and its included folders) holds no thesis.json."""
    if not run.theses:
        return None
    intro = ("<p class=\"note\">Ding et al.'s thesis: the representations are already isotropic locally (within "
             "clusters), so raising their isotropy brings no consistent gain, and a method's change in task score "
             "should not follow its change in isotropy (ρ near 0). Tested by <code>lmgeom experiment thesis</code> "
             "over experiments' results: "
             "Spearman's ρ between the standardised change in task score and the standardised change in "
             "IsoScore (global, and local over clusters) of the head's input, per regime (frozen features, "
             "fine-tuning), on configurations whose none beats its trivial baseline, degenerate cells left out; "
             "its interval resamples (task, model, head, features, pooling, method) clusters, its p permutes "
             "them.</p>")
    return intro + "".join(thesis_body(document, path, index, run, page, out_path)
                           for index, (path, document) in enumerate(run.theses, start=1))

