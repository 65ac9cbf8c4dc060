"""Does a small model write words yet? The share of a sample's words that are words of the
text it learned from: a first, plain check of a run on a small corpus (the README's first
run), long before a benchmark like HellaSwag says anything.

A word is a run of non-space characters with letters in it, compared in lower case with
the punctuation around it stripped ("ROMEO:" and "romeo," are the word "romeo"). A GPT-2
token is often a piece of a word, so a model that has learned only which tokens are
common strings pieces together into words no text holds; the share of real words rises
as it learns which pieces follow which.
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
class WordCount:
    """How many of a text's words a vocabulary holds, and which it does not."""

    real: int
    total: int
    unknown: tuple[str, ...]

    @property
    def share(self) -> float:
        return self.real / self.total if self.total else 0.0

    def line(self) -> str:
        return f"{self.real} of {self.total} words ({self.share:.0%}) are words of the corpus"


def count_words(texts: Iterable[str], vocabulary: set[str]) -> WordCount:
    """Count the words of `texts` found in `vocabulary` (a set of words(corpus))."""
    found = [w for text in texts for w in words(text)]
    unknown = tuple(w for w in found if w not in vocabulary)
    return WordCount(len(found) - len(unknown), len(found), unknown)
