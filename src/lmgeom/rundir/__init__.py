"""The run directory: the names, kinds and schema versions of its result files, their reader and
their atomic writers (as `lmgeom.store.layout` is for the store).

```
RUN/                         a store (lmgeom.store.layout) plus the result files written next to it
  run.json                   lmgeom run's finished steps, their settings and outputs
  summary.json               per-layer mean norm and average cosine
  contextuality.json         the analysis: settings, counts, records, findings
  contextuality_layers.csv   its records;  contextuality_words.csv: word x layer
  isotropy.json, .csv        global and local isotropy of every layer
  geometry.json              intrinsic dimension, outlier panel, uniformity/alignment of every layer
  attribution.json, .csv     each layer's mean, variance and largest entries by the terms that write it
  calibration.json, .csv     isotropy before and after each fitted (layer, method)
  calibrators/<method>-L<layer>.npz|.pt
  static/<layer>.benchmarks.json, .csv, and the layer's static vectors
  *.json of kind "sts"       lmgeom sts --out RUN/NAME.json
  experiments/<name>/results.json
  explorer.json              the word explorer's cache
  similarity.json, .csv      lmgeom similarity: layer x layer CKA, Procrustes, RSA, mutual k-NN
  similarity/<other>/        the same against another store of the corpus
  site_results/<site>/       a capture site's result files (any of the above a stage writes), laid out as here
  report.html, figures/      the report
```

Every JSON document carries `kind`, `schema_version`, the lmgeom version, the model id, the corpus
fingerprint and the layer-0 note. A result of a step over a store also carries its `provenance`:
the store's generation id (`meta.json`'s, new whenever a store is extracted), the full settings of
the step that wrote it (its options' `to_settings()`) and the SHA-256 of each companion file written
with it (the CSV tables beside it). `write_result_set` writes the companions first and the document
last, so the document is the set's manifest: a write cut short leaves the old document beside new
companions, which `provenance_problem` reports as a mixed set. `read_result` (the reader of `report`,
`compare` and `run`) refuses a document of another store, corpus or settings, or of a mixed set,
naming the file, what differs and the command that writes it again. `read_json` returns a document only when it parses, is of the
expected kind and schema version and holds the keys its readers use; anything else is a
`ResultFileError` naming the file and the command that writes it again. Files are read through
`lmgeom.store.location.Location`, so a run on any fsspec URL (s3://, gs://, memory://, file://) reads
and writes the same way: a file's target (`ResultFile.at`) is a `Path` in a local run and its URL
elsewhere, and the writers write all of a file or nothing (a temporary file renamed into place on a
local disk, one PUT on an object store).

The package's modules: `files` (the schema: names, kinds, schema versions, `spec_of`), `read` (the
readers and their checks of kind, version and keys), `write` (the atomic writers), `provenance` (what
a result set records of its store and settings, and the readers' checks of it) and `ownership` (what
lmgeom wrote, and the refusal to overwrite what it did not). Every public name is importable from
`lmgeom.rundir` itself.
"""

from __future__ import annotations

from lmgeom.rundir.files import (  # noqa: F401
    SCHEMA_VERSION, LAYER_NOTE, Target, Where, layer_name, target, relative_to, exists, link, name_of, ResultFile, RUN,
    SUMMARY, CONTEXTUALITY, CONTEXTUALITY_LAYERS, CONTEXTUALITY_WORDS, ISOTROPY, ISOTROPY_CSV, CALIBRATION,
    CALIBRATION_CSV, CALIBRATORS, CALIBRATOR, STATIC, STATIC_VECTORS, STATIC_TEXT, STATIC_BENCHMARKS,
    STATIC_BENCHMARKS_CSV, GEOMETRY, GEOMETRY_CSV, ATTRIBUTION, ATTRIBUTION_CSV, LENS, LENS_TABLE, LENS_JOIN, ABLATION, ABLATION_CSV, STS_CSV_SUFFIX, STS, EXPERIMENTS, EXPERIMENT_RESULTS,
    EXPERIMENT_CONFIG_KEYS, EXPERIMENT_JSON, EXPERIMENT_TABLE, EXPERIMENT_FIGURE, THESIS, THESIS_FIGURE, EXPERIMENT_THESIS,
    WSD_PREDICTIONS,
    STATIC_BASELINE_VECTORS, EXPLORER, SIMILARITY, SIMILARITY_CSV, SIMILARITY_PAIRS, REPORT, FIGURES, FIGURE, SITE_RESULTS,
    COMPARE_PAGE, COMPARE_CSV, COMPARE_SIMILARITY, RESULT_FILES, KINDS, RUN_STEPS, RESERVED_NAMES, RUN_MARKERS,
    site_results, spec_of,
)
from lmgeom.rundir.read import (  # noqa: F401
    ResultFileError, regenerate_hint, is_run, sts_files, sts_table, require_run, read_experiment_results,
    read_json, read_store_meta, read_csv, WORDS_COLUMNS, read_words, problem,
)
from lmgeom.rundir.write import (  # noqa: F401
    jsonable, header_fields, digest, records_csv, write_bytes, figure_bytes, write_json, write_records_csv,
    write_text, write_with,
)
from lmgeom.rundir.provenance import (  # noqa: F401
    PROVENANCE, write_result_set, folder_of, expected_store, FOREIGN, MIXED, STALE, provenance_issue,
    provenance_problem, refuse_foreign_folder, check_result, read_result, run_settings,
)
from lmgeom.rundir.ownership import (  # noqa: F401
    GENERATOR, generator_mark, markdown_mark, foreign_entries, written_by_lmgeom, claim_file,
)

__all__ = [
    "SCHEMA_VERSION", "LAYER_NOTE", "Target", "Where", "layer_name", "target", "relative_to", "exists", "link", "name_of",
    "ResultFile", "RUN", "SUMMARY", "CONTEXTUALITY", "CONTEXTUALITY_LAYERS", "CONTEXTUALITY_WORDS", "ISOTROPY",
    "ISOTROPY_CSV", "CALIBRATION", "CALIBRATION_CSV", "CALIBRATORS", "CALIBRATOR", "STATIC", "STATIC_VECTORS",
    "STATIC_TEXT", "STATIC_BENCHMARKS", "STATIC_BENCHMARKS_CSV", "GEOMETRY", "GEOMETRY_CSV", "ATTRIBUTION", "ATTRIBUTION_CSV", "LENS", "LENS_TABLE", "LENS_JOIN", "ABLATION", "ABLATION_CSV", "STS_CSV_SUFFIX",
    "STS", "EXPERIMENTS", "EXPERIMENT_RESULTS", "EXPERIMENT_CONFIG_KEYS", "EXPERIMENT_JSON", "EXPERIMENT_TABLE",
    "EXPERIMENT_FIGURE", "THESIS", "THESIS_FIGURE", "EXPERIMENT_THESIS", "WSD_PREDICTIONS", "STATIC_BASELINE_VECTORS", "EXPLORER", "SIMILARITY",
    "SIMILARITY_CSV", "SIMILARITY_PAIRS", "REPORT", "FIGURES", "FIGURE", "SITE_RESULTS", "COMPARE_PAGE", "COMPARE_CSV",
    "COMPARE_SIMILARITY", "RESULT_FILES", "KINDS", "RUN_STEPS", "RESERVED_NAMES", "RUN_MARKERS", "site_results", "spec_of",
    "ResultFileError", "regenerate_hint", "is_run", "sts_files", "sts_table", "require_run",
    "read_experiment_results", "read_json", "read_store_meta", "read_csv", "WORDS_COLUMNS", "read_words",
    "problem", "jsonable", "header_fields", "digest", "records_csv", "write_bytes", "figure_bytes",
    "write_json", "write_records_csv", "write_text", "write_with", "PROVENANCE", "write_result_set",
    "folder_of", "expected_store", "FOREIGN", "MIXED", "STALE", "provenance_issue", "provenance_problem",
    "refuse_foreign_folder", "check_result", "read_result", "run_settings", "GENERATOR", "generator_mark",
    "markdown_mark", "foreign_entries", "written_by_lmgeom", "claim_file",
]
