"""ELMo (Peters et al. 2018) in PyTorch: the character-CNN biLM, the published weights layout,
and training here. Its encoder for the representation store is `lmgeom.encoders.elmo.ElmoEncoder`."""

from lmgeom.elmo.chars import batch_to_ids, word_ids
from lmgeom.elmo.model import BiLMOutput, ElmoBiLM, ElmoConfig
from lmgeom.elmo.train import Perplexity, TrainConfig, TrainResult, perplexity, split_corpus, train
from lmgeom.elmo.weights import load_elmo, save_elmo

__all__ = [
    "BiLMOutput", "ElmoBiLM", "ElmoConfig", "Perplexity", "TrainConfig", "TrainResult",
    "batch_to_ids", "load_elmo", "perplexity", "save_elmo", "split_corpus", "train", "word_ids",
]
