"""Built-in corpora that need no network, and `load_corpus` / `open_corpus`, which resolve any corpus
spec into a corpus in memory or a stream of it."""

from __future__ import annotations

import difflib
import hashlib
import os
from pathlib import Path
from typing import Iterator

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Corpus, CorpusStream, Item, iter_lines, require_count
from lmgeom.corpus.segment import split_sentences

# Where the public data sits on the development machines; override with LMGEOM_DATA.
DEFAULT_DATA_DIR = Path(os.environ.get("LMGEOM_DATA", Path(__file__).resolve().parents[3].parent / "shared" / "data"))


def gensim_test_data() -> Path:
    """gensim ships the Lee corpus and word benchmarks in its test data folder."""
    import gensim

    return Path(gensim.__file__).parent / "test" / "test_data"


def lee() -> Corpus:
    """gensim's Lee background news corpus (300 documents), split into sentences (see `split_sentences`)."""
    return lee_stream().materialize()


def lee_stream() -> CorpusStream:
    path = gensim_test_data() / "lee_background.cor"

    def read() -> Iterator[Item]:
        for line in iter_lines(path, encoding="latin-1"):
            if line.strip():
                yield from split_sentences(line.strip())
    return CorpusStream("lee", read, source=str(path.resolve()))


def brown(directory: str | os.PathLike | None = None) -> Corpus:
    """The Brown corpus in NLTK format (files ca01..cr09, tokens ``word/tag``), pre-tokenized, tags dropped."""
    return brown_stream(directory).materialize()


def brown_stream(directory: str | os.PathLike | None = None) -> CorpusStream:
    directory = Path(directory) if directory else DEFAULT_DATA_DIR / "brown"
    files = brown_files(directory)

    def read() -> Iterator[Item]:
        for path in files:
            for line in iter_lines(path):
                tokens = line.split()
                if tokens:
                    yield [t.rsplit("/", 1)[0] for t in tokens]
    return CorpusStream("brown", read, source=str(directory.resolve()), pretokenized=True)


def brown_files(directory: Path) -> list[Path]:
    cats = directory / "cats.txt"
    if not cats.exists():
        raise FileNotFoundError(f"{directory} is not an NLTK Brown corpus directory (no cats.txt); give the corpus as brown:/path/to/brown")
    return [directory / line.split()[0] for line in cats.read_text().splitlines() if line.strip()]


def sts(directory: str | os.PathLike | None = None) -> Corpus:
    """The distinct sentences of the SemEval STS 2012-2016 test files (``STS*/STS.input.*.txt``),
    in file order, each pair's first sentence before its second: Ethayarajh (2019)'s corpus."""
    return sts_stream(directory).materialize()


def sts_stream(directory: str | os.PathLike | None = None) -> CorpusStream:
    directory = Path(directory) if directory else DEFAULT_DATA_DIR / "STS_raw"
    files = _sts_files(directory)

    def read() -> Iterator[Item]:
        seen: set[bytes] = set()  # digests of the sentences so far: distinct sentences only
        for path in files:
            for line in iter_lines(path):
                for text in line.split("\t")[:2]:
                    text = text.strip()
                    digest = hashlib.sha1(text.encode("utf-8")).digest()
                    if text and digest not in seen:
                        seen.add(digest)
                        yield text
    return CorpusStream("sts", read, source=str(directory.resolve()))


def sts_scored(directory: str | os.PathLike | None = None) -> Corpus:
    """The SemEval STS 2012-2016 test sentences as the released code of Ethayarajh (2019) reads them
    (kawine/contextual, `preprocess.py`): the pairs with a gold score only (a blank line of
    ``STS.gs.*.txt`` is an unscored pair), both sentences of each pair in file order, duplicates
    kept, every ``"`` removed (the code's `sts.csv` had them stripped)."""
    return sts_scored_stream(directory).materialize()


def sts_scored_stream(directory: str | os.PathLike | None = None) -> CorpusStream:
    directory = Path(directory) if directory else DEFAULT_DATA_DIR / "STS_raw"
    files = _sts_files(directory)
    pairs = []
    for path in files:
        scores = path.with_name(path.name.replace("STS.input.", "STS.gs.", 1))
        if not scores.is_file():
            raise FileNotFoundError(f"{path} has no gold-score file {scores.name} beside it: `sts-scored` keeps the scored "
                                    "pairs only; read the folder as `sts` for every pair")
        pairs.append((path, scores))

    def read() -> Iterator[Item]:
        for path, scores in pairs:
            for line, score in zip(iter_lines(path), iter_lines(scores), strict=True):
                if not score.strip():
                    continue  # an unscored pair
                for text in line.split("\t")[:2]:
                    text = text.replace('"', "").strip()
                    if text:
                        yield text
    return CorpusStream("sts-scored", read, source=str(directory.resolve()))


def _sts_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("STS1*-en-test/STS.input.*.txt"))
    if not files:
        raise FileNotFoundError(f"no STS.input.*.txt files under {directory}/STS1*-en-test/; give the corpus as sts:/path/to/STS_raw")
    return files


BUILTIN_CORPORA = {"lee": lee, "brown": brown, "sts": sts, "sts-scored": sts_scored}
BUILTIN_STREAMS = {"lee": lee_stream, "brown": brown_stream, "sts": sts_stream, "sts-scored": sts_scored_stream}
# No square brackets: the CLI prints errors with rich, which would read "[/CONFIG]" as markup.
ACCEPTED_SPECS = (
    "lee; brown or brown:DIR (NLTK Brown corpus folder); sts or sts:DIR (folder of STS1*-en-test/STS.input.*.txt: its distinct sentences); sts-scored or sts-scored:DIR (the scored pairs' sentences, duplicates kept, as Ethayarajh 2019's released code reads them); "
    "hf:NAME:SPLIT:COLUMN or hf:NAME/CONFIG:SPLIT:COLUMN; a .jsonl file; or a text file with one sentence per line "
    "(a file or folder named lee, brown or sts is written as a path: ./lee)"
)


def load_corpus(
    spec: str, *, field: str = "text", pretokenized: bool = False, limit: int | None = None,
    sample: int | None = None, seed: int = 0,
) -> Corpus:
    """Resolve a corpus spec: ``lee``; ``brown[:DIR]``; ``sts[:DIR]``; ``sts-scored[:DIR]``; ``hf:NAME[/CONFIG]:SPLIT:COLUMN``;
    a ``.jsonl`` file (`field`); any other file, one sentence per line. A spec whose part before the
    first ``:`` is a built-in name is that corpus, whatever the working directory holds: a file or
    folder of that name is written as a path (``./lee``). Then keep the first `limit` sentences of
    a seeded uniform `sample` of them (in corpus order); each is at least 1, or None for all."""
    require_count(limit, "limit")  # before the corpus is read
    require_count(sample, "sample")
    return _load(spec, field=field, pretokenized=pretokenized).select(limit=limit, sample=sample, seed=seed)


def open_corpus(
    spec: str, *, field: str = "text", pretokenized: bool = False, limit: int | None = None,
    sample: int | None = None, seed: int = 0,
) -> CorpusStream:
    """`load_corpus` as a stream: the same sentences, read from the source on every pass and never
    held whole (a Hugging Face dataset is streamed). A bad spec or a missing file fails here; bad
    sentences fail when a pass reaches them."""
    require_count(limit, "limit")
    require_count(sample, "sample")
    return _resolve(spec, field=field, pretokenized=pretokenized, streaming=True).select(limit=limit, sample=sample, seed=seed)


def check_corpus_spec(spec: str) -> str:
    """`spec`, unless it names no built-in corpus, no Hugging Face dataset and no existing file or
    folder: refused at once (before a model loads), with the built-in name it is closest to."""
    name, _, argument = spec.partition(":")
    if name in BUILTIN_CORPORA or name == "hf" or Path(spec).exists():
        return spec
    close = difflib.get_close_matches(name, BUILTIN_CORPORA, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close and not argument else ""
    raise FileNotFoundError(_spec_error(spec, f"neither a built-in corpus nor an existing file{hint}"))


def _spec_error(spec: str, problem: str) -> str:
    return f"corpus {spec!r}: {problem}. Accepted corpora: {ACCEPTED_SPECS}"


def _load(spec: str, *, field: str, pretokenized: bool) -> Corpus:
    return _resolve(spec, field=field, pretokenized=pretokenized, streaming=False).materialize()


def _resolve(spec: str, *, field: str, pretokenized: bool, streaming: bool) -> CorpusStream:
    if not spec.strip():
        raise InputError(_spec_error(spec, "empty corpus spec"))
    name, _, argument = spec.partition(":")
    if name in BUILTIN_CORPORA:  # before any file of that name: ./lee reads a file called lee
        if name == "lee" and argument:
            raise InputError(_spec_error(spec, "the lee corpus takes no argument (it ships with gensim); write plain 'lee'"))
        try:
            if not argument:
                return BUILTIN_STREAMS[name]()
            return {"brown": brown_stream, "sts": sts_stream, "sts-scored": sts_scored_stream}[name](argument)
        except FileNotFoundError as error:
            raise FileNotFoundError(_spec_error(spec, str(error))) from None
    if name == "hf":
        parts = argument.split(":")
        if len(parts) != 3 or not all(part.strip() for part in parts):
            raise InputError(_spec_error(spec, "a Hugging Face corpus is hf:NAME:SPLIT:COLUMN or hf:NAME/CONFIG:SPLIT:COLUMN, e.g. hf:wikitext/wikitext-2-raw-v1:test:text"))
        dataset, _, config = parts[0].partition("/")
        return CorpusStream.from_hf_dataset(dataset, config=config or None, split=parts[1], column=parts[2], streaming=streaming)
    path = Path(check_corpus_spec(spec))
    if path.is_dir():
        if (path / "cats.txt").exists():
            return brown_stream(path)
        if any(path.glob("STS1*-en-test/STS.input.*.txt")):
            return sts_stream(path)
        raise InputError(_spec_error(spec, "this folder is neither an NLTK Brown corpus (no cats.txt) nor STS data (no STS1*-en-test/STS.input.*.txt)"))
    # a file named like a built-in corpus is not named as one: "lee.txt (file)", in meta.json and reports
    file_name = f"{path.name} (file)" if path.stem in BUILTIN_CORPORA else None
    if path.suffix == ".jsonl":
        return CorpusStream.from_jsonl(path, field=field, name=file_name)
    return CorpusStream.from_text_file(path, pretokenized=pretokenized, name=file_name)
