"""`AnalysisOptions`: everything an analysis of a store is asked for, as one frozen object.

Built once (by the CLI from its flags, by `analyze_store` or `run` from keywords) and passed whole to
the plan and the executors. `to_settings()` is what the result files record; `from_settings()` reads
it back, so a result (the word explorer, merged shards) is re-read with exactly the options that
produced it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from lmgeom.errors import InputError
from lmgeom.sitespec import DEFAULT_SITE, check_site
from lmgeom.metrics.bootstrap import check_options as check_bootstrap
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS
from lmgeom.metrics.spectrum import MEV_VARIANTS, mev_variants
from lmgeom.engine.selection import COUNT_UNITS
from lmgeom.engine.loop import DEFAULT_CHUNK_ROWS

DEFAULT_MEV_MEMORY_MB = 512
# the word threshold of `run` and `analyze`: words in at least 5 distinct sentences (the unit, distinct
# sentences, is `static-embeddings`' too, which exports every word unless asked otherwise)
DEFAULT_MIN_CONTEXTS = 5
DEFAULT_COUNT_BY = "sentences"
# the statistics of the contextuality analysis (Ethayarajh 2019), in the order their records appear
CONTEXTUALITY_STATISTICS = ("baseline", "norms", "sample", "self_similarity", "intra", "mev")
# the released code's sampled statistics (`lmgeom.engine.released`)
RELEASED_STATISTICS = ("released_sample", "self_similarity_released")
ENGINES = ("auto", "local", "processes", "ray")
# options that say how an analysis runs, not what it computes: shards computed on other machines
# (another device, other workers) merge
EXECUTION_FIELDS = ("device", "engine", "num_workers", "chunk_rows", "row_parts", "ray_address")


@dataclass(frozen=True)
class AnalysisOptions:
    """What an analysis of a store computes and how it runs.

    What: rows follow `lmgeom.engine.selection` (`include_special`, `include_punct`,
    `exclude_first_word`); word statistics use the words occurring at least `min_contexts` times,
    counted in distinct sentences or occurrences (`count_by`); `n_samples` occurrences drawn with
    `seed` make the sampled baselines (and, for the released code's statistics, `n_samples`
    sentences, pairs and pairs per word); `protocol` names the protocol that set these options
    (`PROTOCOLS`; None: lmgeom's defaults); `layers` (None:
    every layer); `statistics`: the registered statistics computed (`lmgeom.engine.statistics`);
    `mev_variants`: the MEV variants solved; `mev_memory_mb` bounds the per-word occurrence matrices
    held at once (the other word groups wait in scratch files); `isotropy_rows` selected rows (drawn
    with `seed`) and `isotropy_clusters` k-means clusters make the isotropy measures; `geometry_rows`
    selected rows (drawn with `seed`) the intrinsic dimension, and `top_activations` the largest |h|
    of a layer located (`lmgeom.stages.geometry`); `bootstrap` resamples (0: none) give each
    contextuality number a `confidence` percentile interval (`lmgeom.engine.bootstrap`, seeded
    with `seed`). `site`: the capture site read (`lmgeom.sitespec`; a store's `sites`), by default
    `resid_post`, the residual stream every store holds.
    How: `device` where block statistics compute (cpu, cuda, cuda:N, auto, torch:cpu); `engine`
    (`auto`: `processes` when `num_workers` > 1, else `local`; `ray`); `num_workers` tasks at once;
    `row_parts` row ranges per layer (None: 1, or 2 per worker on Ray; more than 1 gives a task per
    row range and word group, so that no task holds the state of every word); `chunk_rows` rows read
    at a time; `ray_address` the Ray cluster to join (None: RAY_ADDRESS or a local one)."""

    min_contexts: int = DEFAULT_MIN_CONTEXTS
    count_by: str = DEFAULT_COUNT_BY
    include_special: bool = False
    include_punct: bool = False
    exclude_first_word: bool = False
    seed: int = 0
    n_samples: int = 1000
    layers: tuple[int, ...] | None = None
    mev_memory_mb: float = DEFAULT_MEV_MEMORY_MB
    mev_variants: tuple[str, ...] = MEV_VARIANTS
    statistics: tuple[str, ...] = CONTEXTUALITY_STATISTICS
    isotropy_rows: int = REPORT_MAX_ROWS
    isotropy_clusters: int = 8
    geometry_rows: int = 5000
    top_activations: int = 10
    bootstrap: int = 1000
    confidence: float = 0.95
    device: str = "cpu"
    engine: str = "auto"
    num_workers: int = 1
    row_parts: int | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    ray_address: str | None = None
    protocol: str | None = None
    site: str = DEFAULT_SITE

    def __post_init__(self) -> None:
        check_site(self.site, param="site")
        # sequences given as lists (from JSON or a caller) become tuples: the options stay hashable
        for name in ("layers", "mev_variants", "statistics"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "mev_variants", mev_variants(self.mev_variants))
        if self.min_contexts < 1:
            raise InputError(f"`min_contexts` must be at least 1; got {self.min_contexts}", param="min_contexts")
        if self.num_workers < 1:
            raise InputError(f"`num_workers` must be at least 1 (1 analyses one task after another in this process); "
                             f"got {self.num_workers}", param="num_workers")
        if self.n_samples < 1:
            raise InputError(f"`n_samples` must be at least 1; got {self.n_samples}", param="n_samples")
        if not self.mev_memory_mb > 0:
            raise InputError(f"`mev_memory_mb` must be above 0; got {self.mev_memory_mb}", param="mev_memory_mb")
        if self.row_parts is not None and self.row_parts < 1:
            raise InputError(f"`row_parts` must be at least 1; got {self.row_parts}", param="row_parts")
        if self.isotropy_rows < 2 or self.isotropy_clusters < 1:
            raise InputError(f"`isotropy_rows` must be at least 2 and `isotropy_clusters` at least 1; got "
                             f"{self.isotropy_rows} and {self.isotropy_clusters}", param="isotropy_rows")
        if self.geometry_rows < 2 or self.top_activations < 1:
            raise InputError(f"`geometry_rows` must be at least 2 and `top_activations` at least 1; got "
                             f"{self.geometry_rows} and {self.top_activations}", param="geometry_rows")
        check_bootstrap(self.bootstrap, self.confidence)
        if self.chunk_rows < 1:
            raise InputError(f"`chunk_rows` must be at least 1; got {self.chunk_rows}", param="chunk_rows")
        if self.count_by not in COUNT_UNITS:
            raise InputError(f"unknown `count_by` {self.count_by!r}; use one of {', '.join(COUNT_UNITS)}", param="count_by")
        if self.protocol is not None:
            settings = protocol_settings(self.protocol)
            differing = [name for name, value in settings.items() if getattr(self, name) != value]
            if differing:
                name = differing[0]
                raise InputError(f"`protocol={self.protocol!r}` sets `{name}={settings[name]!r}`; got "
                                 f"`{name}={getattr(self, name)!r}`", param=("protocol", name))
        if self.engine not in ENGINES:
            raise InputError(f"unknown `engine` {self.engine!r}; use one of {', '.join(ENGINES)}", param="engine")

    def replace(self, **changes: Any) -> AnalysisOptions:
        return dataclasses.replace(self, **changes)

    def to_settings(self) -> dict[str, Any]:
        """The options as JSON (what result files record under `settings`)."""
        settings = dataclasses.asdict(self)
        for name in ("layers", "mev_variants", "statistics"):
            if settings[name] is not None:
                settings[name] = list(settings[name])
        if settings["site"] == DEFAULT_SITE:  # the settings of an analysis of resid_post, as before sites
            del settings["site"]
        return settings

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **changes: Any) -> AnalysisOptions:
        """The options recorded by `to_settings` (other keys of a result's settings are ignored), with
        `changes`. Files written before `include_punct` was recorded hold `exclude_punct`, its negation."""
        names = {field.name for field in dataclasses.fields(cls)}
        known = {key: value for key, value in settings.items() if key in names}
        if "include_punct" not in known and "exclude_punct" in settings:
            known["include_punct"] = not bool(settings["exclude_punct"])
        return cls(**{**known, **changes})

    def analysis_settings(self) -> dict[str, Any]:
        """`to_settings` without the options of how it runs: what two shards must share to merge."""
        return {key: value for key, value in self.to_settings().items() if key not in EXECUTION_FIELDS}


ROW_FIELDS = ("include_special", "include_punct", "exclude_first_word", "protocol")
"""The analysis options that say which rows a step reads (`lmgeom.engine.selection`) and the protocol that set them."""
WORD_FIELDS = ("min_contexts", "count_by")
"""The analysis options that say which words a step keeps."""


@dataclass(frozen=True)
class StepOptions:
    """The options of one step of `lmgeom run` over a store, passed whole: `analysis`, how the step
    reads the store (the rows and words, the seed, the device and executor; `AnalysisOptions`), and
    the step's own fields (a subclass's). `to_settings()` is what changes the step's numbers: the
    analysis fields of `ANALYSIS_FIELDS` (and its `site`, when not `resid_post`) and the step's own,
    never how it runs; result files record it
    (`lmgeom.rundir.write_result_set`) and `run` compares it to skip a finished step."""

    analysis: AnalysisOptions = AnalysisOptions()
    ANALYSIS_FIELDS: ClassVar[tuple[str, ...]] = ROW_FIELDS

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def to_settings(self) -> dict[str, Any]:
        analysis = self.analysis.to_settings()
        own = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name != "analysis"}
        own = {name: list(value) if isinstance(value, tuple) else value for name, value in own.items()}
        site = {"site": analysis["site"]} if "site" in analysis else {}  # the site read, when not resid_post
        return {**{name: analysis[name] for name in self.ANALYSIS_FIELDS}, **site, **own}


# Protocols: named sets of options that reproduce a paper's released code. `ethayarajh2019`: the
# analysis of kawine/contextual (`preprocess.py`, `analyze.py`): words of at least 5 occurrences,
# punctuation left out, and its sampled statistics (1,000 sentences with one random word each, 1,000
# pairs of those drawn with replacement, IntraSim over the 1,000 sentences, SelfSim over at most 1,000
# sampled pairs per word, MEV as TruncatedSVD's ratio clipped at 1, values rounded to 3 decimals) beside
# lmgeom's. The corpus (`sts-scored`) and the units (WordPiece pieces of BERT-style models) are the
# extraction's part of the protocol (`lmgeom.pipeline.job.protocol_extraction`).
PROTOCOLS: dict[str, dict[str, Any]] = {
    "ethayarajh2019": {
        "min_contexts": 5, "count_by": "occurrences", "n_samples": 1000, "include_punct": False,
        "include_special": False, "exclude_first_word": False,
    },
}


def protocol_settings(protocol: str) -> dict[str, Any]:
    """The analysis options `protocol` sets (`PROTOCOLS`; its statistics are `protocol_options`')."""
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown `protocol` {protocol!r}; use one of {', '.join(PROTOCOLS)}", param="protocol")
    return dict(PROTOCOLS[protocol])


def protocol_options(protocol: str | None, **given: Any) -> dict[str, Any]:
    """The options of an analysis: the `given` ones (None: not given) with those `protocol` sets.
    A given option the protocol sets to another value is refused, naming both (a given one equal to
    the protocol's is kept)."""
    chosen = {name: value for name, value in given.items() if value is not None}
    if protocol is None:
        return chosen
    settings = protocol_settings(protocol)
    for name, value in chosen.items():
        if name in settings and value != settings[name]:
            raise InputError(f"`protocol={protocol!r}` sets `{name}={settings[name]!r}`; got `{name}={value!r}`: "
                             "leave that option out, or the protocol", param=("protocol", name))
    statistics = tuple(chosen.get("statistics") or CONTEXTUALITY_STATISTICS)
    statistics += tuple(name for name in RELEASED_STATISTICS if name not in statistics)
    return {**chosen, **settings, "statistics": statistics, "protocol": protocol}
