"""gpt/eval/words.py: a sample's words and pairs of adjacent words, looked up in a corpus."""

from __future__ import annotations

from gpt.eval.words import Corpus, count_words, words


def test_words_are_lower_case_without_the_punctuation_around_them() -> None:
    assert words("ROMEO:\nO, I'll take 'the' world--\n,,. 42 be's") == [
        "romeo", "o", "i'll", "take", "the", "world", "be's"]


def test_a_sample_is_counted_word_by_word_and_pair_by_pair() -> None:
    corpus = Corpus.of("My lord, I will take the world. The world is mine.")
    count = count_words(["my lord takes the world", "world mine"], corpus)
    # words: my lord takes the world | world mine: 7, of which "takes" is not the corpus's
    assert (count.real, count.total, count.unknown) == (6, 7, ("takes",))
    # pairs within each text: (my lord) (lord takes) (takes the) (the world) | (world mine)
    assert (count.real_pairs, count.pairs) == (2, 5)
    assert count.line() == ("6 of 7 words (86%) are words of the corpus, 2 of 5 pairs of "
                            "adjacent words (40%) stand in it")


def test_nothing_to_count_is_no_share() -> None:
    count = count_words(["", "--- ..."], Corpus.of("words"))
    assert (count.total, count.share, count.pair_share) == (0, 0.0, 0.0)
