"""Sentence split and crop rules (paper 000 §3.1), the adaptive crop rule, `can_crop`."""

from __future__ import annotations

import random

import pytest

from core import text as rules


def sentence(n: int, length: int = 120) -> str:
    """A sentence of exactly ``length`` characters (period included) tagged with ``n``."""
    head = f"Sentence {n} says"
    return head + " x" * ((length - len(head) - 1) // 2) + "x" * ((length - len(head) - 1) % 2) + "."


def test_sentence_lengths_helper() -> None:
    assert [len(sentence(i, n)) for i, n in [(1, 120), (2, 99), (3, 251), (4, 40)]] == [120, 99, 251, 40]


def test_split_sentences_on_periods_only() -> None:
    assert rules.split_sentences("One. Two  words.\nThree 3.5 items! Four") == [
        "One.",
        "Two words.",
        "Three 3.5 items! Four",
    ]
    assert rules.split_sentences("  ") == []


def test_crop_chunks_filter_lengths_then_take_consecutive() -> None:
    s = [sentence(i) for i in range(4)]
    text = " ".join([s[0], sentence(9, 99), s[1], sentence(8, 251), s[2], s[3]])
    chunks = rules.crop_chunks(text)
    # the too-short and too-long sentences are discarded; chunks run over the kept ones
    assert chunks == [f"{s[0]} {s[1]}", f"{s[1]} {s[2]}", f"{s[2]} {s[3]}"]
    assert rules.crop_chunks(text, t=3) == [f"{s[0]} {s[1]} {s[2]}", f"{s[1]} {s[2]} {s[3]}"]
    assert rules.crop_chunks(text, t=1) == s
    assert rules.crop_chunks(text, min_chars=99, max_chars=99) == []


def test_boundary_lengths_are_kept() -> None:
    text = " ".join([sentence(0, 100), sentence(1, 250), sentence(2, 100)])
    assert len(rules.crop_chunks(text)) == 2


def test_sample_crop_pair_distinct_may_overlap_and_seeded() -> None:
    text = " ".join(sentence(i) for i in range(6))
    seen_overlap = False
    for seed in range(50):
        a, p = rules.sample_crop_pair(text, random.Random(seed))
        assert a != p
        assert a in rules.crop_chunks(text) and p in rules.crop_chunks(text)
        seen_overlap |= bool(set(rules.split_sentences(a)) & set(rules.split_sentences(p)))
        assert (a, p) == rules.sample_crop_pair(text, random.Random(seed))
    assert seen_overlap


def test_sample_crop_pair_none_below_two_chunks_and_repeats_never_coincide() -> None:
    assert rules.sample_crop_pair(" ".join([sentence(0), sentence(1)]), random.Random(0)) is None
    same = " ".join([sentence(0)] * 4)  # every chunk identical -> only one distinct chunk
    assert rules.sample_crop_pair(same, random.Random(0)) is None


def test_crop_pairs_counts_skipped() -> None:
    good = " ".join(sentence(i) for i in range(3))
    corpus = [good, "Too short. Also short.", good, sentence(1, 40)]
    pairs, stats = rules.crop_pairs(corpus, random.Random(0))
    assert len(pairs) == 2
    assert (stats.documents, stats.pairs, stats.skipped) == (4, 2, 2)
    assert stats.yield_fraction == 0.5 and stats.as_dict()["yield"] == 0.5


def test_bad_crop_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match=r"t \(sentences per crop\) must be >= 1"):
        rules.crop_chunks("x", t=0)
    with pytest.raises(ValueError, match="min_chars <= max_chars"):
        rules.crop_chunks("x", min_chars=300)
    with pytest.raises(ValueError, match="fallback must be one of"):
        rules.CropRule(fallback="thirds")


def test_choose_crop_rule_keeps_paper_rule_when_it_works() -> None:
    corpus = [" ".join(sentence(10 * d + i) for i in range(3)) for d in range(5)]
    assert rules.choose_crop_rule(corpus) == rules.PAPER_RULE


def test_choose_crop_rule_relaxes_lengths_then_falls_back_to_halves() -> None:
    short = [" ".join(sentence(10 * d + i, 60) for i in range(3)) for d in range(8)]
    rule = rules.choose_crop_rule(short)
    assert (rule.min_chars, rule.fallback) == (rules.RELAXED_MIN_CHARS, "none")
    tiny = ["Ab cd. Ef gh.", "One two three. Four five."] * 5
    rule = rules.choose_crop_rule(tiny)
    assert rule.fallback == "halves"
    assert rules.crop_yield(tiny, rule) == 1.0
    pairs, stats = rules.crop_pairs(tiny, random.Random(0), rule=rule)
    assert stats.skipped == 0 and set(pairs[0]) == {"Ab cd.", "Ef gh."}


def test_windows_fallback_for_long_text_without_sentences() -> None:
    words = " ".join(f"w{i}" for i in range(80))
    rule = rules.CropRule(fallback="windows", window_words=32)
    chunks = rule.chunks(words)
    assert len(chunks) == 4 and all(len(c.split()) == 32 for c in chunks)
    assert rules.choose_crop_rule([words] * 3).fallback == "windows"


def test_halves_of_words_need_enough_words() -> None:
    rule = rules.CropRule(fallback="halves")
    assert rule.chunks("just a few words") == []
    assert len(rule.chunks(" ".join(["word"] * 7 + ["other"] * 9))) == 2


def test_can_crop_is_the_loosest_rule_choose_crop_rule_may_pick() -> None:
    """/adapt's intake accepts exactly the documents the last-resort crop rule can cut into two crops."""
    assert rules.can_crop("A first sentence. And a second one.")
    assert rules.can_crop(" ".join(f"w{i}" for i in range(2 * rules.MIN_WORDS_PER_HALF)))  # two halves of words
    assert not rules.can_crop(" ".join(f"w{i}" for i in range(2 * rules.MIN_WORDS_PER_HALF - 1)))
    corpus = ["Only one sentence here without enough words."] * 3 + ["One. Two."]
    assert rules.choose_crop_rule(corpus) == rules.LOOSEST_RULE
    assert [rules.can_crop(doc) for doc in corpus] == [len(rules.LOOSEST_RULE.chunks(doc)) >= 2 for doc in corpus]


def test_hold_out_is_disjoint_by_text_and_keeps_the_training_side_of_a_corpus_without_repeats() -> None:
    texts = [f"document {i}." for i in range(200)]
    plain = rules.hold_out(texts, 0.1, seed=3)
    assert len(plain.held) == 20 and sorted(plain.train + plain.held) == list(range(200))
    # The same corpus with copies: of a held text among the training ones, and twice among the held ones.
    first, second = plain.held[:2]
    trained = plain.train[0]
    repeated = list(texts)
    repeated[first] = texts[trained]  # drawn, but trained on too
    repeated[plain.held[3]] = repeated[second]  # drawn twice
    split = rules.hold_out(repeated, 0.1, seed=3)
    assert split.train == plain.train  # the training side is what it was: only the held-out side changes
    assert split.held == [i for i in plain.held if i not in (first, plain.held[3])]
    held_texts = [repeated[i] for i in split.held]
    assert len(set(held_texts)) == len(held_texts) and not set(held_texts) & {repeated[i] for i in split.train}
