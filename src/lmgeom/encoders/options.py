"""`EncoderOptions`: how a model is loaded and how its pieces become word vectors (no torch needed here)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from lmgeom.errors import InputError

# pieces -> words: the mean, first or last piece of each word; "none": no pooling, every piece is a
# row of its own keyed by its piece string (`##ate`), Ethayarajh (2019)'s unit for BERT
POOLINGS = ("mean", "first", "last", "none")


@dataclass(frozen=True)
class EncoderOptions:
    """The encoder stage's options, built once (by the CLI from its flags, by `run` from keywords) and
    passed whole to `load_encoder` and `HFEncoder`.

    `compute_dtype` is the dtype the model computes in (None: float32 on CPU, float16 on CUDA, bfloat16
    for the models that refuse float16); the dtype vectors are stored in is the extraction's
    `storage_dtype`. `device` and the batch limits say where and how fast, not what is computed, and
    are not recorded; `gguf_file` and `revision` say which weights, recorded through the model's
    fingerprint. `to_settings` is what a store records of the rest (`before_final_norm` through its
    `last_layer`); `from_settings` rebuilds them."""

    device: str = "auto"
    compute_dtype: str | None = None
    pooling: str = "mean"
    keep_special: bool = False
    prepend_bos: bool = False
    skip_unaligned: bool = False
    max_length: int | None = None
    max_batch_tokens: int = 8192
    max_batch_size: int = 64
    before_final_norm: bool = False
    gguf_file: str | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise InputError(f"unknown `pooling` {self.pooling!r}; choose one of {', '.join(POOLINGS)}", param="pooling")
        if self.max_batch_tokens < 1 or self.max_batch_size < 1:
            raise InputError(f"`max_batch_tokens` and `max_batch_size` must be at least 1; got {self.max_batch_tokens}, "
                             f"{self.max_batch_size}", param=("max_batch_tokens", "max_batch_size"))

    @classmethod
    def of(cls, options: EncoderOptions | None = None, **keywords: Any) -> EncoderOptions:
        """`options` (default: the defaults) with the fields given as keywords replaced; an unknown
        keyword is refused, naming the fields."""
        unknown = sorted(set(keywords) - set(OPTION_NAMES))
        if unknown:
            raise InputError(f"unknown encoder option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the options are "
                             f"{', '.join(OPTION_NAMES)}", param=tuple(unknown))
        return replace(options or cls(), **keywords)

    def to_settings(self) -> dict[str, Any]:
        """What a store records about these options (`HFEncoder.settings` records them with the
        resolved `max_length` and `compute_dtype`)."""
        return {
            "pooling": self.pooling,
            "special_tokens": "stored" if self.keep_special else "excluded",
            "prepend_bos": self.prepend_bos,
            "skip_unaligned": self.skip_unaligned,
            "max_length": self.max_length,
            "compute_dtype": self.compute_dtype,
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **keywords: Any) -> EncoderOptions:
        """The options a store's settings record (its meta.json), with `keywords` (such as `device`)
        for what they do not. A store written before `before_final_norm` was recorded tells it by its
        `last_layer`."""
        last = settings.get("last_layer")
        before = settings.get("before_final_norm",
                              isinstance(last, dict) and last.get("position") == "before final norm"
                              and "on request" in str(last.get("why", "")))
        pooling = settings.get("pooling", "mean")
        recorded = cls.of(
            pooling=pooling if pooling in POOLINGS else "mean",  # ELMo records it reads whole words
            keep_special=settings.get("special_tokens") == "stored",
            prepend_bos=bool(settings.get("prepend_bos", False)),
            skip_unaligned=bool(settings.get("skip_unaligned", False)),
            max_length=settings.get("max_length"),
            compute_dtype=settings.get("compute_dtype"),
            before_final_norm=bool(before),
        )
        return cls.of(recorded, **keywords)


OPTION_NAMES = tuple(field.name for field in fields(EncoderOptions))
