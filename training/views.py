"""Views: two texts made from one document, the inputs of every self-supervised objective.

* **Crops** — the cropping paper's rule and its relaxations live in `core.text` (shared with evaluation
  and /adapt): `CropRule`, `choose_crop_rule`, `crop_pairs`.
* **Token-level augmentations** (here) — deletion, masking, span shuffle: the cheap cross-views SCT
  (``papers/001`` §3.1) can use when its back-translation models are unavailable (they are offline).
* **Dropout** (SimCSE) needs no function here: the same text goes through the encoder twice in
  train mode, so the trainer feeds one crop as both views.
* `PairStream` (here) — the trainer's batches of two views, deterministic and resumable.

Pure, seeded functions (every random choice goes through the ``random.Random`` the caller passes).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TypeVar

from core.text import CropRule
from training.config import TrainConfig
from training.data import ScoredPair

# --- token-level augmentations -------------------------------------------------------------------

Tokens = TypeVar("Tokens", str, list[str])
Example = tuple[str, str, float]  # (view 1, view 2, score)


def _tokens(text_or_tokens: str | list[str]) -> list[str]:
    return text_or_tokens.split() if isinstance(text_or_tokens, str) else list(text_or_tokens)


def _like(original: str | list[str], tokens: list[str]) -> str | list[str]:
    return " ".join(tokens) if isinstance(original, str) else tokens


def _check_rate(name: str, rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {rate}")


def token_deletion(tokens: Tokens, rng: random.Random, rate: float = 0.1) -> Tokens:
    """Drop each token independently with probability ``rate``; at least one token always survives
    (an empty view has no embedding). Text in, text out (whitespace tokens); list in, list out."""
    _check_rate("deletion rate", rate)
    items = _tokens(tokens)
    kept = [tok for tok in items if rng.random() >= rate]
    if not kept and items:
        kept = [rng.choice(items)]
    return _like(tokens, kept)  # type: ignore[return-value]


def token_masking(tokens: Tokens, rng: random.Random, rate: float = 0.15, mask_token: str = "[MASK]") -> Tokens:
    """Replace each token independently with ``mask_token`` with probability ``rate`` (paper 000
    Figure S1c masks a fraction of tokens on top of crops). Pass the tokenizer's mask token."""
    _check_rate("masking rate", rate)
    items = [mask_token if rng.random() < rate else tok for tok in _tokens(tokens)]
    return _like(tokens, items)  # type: ignore[return-value]


def span_shuffle(tokens: Tokens, rng: random.Random, rate: float = 0.1) -> Tokens:
    """Shuffle the order of the tokens inside one random contiguous span covering ``rate`` of them
    (at least two tokens when ``rate > 0``): local word-order noise that keeps the vocabulary."""
    _check_rate("span shuffle rate", rate)
    items = _tokens(tokens)
    length = min(len(items), max(2, round(rate * len(items)))) if rate > 0 else 0
    if length >= 2:
        start = rng.randrange(len(items) - length + 1)
        span = items[start : start + length]
        rng.shuffle(span)
        items[start : start + length] = span
    return _like(tokens, items)  # type: ignore[return-value]


def augment_text(
    text: str,
    rng: random.Random,
    deletion: float = 0.1,
    masking: float = 0.0,
    shuffle: float = 0.0,
    mask_token: str = "[MASK]",
) -> str:
    """Deletion, then masking, then span shuffle with the given rates (0 skips a step): one token-level
    view for SCT (``papers/001`` §3.1 uses back-translation, which needs MT models that are not
    available offline; these are the cheap substitute, alone or on top of crops)."""
    out = token_deletion(text, rng, deletion) if deletion else text
    out = token_masking(out, rng, masking, mask_token) if masking else out
    return span_shuffle(out, rng, shuffle) if shuffle else out


# --- the trainer's stream of view pairs ----------------------------------------------------------

BUCKET_POOL_BATCHES = 32  # batches whose examples are sorted by length together


def length_buckets(examples: list[Example], batch_size: int, rng: random.Random) -> list[Example]:
    """Reorder shuffled ``examples`` so that each run of ``batch_size`` holds texts of similar length: every pool of
    `BUCKET_POOL_BATCHES` batches is sorted by character length and cut into batches, and all batches are shuffled.

    A batch is padded to its longest text, so a sentence batched with a 128-token paragraph costs the paragraph's
    compute: on whole-text distillation (paragraphs and their sentences mixed) this halves the tokens a step
    processes. Which examples an epoch holds is unchanged; only who shares a batch is.
    """
    pool = batch_size * BUCKET_POOL_BATCHES
    batches: list[list[Example]] = []
    for start in range(0, len(examples), pool):
        ordered = sorted(examples[start : start + pool], key=lambda example: len(example[0]))
        batches += [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    full = [batch for batch in batches if len(batch) == batch_size]
    rng.shuffle(full)
    return [example for batch in full + [b for b in batches if len(b) < batch_size] for example in batch]


class PairStream:
    """A deterministic, resumable stream of batches of two views.

    Epoch ``e`` draws, with a generator seeded by ``(seed, e)``, one view pair per usable document
    (or per scored pair, in supervised mode) and shuffles them; batch ``i`` of epoch ``e`` is
    therefore the same whether the run started at step 0 or resumed from a checkpoint.

    ``crop``: two distinct crops of a document. ``dropout``: one crop twice (the encoder's dropout makes the
    views). ``tokens``: one crop, token-augmented twice. ``crop+tokens``: two crops, each token-augmented.
    ``texts``: each document whole, as both views (distillation on the texts themselves), batched by length
    (`length_buckets`).
    """

    def __init__(
        self,
        config: TrainConfig,
        documents: Sequence[str],
        rule: CropRule,
        mask_token: str,
        scored_pairs: Sequence[ScoredPair] | None = None,
    ) -> None:
        self.config = config
        self.documents = list(documents)
        self.rule = rule
        self.mask_token = mask_token
        self.scored_pairs = list(scored_pairs) if scored_pairs is not None else None
        self._cache: dict[int, list[tuple[str, str, float]]] = {}
        first = self.epoch_examples(0)
        if len(first) < config.batch_size:
            relax = " or crop_rule = 'auto'" if config.crop_rule == "paper" else ""
            raise ValueError(
                f"only {len(first)} training examples per epoch (from {len(self.documents)} documents; "
                f"{self.skipped} skipped for having fewer than two crops under the rule {rule.describe()!r}), "
                f"fewer than batch_size={config.batch_size}: use a larger corpus, longer documents (two sentences "
                f"or more), a smaller batch_size{relax}"
            )
        self.batches_per_epoch = len(first) // config.batch_size

    def _rng(self, *key: int) -> random.Random:
        return random.Random(hash((self.config.seed, *key)) & 0xFFFFFFFF)

    def epoch_examples(self, epoch: int) -> list[tuple[str, str, float]]:
        """``(view1, view2, score)`` for every example of ``epoch``, shuffled (score 0 when unsupervised)."""
        if epoch in self._cache:
            return self._cache[epoch]
        rng = self._rng(epoch)
        examples: list[tuple[str, str, float]] = []
        self.skipped = 0
        if self.scored_pairs is not None:
            examples = [(p.text1, p.text2, p.score) for p in self.scored_pairs]
        elif self.config.views == "texts":  # the documents are already the texts (training.data.text_units)
            examples = [(text, text, 0.0) for text in self.documents]
        elif self.config.views in ("dropout", "tokens"):  # one crop, two views made from it
            for doc in self.documents:
                chunks = self.rule.chunks(doc)
                if chunks:
                    text = rng.choice(chunks)
                    examples.append((text, text, 0.0))
                else:
                    self.skipped += 1
        else:
            for doc in self.documents:
                pair = self.rule.sample_pair(doc, rng)
                if pair is None:
                    self.skipped += 1
                else:
                    examples.append((pair[0], pair[1], 0.0))
        rng.shuffle(examples)
        if self.config.views == "texts":
            examples = length_buckets(examples, self.config.batch_size, rng)
        self._cache = {epoch: examples}
        return examples

    def batches(self, epoch: int, index: int) -> Iterator[tuple[int, int, list[str], list[str], list[float]]]:
        """Yield ``(epoch, index, view1, view2, scores)`` from batch ``index`` of ``epoch`` onwards, forever."""
        b = self.config.batch_size
        while True:
            examples = self.epoch_examples(epoch)
            for i in range(index, len(examples) // b):
                chunk = examples[i * b : (i + 1) * b]
                first, second, scores = [c[0] for c in chunk], [c[1] for c in chunk], [c[2] for c in chunk]
                if self.config.views in ("tokens", "crop+tokens"):
                    rng = self._rng(epoch, i, 1)
                    params = dict(self.config.view_params)
                    first = [augment_text(t, rng, mask_token=self.mask_token, **params) for t in first]
                    second = [augment_text(t, rng, mask_token=self.mask_token, **params) for t in second]
                yield epoch, i, first, second, scores
            epoch, index = epoch + 1, 0
