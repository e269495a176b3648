"""Tiny randomly initialised models for tests and demos, one per tokenizer family.

Each tokenizer is trained (deterministically, in about a second) on gensim's Lee corpus, so
nothing is downloaded: `tiny-bert` (WordPiece, adds [CLS]/[SEP]), `tiny-gpt2` (byte-level BPE,
adds nothing), `tiny-llama` (SentencePiece-style Unigram with the ▁ marker, adds <s>).
"""

from __future__ import annotations

from functools import lru_cache

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

TINY_MODELS = ("tiny-bert", "tiny-gpt2", "tiny-llama")
_VOCAB_SIZE = 2000
_HIDDEN = 32
_LAYERS = 3


def _training_text() -> list[str]:
    from lmgeom.corpus.builtin import gensim_test_data

    return (gensim_test_data() / "lee_background.cor").read_text(encoding="latin-1").splitlines()


@lru_cache(maxsize=None)
def tiny_tokenizer(name: str) -> PreTrainedTokenizerFast:
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
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
            mask_token="[MASK]", model_max_length=64,
        )
    if name == "tiny-gpt2":
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
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", model_max_length=64
        )
    if name == "tiny-llama":
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
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=64
        )
    raise ValueError(f"unknown tiny model {name!r}; choose one of {TINY_MODELS}")


def tiny_model(name: str, *, seed: int = 0) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A seeded random model of the named family with its trained tokenizer."""
    tokenizer = tiny_tokenizer(name)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    if name == "tiny-bert":
        config = BertConfig(
            vocab_size=vocab, hidden_size=_HIDDEN, num_hidden_layers=_LAYERS, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        )
        model = BertModel(config, add_pooling_layer=False)
    elif name == "tiny-gpt2":
        config = GPT2Config(
            vocab_size=vocab, n_embd=_HIDDEN, n_layer=_LAYERS, n_head=2, n_positions=64,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        model = GPT2Model(config)
    else:
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=_HIDDEN, num_hidden_layers=_LAYERS, num_attention_heads=2,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        model = LlamaModel(config)
    return model.eval(), tokenizer
