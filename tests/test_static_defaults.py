"""Static vectors keep the analysis's word threshold by default (one default for run, analyze and
static-embeddings)."""
from __future__ import annotations

import numpy as np
import pytest

from lmgeom.errors import InputError
from lmgeom.stages import static_embeddings
from lmgeom.engine.options import DEFAULT_COUNT_BY, DEFAULT_MIN_CONTEXTS, AnalysisOptions
from lmgeom.store import write_store_from_arrays

# "the" is in 5 distinct sentences, "a" 5 times but in 3 sentences, "cat" in 2
SENTENCES = ["the cat sat".split(), "the dog ran".split(), "a cat and a dog".split(), "the car".split(),
             "a bus and a car".split(), "the bus left".split(), "a day and the night".split()]


def test_the_default_threshold_is_the_analysis_one(tmp_path):
    assert AnalysisOptions().min_contexts == DEFAULT_MIN_CONTEXTS == 5 and DEFAULT_COUNT_BY == "sentences"
    words = [w for sentence in SENTENCES for w in sentence]
    rng = np.random.default_rng(0)
    store = write_store_from_arrays(tmp_path / "store", [rng.normal(size=(len(words), 4)) for _ in range(2)],
                                    SENTENCES)
    assert static_embeddings(store, layer=1).words == ["the"]  # only "the" is in >= 5 sentences
    # by occurrences, "a" (5 times in 3 sentences) joins
    assert set(static_embeddings(store, layer=1, count_by="occurrences").words) == {"a", "the"}
    assert set(static_embeddings(store, layer=1, min_contexts=2).words) == {"the", "a", "cat", "dog", "and", "car", "bus"}
    with pytest.raises(InputError, match="min_contexts"):
        static_embeddings(store, layer=1, min_contexts=6)
