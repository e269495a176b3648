"""Tiny randomly initialised models for tests and demos, one per tokenizer family.

The tokenizers were trained on gensim's Lee corpus, so nothing is downloaded: `tiny-bert`
(WordPiece, adds [CLS]/[SEP]), `tiny-gpt2` (byte-level BPE, adds nothing), `tiny-llama`
(SentencePiece-style Unigram with the ▁ marker, adds <s>). They ship as JSON files in
`tiny_tokenizers/`, because the Rust trainers break frequency ties in a hash order that changes
from one Python process to the next: training at load time gave a different vocabulary in every
process, so a resumed extraction could mix two tokenizers. The files were written by
`train_tiny_tokenizer(name).save(path, pretty=True)` (tokenizers 0.23); running that again gives
the same kind of tokenizer but not necessarily the same token ids.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaModel,
    PreTrainedTokenizerFast,
)

from lmgeom.errors import InputError

TINY_MODELS = ("tiny-bert", "tiny-gpt2", "tiny-llama")
_VOCAB_SIZE = 2000
_HIDDEN = 32
_LAYERS = 3


def _training_text() -> list[str]:
    from lmgeom.corpus.builtin import gensim_test_data

    return (gensim_test_data() / "lee_background.cor").read_text(encoding="latin-1").splitlines()


TOKENIZER_DIR = Path(__file__).parent / "tiny_tokenizers"
# Special tokens the transformers wrapper is told about, per model.
_SPECIAL_TOKENS: dict[str, dict[str, str]] = {
    "tiny-bert": {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"},
    "tiny-gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "tiny-llama": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}


def _check_name(name: str) -> None:
    if name not in TINY_MODELS:
        raise InputError(f"unknown tiny model {name!r}; choose one of {TINY_MODELS}")


@lru_cache(maxsize=None)
def tiny_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The shipped tokenizer of a tiny model: the same token ids in every process."""
    _check_name(name)
    backend = Tokenizer.from_file(str(TOKENIZER_DIR / f"{name}.json"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=64, **_SPECIAL_TOKENS[name])


def train_tiny_tokenizer(name: str) -> Tokenizer:
    """Train a tiny model's tokenizer on the Lee corpus, as the shipped files were made (about a
    second). Ties between equally frequent merges are broken differently in each process."""
    _check_name(name)
    text = _training_text()
    if name == "tiny-bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=_VOCAB_SIZE, special_tokens=specials, show_progress=False))
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
        )
        tok.decoder = decoders.WordPiece()
    elif name == "tiny-gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.train_from_iterator(
            text,
            trainers.BpeTrainer(
                vocab_size=_VOCAB_SIZE, special_tokens=["<|endoftext|>"], show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        specials = ["<unk>", "<s>", "</s>"]
        tok.train_from_iterator(
            text, trainers.UnigramTrainer(vocab_size=_VOCAB_SIZE, special_tokens=specials, unk_token="<unk>", show_progress=False)
        )
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return tok


def tiny_model(name: str, *, seed: int = 0) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A seeded random model of the named family with its shipped tokenizer."""
    tokenizer = tiny_tokenizer(name)
    with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's global RNG
        torch.manual_seed(seed)
        model = _random_model(name, tokenizer)
    return model.eval(), tokenizer


def _random_model(name: str, tokenizer: Any) -> torch.nn.Module:
    vocab = len(tokenizer)
    if name == "tiny-bert":
        bert_config = BertConfig(
            vocab_size=vocab, hidden_size=_HIDDEN, num_hidden_layers=_LAYERS, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        )
        return BertModel(bert_config, add_pooling_layer=False)
    if name == "tiny-gpt2":
        gpt2_config = GPT2Config(
            vocab_size=vocab, n_embd=_HIDDEN, n_layer=_LAYERS, n_head=2, n_positions=64,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        return GPT2Model(gpt2_config)
    llama_config = LlamaConfig(
        vocab_size=vocab, hidden_size=_HIDDEN, num_hidden_layers=_LAYERS, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaModel(llama_config)
