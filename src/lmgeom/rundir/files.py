"""The run directory's schema: its result files (`ResultFile`: name, producer, kind, schema
version, required keys), where a file of a run is (`target`, `ResultFile.at`) and which file a path is
(`spec_of`). The layout is drawn in `lmgeom.rundir`."""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union


from lmgeom.sitespec import DEFAULT_SITE, site_name
from lmgeom.store import layout
from lmgeom.store.location import Location, is_url

SCHEMA_VERSION = 1

LAYER_NOTE = layout.LAYER_NOTE
"""What the layer numbers are (layer 0 the embedding output), as every document records it."""

Target = Union[Path, str]
"""Where a result file is: a local `Path`, or the file's fsspec URL in a run on another filesystem."""
Where = Union[str, "os.PathLike[str]", Location]
"""A run directory (or a result file): a local path, an fsspec URL or a `Location`."""


def layer_name(layer: int) -> str:
    """What layer `layer` is, in words, as result files and the report name it (`LAYER_NOTE`):
    "embedding output" or "block l"."""
    return "embedding output" if layer == 0 else f"block {layer}"


def target(directory: Where, relative: str = "") -> Target:
    """The file `relative` ('/'-separated) in `directory`: a `Path` when the directory is local (a path
    or a file:// URL), else its URL."""
    if isinstance(directory, Location) or is_url(directory):
        location = Location.of(directory)
        if location.is_local:
            directory = location.root
        else:
            return f"{location.url}/{relative}" if relative else location.url
    return Path(directory) / relative if relative else Path(directory)


def relative_to(directory: Where, path: Target) -> str:
    """`path`, a file below the run `directory`, relative to it ('/'-separated)."""
    base, inner = Location.of(target(directory)), Location.of(path)
    return posixpath.relpath(inner.root, base.root)


def exists(path: Where) -> bool:
    """Whether a result file or folder (a path or URL) is there."""
    return Location.of(path).exists()


def link(page: Target, path: Target) -> str:
    """The relative link from the page `page` to the file `path` on the same filesystem."""
    return posixpath.relpath(Location.of(path).root, posixpath.dirname(Location.of(page).root))


def name_of(path: Target) -> str:
    """The last part of a result file's path or URL."""
    return posixpath.basename(str(path).rstrip("/"))


@dataclass(frozen=True)
class ResultFile:
    """One file (or folder) of a run directory: its path relative to the run (`{layer}`, `{name}`,
    `{method}` stand for parts that vary), the `kind` of a JSON document, the keys a document must hold, its
    schema version, and the command that writes it."""

    name: str
    producer: str
    kind: str = ""  # "" for a file that is not a JSON result document
    required: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def at(self, directory: Where, **parts: Any) -> Target:
        """The file's target in the run `directory` (`parts` fill `{layer}`, `{name}`, ...): a `Path`
        in a local run, else its URL."""
        return target(directory, self.name.format(**parts))

    def find(self, directory: Where) -> list[Target]:
        """The files of this kind in the run `directory` (its `{...}` parts any value), sorted."""
        location = Location.of(target(directory))
        return [target(directory, relative) for relative in sorted(location.files())
                if fnmatch.fnmatchcase(relative, self.pattern)]

    @property
    def pattern(self) -> str:
        """The relative path as a glob (`{layer}` -> `*`)."""
        return re.sub(r"\{[a-z]+\}", "*", self.name)


RUN = ResultFile("run.json", "lmgeom run", "run", ("store", "steps"))
SUMMARY = ResultFile("summary.json", "lmgeom run (writes summary.json)", "layer_summary", ("layers",))
CONTEXTUALITY = ResultFile("contextuality.json", "lmgeom analyze RUN (or lmgeom run)", "contextuality",
                           ("settings", "counts", "records", "findings", "statements"))
CONTEXTUALITY_LAYERS = ResultFile("contextuality_layers.csv", CONTEXTUALITY.producer)
CONTEXTUALITY_WORDS = ResultFile("contextuality_words.csv", "lmgeom analyze RUN (writes contextuality_words.csv)")
ISOTROPY = ResultFile("isotropy.json", "lmgeom run (writes isotropy.json: global and local isotropy of every layer)",
                      "isotropy", ("settings", "records"))
ISOTROPY_CSV = ResultFile("isotropy.csv", ISOTROPY.producer)
CALIBRATION = ResultFile("calibration.json", "lmgeom calibrate RUN --methods whitening,abtt", "calibration",
                         ("settings", "records"))
CALIBRATION_CSV = ResultFile("calibration.csv", CALIBRATION.producer)
CALIBRATORS = ResultFile("calibrators", CALIBRATION.producer)
CALIBRATOR = ResultFile("calibrators/{method}-L{layer}", CALIBRATION.producer)  # + the calibrator's suffix
STATIC = ResultFile("static", "lmgeom static-embeddings RUN --layer L")
STATIC_VECTORS = ResultFile("static/{layer}.kv", STATIC.producer)  # gensim KeyedVectors of the first-PC vectors
STATIC_TEXT = ResultFile("static/{layer}.txt", STATIC.producer)  # the same in word2vec text
STATIC_BENCHMARKS = ResultFile("static/{layer}.benchmarks.json", STATIC.producer, "static_embedding_benchmarks", ("records",))
STATIC_BENCHMARKS_CSV = ResultFile("static/{layer}.benchmarks.csv", STATIC.producer)
GEOMETRY = ResultFile("geometry.json", "lmgeom geometry RUN (or lmgeom run)", "geometry", ("settings", "counts", "layers"))
GEOMETRY_CSV = ResultFile("geometry.csv", GEOMETRY.producer)
ATTRIBUTION = ResultFile("attribution.json", "lmgeom attribute STORE (a store extracted with its family's `--sites`)",
                         "attribution", ("settings", "layers"))
ATTRIBUTION_CSV = ResultFile("attribution.csv", ATTRIBUTION.producer)
LENS = ResultFile("lens.json", "lmgeom lens MODEL --corpus C --out RUN", "lens", ("settings", "counts", "layers"))
LENS_TABLE = ResultFile("lens.parquet", LENS.producer)  # one row per (token position, layer): entropy, KL, rank
LENS_JOIN = ResultFile("lens_join.json", "lmgeom lens-join RUN", "lens_join", ("settings", "by_layer"))
ABLATION = ResultFile("ablation.json", "lmgeom ablate MODEL --corpus C --out RUN", "ablation",
                      ("settings", "counts", "sites", "baseline", "configs"))
ABLATION_CSV = ResultFile("ablation.csv", ABLATION.producer)  # one row per (ablation, measure)
STS_CSV_SUFFIX = ".csv"  # an STS results JSON's records as a table beside it: NAME.json -> NAME.csv
STS = ResultFile("sts.json", "lmgeom sts MODEL --data-dir DIR --out RUN/sts.json", "sts", ("settings", "records"))
EXPERIMENTS = ResultFile("experiments", "an experiment that writes RUN/experiments/NAME/results.json")
EXPERIMENT_RESULTS = ResultFile("experiments/{name}/results.json", EXPERIMENTS.producer)
EXPERIMENT_CONFIG_KEYS = ("experiment", "task", "model", "regime", "features", "method", "head", "pooling", "split", "metric")
"""The keys of an experiment record that name its configuration (the others are its value, seed, ...)."""
# the files of one experiment folder (RUN/experiments/NAME, or any folder given as `out`)
EXPERIMENT_JSON = ResultFile("results.json", EXPERIMENTS.producer)
EXPERIMENT_TABLE = ResultFile("results.md", EXPERIMENTS.producer)
EXPERIMENT_FIGURE = ResultFile("{name}", EXPERIMENTS.producer)  # <split>_<metric>.png|svg in the folder
# `lmgeom experiment thesis` (Ding et al.'s local-isotropy thesis over experiments' results.json): its folder
# (`--out`: RUN/experiments/NAME for a run's report, or any folder the report includes) holds the two files
THESIS = ResultFile("thesis.json", "lmgeom experiment thesis RESULTS.json... --out RUN/experiments/NAME", "thesis",
                    ("settings", "sources", "dropped", "configurations", "tests", "level_tests", "pairs"))
THESIS_FIGURE = ResultFile("thesis.png", THESIS.producer)  # the pairs' scatter, one panel per (regime, measure)
EXPERIMENT_THESIS = ResultFile("experiments/{name}/thesis.json", THESIS.producer)
WSD_PREDICTIONS = ResultFile("predictions.csv", "lmgeom experiment wsd")  # one row an instance: gold and each system's answer
STATIC_BASELINE_VECTORS = ResultFile("vectors/{name}.bin", "lmgeom experiment static-baselines")  # word2vec binary
EXPLORER = ResultFile("explorer.json", "lmgeom report RUN on a run whose store is present", "word_explorer",
                      ("settings", "data"))
SIMILARITY = ResultFile("similarity.json", "lmgeom run (its similarity step), or lmgeom similarity STORE [STORE2] --out DIR", "similarity",
                        ("settings", "counts", "records"))
SIMILARITY_CSV = ResultFile("similarity.csv", SIMILARITY.producer)
SIMILARITY_PAIRS = ResultFile("similarity", "lmgeom similarity STORE STORE2 (writes STORE/similarity/<STORE2 name>/)")
REPORT = ResultFile("report.html", "lmgeom report RUN")
FIGURES = ResultFile("figures", REPORT.producer)
FIGURE = ResultFile("figures/{name}", REPORT.producer)  # <chart>.png|svg
# `lmgeom report RUN1 RUN2 --out DIR`: the comparison's folder (its figures in DIR/figures/)
COMPARE_PAGE = ResultFile("compare.html", "lmgeom report RUN1 RUN2 --out DIR")
COMPARE_CSV = ResultFile("compare.csv", COMPARE_PAGE.producer)
# the similarity of runs i and j (numbered from 1 as given): similarity.json and .csv in the folder
COMPARE_SIMILARITY = ResultFile("similarity/{name}", "lmgeom compare RUN1 RUN2 --out DIR (runs of one corpus)")

# a capture site's results (`lmgeom run --sites`, and `--sites SITE` of analyze, geometry, calibrate, similarity and
# static-embeddings): the site's result files, laid out as at the top of the run, in a folder of its own (not the
# store's `sites/<name>/`, which holds the site's layer arrays and nothing else)
SITE_RESULTS = ResultFile("site_results/{name}", "lmgeom run --sites SITE, or lmgeom analyze|geometry|calibrate|similarity|"
                          "static-embeddings STORE --sites SITE")

RESULT_FILES = (RUN, SUMMARY, CONTEXTUALITY, CONTEXTUALITY_LAYERS, CONTEXTUALITY_WORDS, ISOTROPY, ISOTROPY_CSV, GEOMETRY,
                GEOMETRY_CSV, ATTRIBUTION, ATTRIBUTION_CSV, LENS, LENS_TABLE, LENS_JOIN, ABLATION, ABLATION_CSV, CALIBRATION, CALIBRATION_CSV, CALIBRATORS, STATIC, STATIC_BENCHMARKS, STATIC_BENCHMARKS_CSV,
                EXPERIMENTS, EXPLORER, SIMILARITY, SIMILARITY_CSV, SIMILARITY_PAIRS, REPORT, FIGURES, SITE_RESULTS)
KINDS = {spec.kind: spec for spec in (*RESULT_FILES, STS, THESIS) if spec.kind}
# the step of `lmgeom run` whose settings each of its result files records (`run_settings`)
RUN_STEPS = {CONTEXTUALITY.name: "contextuality", SUMMARY.name: "contextuality", ISOTROPY.name: "isotropy",
             SIMILARITY.name: "similarity", GEOMETRY.name: "geometry", STATIC_BENCHMARKS.name: "static_embeddings"}
# names at the top of a run that hold something other than STS results: the store's and the run's own
RESERVED_NAMES = frozenset({*layout.STORE_NAMES, *(spec.name.split("/")[0] for spec in RESULT_FILES)})
# what makes a folder a run: the store's meta.json or any result file a stage writes
RUN_MARKERS = (layout.META, RUN.name, SUMMARY.name, CONTEXTUALITY.name, ISOTROPY.name, CALIBRATION.name,
                EXPLORER.name, STATIC.name, EXPERIMENTS.name, GEOMETRY.name, ATTRIBUTION.name, LENS.name, ABLATION.name)


def site_results(directory: Where, site: str) -> Target:
    """The folder of capture site `site`'s results in the run `directory`: the run itself for
    `resid_post`, `SITE_RESULTS` (RUN/site_results/<site's folder name>/, `lmgeom.sitespec.site_name`)
    for any other site."""
    return target(directory) if site == DEFAULT_SITE else SITE_RESULTS.at(directory, name=site_name(site))


def spec_of(relative: str) -> ResultFile | None:
    """The result file a path relative to the run directory is (None for any other file)."""
    relative = posixpath.normpath(str(relative).replace(os.sep, "/"))
    head, _, rest = relative.partition("/")
    if head == SITE_RESULTS.name.split("/")[0] and "/" in rest:  # a site's result file: as at the top
        return spec_of(rest.split("/", 1)[1])
    return next((spec for spec in (*RESULT_FILES, CALIBRATOR) if fnmatch.fnmatchcase(relative, spec.pattern)), None)
