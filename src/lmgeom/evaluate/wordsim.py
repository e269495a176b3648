"""Word-similarity (Spearman) and analogy (3CosAdd) scores of static word vectors, with gensim.

Benchmarks match case-insensitively: a benchmark word matches the most frequent casing of it
among the vectors (gensim's `case_insensitive=True` keeps the first key of each casing, so
vectors must be ordered by frequency, most frequent first, as `StaticEmbeddings` does).
Coverage is reported as covered / total pairs (or questions); scores use covered items only.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gensim
from gensim.models import KeyedVectors

from lmgeom.errors import InputError

_GENSIM_TEST_DATA = Path(gensim.__file__).parent / "test" / "test_data"
GENSIM_BENCHMARKS = {
    "simlex999": _GENSIM_TEST_DATA / "simlex999.txt",
    "wordsim353": _GENSIM_TEST_DATA / "wordsim353.tsv",
    "google_analogies": _GENSIM_TEST_DATA / "questions-words.txt",
}


@dataclass
class WordPairs:
    pairs: list[tuple[str, str, float]]
    score_column: int
    skipped_lines: int


def _fields(line: str) -> list[str]:
    if "\t" in line:
        return [f.strip() for f in line.split("\t")]
    if "," in line:
        return [f.strip() for f in line.split(",")]
    return line.split()


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def read_word_pairs(path: str | os.PathLike) -> WordPairs:
    """Word pairs with a gold score from a tab-, comma- or space-separated file.

    Lines starting with '#' and header lines are skipped; CRLF is fine. The score is the first
    column after the two words that is numeric on every data line (so SimLex-999's POS column
    is passed over); further columns are ignored.
    """
    path = Path(path)
    rows = [_fields(line) for line in path.read_text(encoding="utf-8-sig").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    rows = [row for row in rows if len(row) >= 3]
    data = rows[1:] if rows and not any(_is_number(field) for field in rows[0][2:]) else rows
    if not data:
        raise InputError(f"{path} holds no word pairs{' (only a header line)' if rows else ''}: expected lines "
                         "'word1<TAB>word2<TAB>score' (tabs, commas or spaces)")
    score_column = next(
        (column for column in range(2, max(len(row) for row in data))
         if all(column < len(row) and _is_number(row[column]) for row in data)),
        None,
    )
    if score_column is None:
        raise InputError(f"{path}: no column after the two words is numeric on every line, so no gold score was found")
    pairs = [(row[0], row[1], float(row[score_column])) for row in data]
    return WordPairs(pairs=pairs, score_column=score_column, skipped_lines=len(rows) - len(data))


def is_analogy_file(path: str | os.PathLike) -> bool:
    """Google-analogy format: ': section' headers and 'a b c d' question lines."""
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            if line.strip():
                return line.startswith(":")
    return False


def evaluate_word_pairs(vectors: KeyedVectors, path: str | os.PathLike, *, name: str | None = None) -> dict[str, Any]:
    """Spearman (and Pearson) between gold scores and cosine similarities, on the covered pairs."""
    pairs = read_word_pairs(path)
    # gensim reads only 'a<delim>b<delim>score' lines: hand it a normalised copy
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False, encoding="utf-8") as handle:
        handle.writelines(f"{a}\t{b}\t{score!r}\n" for a, b, score in pairs.pairs)
    try:
        pearson, spearman, oov_percent = vectors.evaluate_word_pairs(
            handle.name, delimiter="\t", restrict_vocab=len(vectors), case_insensitive=True
        )
        covered = round(len(pairs.pairs) * (1 - oov_percent / 100))
        spearman_rho, spearman_p, pearson_r = float(spearman[0]), float(spearman[1]), float(pearson[0])
    except ValueError:  # gensim raises when no pair is covered
        covered, spearman_rho, spearman_p, pearson_r = 0, math.nan, math.nan, math.nan
    finally:
        os.unlink(handle.name)
    return {
        "benchmark": name or Path(path).stem,
        "task": "similarity",
        "metric": "spearman",
        "score": spearman_rho,
        "p_value": spearman_p,
        "pearson": pearson_r,
        "covered": covered,
        "total": len(pairs.pairs),
        "coverage": covered / len(pairs.pairs),
        "path": str(path),
    }


def evaluate_analogies(vectors: KeyedVectors, path: str | os.PathLike, *, name: str | None = None) -> dict[str, Any]:
    """3CosAdd accuracy over the questions whose four words are all covered."""
    with open(path, encoding="utf-8-sig") as handle:
        total = sum(1 for line in handle if line.strip() and not line.startswith(":") and len(line.split()) == 4)
    if total == 0:
        raise InputError(f"{path} holds no analogy questions: expected ': section' lines and 'a b c d' lines")
    _, sections = vectors.evaluate_word_analogies(str(path), restrict_vocab=len(vectors), case_insensitive=True)
    overall = sections[-1]
    covered = len(overall["correct"]) + len(overall["incorrect"])
    return {
        "benchmark": name or Path(path).stem,
        "task": "analogy",
        "metric": "accuracy_3cosadd",
        "score": len(overall["correct"]) / covered if covered else math.nan,
        "p_value": math.nan,
        "pearson": math.nan,
        "covered": covered,
        "total": total,
        "coverage": covered / total,
        "path": str(path),
    }


def static_vectors_format(path: str | os.PathLike, *, trust_pickle: bool = False) -> str:
    """How `load_static_vectors` reads `path`: "word2vec_binary" (`.bin`), "word2vec_text" (word2vec
    with a header, or GloVe without), or "pickle" (a gensim `.kv`, or any file that starts as a Python
    pickle), which only `trust_pickle=True` allows: unpickling a file can run any code it carries."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"static vectors file {path} does not exist")
    with open(path, "rb") as handle:
        start = handle.read(2)
    if path.suffix.lower() == ".kv" or (start[:1] == b"\x80" and start[1:] in (b"\x02", b"\x03", b"\x04", b"\x05")):
        if not trust_pickle:
            raise InputError(
                f"static vectors file {path} is a Python pickle (gensim .kv), and loading a pickle can run "
                "arbitrary code; save it as word2vec format (KeyedVectors.save_word2vec_format(PATH, binary=True) "
                "or lmgeom's own <layer>.txt) and give that file, or, for a .kv you made yourself, pass "
                "`trust_pickle=True`", param="trust_pickle")
        return "pickle"
    return "word2vec_binary" if path.suffix.lower() == ".bin" else "word2vec_text"


def load_static_vectors(path: str | os.PathLike, *, trust_pickle: bool = False) -> KeyedVectors:
    """Vectors from word2vec binary `.bin` or text (word2vec with a header, or GloVe without), which
    cannot run code; a gensim `.kv` (a pickle) only with `trust_pickle=True` (`static_vectors_format`)."""
    path = Path(path)
    kind = static_vectors_format(path, trust_pickle=trust_pickle)
    try:
        if kind == "pickle":
            vectors = KeyedVectors.load(str(path))
            if not isinstance(vectors, KeyedVectors):
                raise TypeError(f"it holds a {type(vectors).__name__}, not gensim KeyedVectors")
            return vectors
        if kind == "word2vec_binary":
            return KeyedVectors.load_word2vec_format(str(path), binary=True)
        with open(path, encoding="utf-8") as handle:
            first = handle.readline().split()
        has_header = len(first) == 2 and all(field.isdigit() for field in first)
        return KeyedVectors.load_word2vec_format(str(path), binary=False, no_header=not has_header)
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as error:  # gensim and pickle raise many types (ValueError, UnpicklingError, EOFError, ...) for a bad file
        raise _unreadable_vectors(path, kind, error) from None


def _unreadable_vectors(path: Path, kind: str, error: BaseException) -> InputError:
    expected = {"pickle": "a gensim KeyedVectors .kv file", "word2vec_binary": "word2vec binary vectors",
                "word2vec_text": "word2vec or GloVe text vectors (one word and its numbers per line)"}[kind]
    problem = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    return InputError(f"static vectors file {path} cannot be read as {expected} ({problem}); give a file in one of "
                      "the formats lmgeom reads (word2vec .bin or text, GloVe text, or a gensim .kv with trust_pickle)")
