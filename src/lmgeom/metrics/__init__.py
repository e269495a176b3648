"""Metrics stage: contextuality (Ethayarajh 2019) and isotropy of representation spaces. Pure: arrays
and accumulators in, numbers out (the store-level analysis is `lmgeom.stages.analyze_store`).

Array-level functions take (n_points, dim) arrays; every streaming statistic is an accumulator
following `lmgeom.metrics.base.Accumulator` (`add`, `merge`, `result`, `state_dict`), whose states
are saved and loaded with `save_states` / `load_states`.
"""

from __future__ import annotations

from lmgeom.metrics.base import Accumulator, load_states, save_states
from lmgeom.metrics.contextuality import (
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
    WordMeanAccumulator,
    average_cosine,
    intra_sentence_similarity,
    sampled_average_cosine,
    self_similarity,
)
from lmgeom.metrics.mev import MEVAccumulator, first_principal_direction, mev, occurrence_spectrum
from lmgeom.metrics.spectrum import MEV_VARIANTS, OccurrenceSpectrum
from lmgeom.metrics.isotropy import (
    CosineContributionAccumulator,
    LocalIsotropy,
    MomentAccumulator,
    Moments,
    PartitionFunctionAccumulator,
    RogueDimensions,
    cosine_contributions,
    covariance_isotropy,
    effective_rank,
    isoscore,
    isotropy_report,
    local_isotropy,
    log_partition_isotropy,
    partition_directions,
    participation_ratio,
    partition_isotropy,
    rogue_dimensions,
    top_pc_variance_share,
)

__all__ = [
    "MEV_VARIANTS",
    "Accumulator",
    "AverageCosineAccumulator",
    "CosineContributionAccumulator",
    "IntraSentenceAccumulator",
    "LocalIsotropy",
    "MEVAccumulator",
    "MeanNormAccumulator",
    "MomentAccumulator",
    "Moments",
    "OccurrenceSpectrum",
    "PartitionFunctionAccumulator",
    "RogueDimensions",
    "RowSampleAccumulator",
    "SelfSimilarityAccumulator",
    "WordMeanAccumulator",
    "average_cosine",
    "cosine_contributions",
    "covariance_isotropy",
    "effective_rank",
    "first_principal_direction",
    "intra_sentence_similarity",
    "isoscore",
    "isotropy_report",
    "load_states",
    "local_isotropy",
    "log_partition_isotropy",
    "mev",
    "occurrence_spectrum",
    "partition_directions",
    "participation_ratio",
    "partition_isotropy",
    "rogue_dimensions",
    "sampled_average_cosine",
    "save_states",
    "self_similarity",
    "top_pc_variance_share",
]
