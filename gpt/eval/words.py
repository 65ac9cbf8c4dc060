"""Does a small model write words yet? The share of a sample's words that are words of the
text it learned from, and of its pairs of adjacent words that stand next to each other
somewhere in that text: a first, plain check of a run on a small corpus (the README's
first run), long before a benchmark like HellaSwag says anything.

A word is a run of non-space characters with letters in it, compared in lower case with
the punctuation around it stripped ("ROMEO:" and "romeo," are the word "romeo"). A GPT-2
token is often a piece of a word, so a model that has learned only which tokens are
common strings pieces together into words no text holds; the share of real words rises
as it learns which pieces follow which. Short common words ("not", "the") come early,
scattered among punctuation: the pairs tell a string of them from a phrase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_LETTER = re.compile(r"[^\W\d_]")  # any letter, in any script
_AROUND = ".,;:!?'\"()[]{}-_*&"  # stripped from both ends of a word


def words(text: str) -> list[str]:
    """The words of `text`, in lower case, without the punctuation around them."""
    out = []
    for token in text.split():
        word = token.strip(_AROUND).lower()
        if word and _LETTER.search(word):
            out.append(word)
    return out


@dataclass(frozen=True)
class Corpus:
    """A text's words and its pairs of adjacent words, to look a sample's up in."""

    words: frozenset[str]
    pairs: frozenset[tuple[str, str]]

    @classmethod
    def of(cls, text: str) -> "Corpus":
        ws = words(text)
        return cls(frozenset(ws), frozenset(zip(ws, ws[1:])))


@dataclass(frozen=True)
class WordCount:
    """How many of a text's words, and of its pairs of adjacent words, a corpus holds;
    the words it does not."""

    real: int
    total: int
    real_pairs: int
    pairs: int
    unknown: tuple[str, ...]

    @property
    def share(self) -> float:
        return self.real / self.total if self.total else 0.0

    @property
    def pair_share(self) -> float:
        return self.real_pairs / self.pairs if self.pairs else 0.0

    def line(self) -> str:
        return (f"{self.real} of {self.total} words ({self.share:.0%}) are words of the corpus, "
                f"{self.real_pairs} of {self.pairs} pairs of adjacent words "
                f"({self.pair_share:.0%}) stand in it")


def count_words(texts: Iterable[str], corpus: Corpus) -> WordCount:
    """Count the words of `texts`, and their pairs (within each text), found in `corpus`."""
    each = [words(text) for text in texts]
    found = [w for ws in each for w in ws]
    pairs = [p for ws in each for p in zip(ws, ws[1:])]
    unknown = tuple(w for w in found if w not in corpus.words)
    return WordCount(len(found) - len(unknown), len(found),
                     sum(p in corpus.pairs for p in pairs), len(pairs), unknown)
