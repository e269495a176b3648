"""Metrics stage: contextuality (Ethayarajh 2019) and isotropy of representation spaces.

Array-level functions take (n_points, dim) arrays; accumulators stream chunks and merge shards
(`lmgeom.metrics.base`); `analyze_store` runs the contextuality analysis over a store.
"""

from lmgeom.metrics.analyze import ContextualityResult, analyze_store
from lmgeom.metrics.contextuality import (
    MEV_VARIANTS,
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MEVAccumulator,
    OccurrenceSpectrum,
    SelfSimilarityAccumulator,
    average_cosine,
    first_principal_direction,
    intra_sentence_similarity,
    mev,
    occurrence_spectrum,
    sampled_average_cosine,
    self_similarity,
)
from lmgeom.metrics.isotropy import (
    LocalIsotropy,
    MomentAccumulator,
    Moments,
    RogueDimensions,
    cosine_contributions,
    covariance_isotropy,
    effective_rank,
    isoscore,
    isotropy_report,
    local_isotropy,
    log_partition_isotropy,
    participation_ratio,
    partition_isotropy,
    rogue_dimensions,
    top_pc_variance_share,
)
from lmgeom.metrics.static import StaticEmbeddings, benchmark_static_embeddings, static_embeddings

__all__ = [
    "MEV_VARIANTS",
    "AverageCosineAccumulator",
    "ContextualityResult",
    "IntraSentenceAccumulator",
    "MEVAccumulator",
    "OccurrenceSpectrum",
    "SelfSimilarityAccumulator",
    "StaticEmbeddings",
    "analyze_store",
    "average_cosine",
    "benchmark_static_embeddings",
    "first_principal_direction",
    "intra_sentence_similarity",
    "mev",
    "occurrence_spectrum",
    "sampled_average_cosine",
    "self_similarity",
    "static_embeddings",
    "LocalIsotropy",
    "MomentAccumulator",
    "Moments",
    "RogueDimensions",
    "cosine_contributions",
    "covariance_isotropy",
    "effective_rank",
    "isoscore",
    "isotropy_report",
    "local_isotropy",
    "log_partition_isotropy",
    "participation_ratio",
    "partition_isotropy",
    "rogue_dimensions",
    "top_pc_variance_share",
]
