"""Token-level augmentations (SCT's cheap cross-views)."""

from __future__ import annotations

import random

import pytest

from training import views


def test_token_augmentations_seeded_and_typed() -> None:
    text = " ".join(f"t{i}" for i in range(200))
    deleted = views.token_deletion(text, random.Random(1), rate=0.25)
    assert isinstance(deleted, str) and deleted == views.token_deletion(text, random.Random(1), rate=0.25)
    assert 100 < len(deleted.split()) < 190
    assert views.token_deletion(["a", "b"], random.Random(0), rate=1.0) in (["a"], ["b"])
    masked = views.token_masking(text.split(), random.Random(2), rate=0.5, mask_token="<mask>")
    assert isinstance(masked, list) and len(masked) == 200 and 60 < masked.count("<mask>") < 140
    shuffled = views.span_shuffle(text.split(), random.Random(3), rate=0.1)
    moved = [i for i, tok in enumerate(shuffled) if tok != f"t{i}"]
    assert sorted(shuffled) == sorted(text.split()) and moved and max(moved) - min(moved) < 20
    assert views.span_shuffle("a b c", random.Random(0), rate=0.0) == "a b c"
    assert views.augment_text(text, random.Random(4), deletion=0, masking=0, shuffle=0) == text
    with pytest.raises(ValueError, match=r"deletion rate must be a fraction in \[0, 1\]"):
        views.token_deletion(text, random.Random(0), rate=1.5)


def test_length_buckets_group_similar_lengths_and_keep_every_example() -> None:
    rng = random.Random(0)
    examples = [("x" * rng.randrange(1, 400), "", 0.0) for _ in range(1000)]
    rng.shuffle(examples)
    bucketed = views.length_buckets(examples, 10, random.Random(1))
    assert sorted(bucketed) == sorted(examples)  # same examples, other batches

    def padded(order: list[views.Example]) -> int:  # characters a padded batch processes
        return sum(10 * max(len(e[0]) for e in order[i : i + 10]) for i in range(0, len(order), 10))

    assert padded(bucketed) < 0.6 * padded(examples)
    assert bucketed == views.length_buckets(examples, 10, random.Random(1))  # seeded
    first = [len(e[0]) for e in bucketed[:10]]
    assert max(first) - min(first) < 50  # one batch, one length band
