"""lmgeom: how contextual are a language model's representations, and how is their space shaped?"""

from lmgeom._version import __version__
from lmgeom.corpus import Corpus, Vocabulary, load_corpus
from lmgeom.encoders import HFEncoder, load_encoder
from lmgeom.store import RepresentationStore, extract, write_store_from_arrays

__all__ = ["Corpus", "HFEncoder", "RepresentationStore", "Vocabulary", "__version__", "extract", "load_corpus", "load_encoder", "write_store_from_arrays"]
