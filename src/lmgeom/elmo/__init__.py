"""ELMo (Peters et al. 2018) in PyTorch: the character-CNN biLM, the published weights layout,
training here, and an encoder for the representation store."""

from lmgeom.elmo.chars import batch_to_ids, word_ids
from lmgeom.elmo.encoder import ElmoEncoder, load_elmo_encoder
from lmgeom.elmo.model import BiLMOutput, ElmoBiLM, ElmoConfig
from lmgeom.elmo.train import Perplexity, TrainConfig, TrainResult, perplexity, split_corpus, train
from lmgeom.elmo.weights import load_elmo, save_elmo

__all__ = [
    "BiLMOutput", "ElmoBiLM", "ElmoConfig", "ElmoEncoder", "Perplexity", "TrainConfig", "TrainResult",
    "batch_to_ids", "load_elmo", "load_elmo_encoder", "perplexity", "save_elmo", "split_corpus", "train", "word_ids",
]
