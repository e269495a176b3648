"""The result of a contextuality analysis: per-layer records, per word x layer values, findings, and
their files (contextuality.json, contextuality_layers.csv, contextuality_words.csv).

`contextuality_result` builds it from the engine's finished analysis: each statistic of the plan
adds its records, word columns and counts (`lmgeom.engine.statistics.Statistic`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from lmgeom.errors import InputError
from lmgeom import rundir
from lmgeom.engine import Analysis
from lmgeom.metrics.bootstrap import RoughIntervalsWarning, rough_note
from lmgeom.metrics.spectrum import MEV_VARIANTS
from lmgeom.engine.bootstrap import add_intervals, adjacent_layer_tests, design_of, layer_replicates
from lmgeom.stages.findings import ANISOTROPY_THRESHOLD, STATIC_VARIANCE_THRESHOLD, StopwordCounts, findings, tested_findings
from lmgeom.rundir import records_csv, write_result_set
from lmgeom.store.layout import LAYER_NOTE
from lmgeom.store import RepresentationStore

ADJUSTED_DEFINITION = "raw minus baseline, per layer"
SETTINGS_NOTES = {
    "sampling": "occurrences drawn uniformly without replacement from the analysed rows; the same rows at every layer",
    "adjusted_baselines": "SelfSim and IntraSim: anisotropy_exact of the layer; MEV: the same MEV variant "
                          "computed on the sampled occurrences of the layer",
    "anisotropy_threshold": ANISOTROPY_THRESHOLD, "static_variance_threshold": STATIC_VARIANCE_THRESHOLD,
}


def layer_name(layer: int) -> str:
    return "embedding output" if layer == 0 else f"block {layer}"


@dataclass
class ContextualityResult:
    """Per-layer tidy records (`layers`), per word x layer values (`words`), computed findings."""

    layers: pd.DataFrame
    words: pd.DataFrame
    findings: dict[str, Any]
    statements: list[str]
    settings: dict[str, Any]
    counts: dict[str, Any]
    store_meta: dict[str, Any] = field(default_factory=dict)
    store_path: str | os.PathLike[str] | None = None  # where the store is: a local path or an fsspec URL
    definitions: dict[str, str] = field(default_factory=dict)  # metric -> what it is
    plan: dict[str, Any] = field(default_factory=dict)  # the engine's plan (`lmgeom.engine.Analysis.to_json`)
    # the bootstrap's design and adjacent-layer tests (`lmgeom.engine.bootstrap`); empty without one
    bootstrap: dict[str, Any] = field(default_factory=dict)
    written: dict[str, rundir.Target] = field(default_factory=dict)
    # what the analysis computed (`AnalysisOptions.analysis_settings()`): the files' provenance
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per layer x metric: raw, baseline, adjusted."""
        return self.layers.to_dict("records")

    def summary(self) -> pd.DataFrame:
        """One row per layer, one column per metric (raw, and adjusted beside it for a metric with a
        baseline); NaN where a value is undefined (e.g. a centred MEV of words without spread)."""
        wide = self.layers.pivot(index="layer", columns="metric", values=["raw", "adjusted"])
        columns = {}
        for metric in self.layers["metric"].unique():
            columns[metric] = wide[("raw", metric)]
            if (self.layers.loc[self.layers["metric"] == metric, "baseline_source"] != "").any():
                columns[f"{metric}_adjusted"] = wide[("adjusted", metric)]
        table = pd.DataFrame(columns)
        table.insert(0, "layer_name", [layer_name(layer) for layer in table.index])
        return table.reset_index()

    def intervals(self) -> pd.DataFrame:
        """`summary`'s layout for the interval bounds: columns `<metric>_lo`, `<metric>_hi` (raw) and
        `<metric>_adjusted_lo`, `..._hi`; empty without a bootstrap."""
        if "raw_lo" not in self.layers:
            return pd.DataFrame()
        table = pd.DataFrame(index=pd.Index(sorted(self.layers["layer"].unique()), name="layer"))
        for metric, rows in self.layers.groupby("metric", sort=False):
            rows = rows.set_index("layer")
            for kind, suffix in (("raw", ""), ("adjusted", "_adjusted")):
                for bound in ("lo", "hi"):
                    table[f"{metric}{suffix}_{bound}"] = rows[f"{kind}_{bound}"].astype(float)
        return table.reset_index()

    def to_json(self) -> dict[str, Any]:
        """The JSON payload (provenance is added by `write`)."""
        return {
            "layer_note": self.store_meta.get("layer_note") or LAYER_NOTE,
            "settings": self.settings,
            "definitions": self.definitions,
            "counts": self.counts,
            "records": self.records,
            "findings": self.findings,
            "statements": self.statements,
            "plan": self.plan,
            **({"bootstrap": self.bootstrap} if self.bootstrap else {}),
        }

    @classmethod
    def read(cls, store: RepresentationStore, directory: str | os.PathLike[str] | None = None, *,
             options: Mapping[str, Any] | None = None) -> ContextualityResult:
        """The result written by `write` for `store` (default: next to the store), refused when it is
        not the store's, not one set with its tables, or (given `options`, an analysis's
        `analysis_settings()`) computed with other options (`rundir.read_result`)."""
        target = directory if directory is not None else store.url
        document = rundir.read_result(target, rundir.CONTEXTUALITY, settings=options)
        words = rundir.read_words(target)
        if document is None or words is None:
            raise FileNotFoundError(f"no {rundir.CONTEXTUALITY.name} and {rundir.CONTEXTUALITY_WORDS.name} in {target}; "
                                    f"run `{rundir.CONTEXTUALITY.producer}`")
        counts = dict(document["counts"])
        for key in ("zero_vectors_excluded_by_layer", "mean_norm_by_layer"):
            counts[key] = {int(layer): value for layer, value in counts[key].items()}
        records = pd.DataFrame(document["records"]).astype({"raw": float, "baseline": float, "adjusted": float})
        return cls(
            layers=records,
            words=words,
            findings=document["findings"],
            statements=document["statements"],
            settings=document["settings"],
            counts=counts,
            store_meta=dict(store.meta),
            store_path=store.url,
            definitions=document["definitions"],
            plan=document.get("plan", {}),
            bootstrap=document.get("bootstrap", {}),
            options=document[rundir.PROVENANCE]["settings"],
        )

    def write(self, directory: str | os.PathLike[str] | None = None) -> dict[str, rundir.Target]:
        """contextuality.json, contextuality_layers.csv, contextuality_words.csv (default: next to the store)."""
        if directory is not None:
            target: str | os.PathLike[str] = directory
        elif self.store_path is not None:
            target = self.store_path
        else:
            raise InputError("give a directory to write to (this result has no store path)")
        layers_csv, words_csv = rundir.CONTEXTUALITY_LAYERS.at(target), rundir.CONTEXTUALITY_WORDS.at(target)
        document, *companions = write_result_set(
            rundir.CONTEXTUALITY.at(target), rundir.CONTEXTUALITY.kind, self.to_json(), store_meta=self.store_meta,
            settings=self.options, companions=[(layers_csv, records_csv(self.records)),
                                               (words_csv, records_csv(self.words.to_dict("records")))])
        self.written = {"json": document, "layers_csv": companions[0], "words_csv": companions[1]}
        return self.written


def contextuality_result(store: RepresentationStore, analysis: Analysis) -> ContextualityResult:
    """The result of a finished analysis: each statistic's records, word columns and counts, layer by layer."""
    plan, rows = analysis.plan, analysis.rows
    records: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    by_layer: dict[str, dict[int, Any]] = {}
    word_statistics = [stat for stat in plan.statistics if stat.word_columns is not None]
    for layer in plan.layers:
        values = analysis.layers[layer]
        head = {"layer": layer, "layer_name": layer_name(layer)}
        for stat in plan.statistics:
            if stat.records is not None:
                records += [{**head, **record} for record in stat.records(values)]
            if stat.counts is not None:
                for name, value in stat.counts(values).items():
                    by_layer.setdefault(name, {})[layer] = value
        if word_statistics:
            words = rows.words.words
            columns: dict[str, Any] = {**head, **{name: words[name].to_numpy() for name in ("word_id", "word", "count", "contexts")}}
            for stat in word_statistics:
                assert stat.word_columns is not None
                columns.update(stat.word_columns(values))
            frames.append(pd.DataFrame(columns))
    bootstrap: dict[str, Any] = {}
    if plan.options.bootstrap and any(stat.name.startswith("bootstrap") for stat in plan.statistics):
        replicates = {layer: layer_replicates(analysis.layers[layer], rows) for layer in plan.layers}
        add_intervals(records, replicates, plan.options.confidence)
        bootstrap = {**design_of(rows).to_json(), "adjacent_layers": adjacent_layer_tests(records, replicates, plan.options.confidence)}
    rough = rough_note(plan.options.bootstrap) if bootstrap else None
    if rough is not None:
        warnings.warn(rough, RoughIntervalsWarning, stacklevel=2)
        bootstrap["rough"] = rough
    settings = {**plan.options.to_settings(), "layers": list(plan.layers), "device": plan.device, **SETTINGS_NOTES,
                "bootstrap_rough": rough is not None}
    definitions = {metric: text for stat in plan.statistics for metric, text in stat.definitions.items()}
    result = ContextualityResult(
        layers=pd.DataFrame(records),
        words=pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(),
        findings={},
        statements=[],
        settings=settings,
        counts={**rows.counts(), **by_layer},
        store_meta=dict(store.meta),
        store_path=store.url,
        definitions={**definitions, "adjusted": ADJUSTED_DEFINITION},
        plan=analysis.to_json(),
        bootstrap=bootstrap,
        options=plan.options.analysis_settings(),
    )
    if {"baseline", "self_similarity", "intra", "sample", "mev"} <= {stat.name for stat in plan.statistics}:
        result.findings, result.statements = findings(
            result.summary(), result.words, variants=plan.options.mev_variants, intervals=result.intervals(),
            confidence=plan.options.confidence if bootstrap else None, resamples=plan.options.bootstrap if bootstrap else None,
            seed=plan.options.seed)
    return result


def retest_findings(document: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The findings of a written contextuality.json re-derived by today's tests (`lmgeom.stages.findings`)
    from its own numbers: the per-layer values and bootstrap intervals of its `records`, and the
    stopword counts of its `findings.least_self_similar` (a document that records only the stopword
    share among the analysed words gives the count as that share of `counts.words_analysed`, refused
    unless it is a whole number)."""
    records = pd.DataFrame(document["records"]).astype({"raw": float, "baseline": float, "adjusted": float})
    settings = document["settings"]
    result = ContextualityResult(layers=records, words=pd.DataFrame(), findings={}, statements=[], settings=settings,
                                 counts=dict(document["counts"]))
    summary = result.summary()
    if summary.loc[summary["layer"] >= 1].empty:
        return findings(summary, pd.DataFrame())
    least = document["findings"]["least_self_similar"]
    n_words = least.get("n_analysed_words", document["counts"]["words_analysed"])
    n_stop = least.get("n_analysed_stopwords")
    if n_stop is None:
        share = least["stopword_share_among_all_analysed_words"] * n_words
        if abs(share - round(share)) > 1e-6:
            raise InputError(f"the stopword share {least['stopword_share_among_all_analysed_words']} is no whole number of "
                             f"the {n_words} analysed words; re-run `lmgeom analyze` to test the stopword finding",
                             param="document")
        n_stop = round(share)
    bootstrap = document.get("bootstrap") or {}
    return tested_findings(
        summary, StopwordCounts(int(least["layer"]), list(least["words"]), list(least["self_similarity"]), int(n_words), int(n_stop)),
        variants=settings.get("mev_variants") or [v for v in MEV_VARIANTS if f"mev_{v}" in set(records["metric"])],
        intervals=result.intervals() if bootstrap else None,
        confidence=bootstrap.get("level"), resamples=bootstrap.get("B"), seed=settings["seed"])


def write_contextuality(result: ContextualityResult, store: RepresentationStore, out: str | os.PathLike[str] | None) -> list[str]:
    """Write the result files to `out` (a folder or URL; default: next to the store, on any filesystem)."""
    return [str(path) for path in result.write(out if out is not None else store.url).values()]
