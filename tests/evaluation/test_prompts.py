"""A model's prompts in evaluation: queries and documents embedded after the prompts a client would name."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import pytest
from mteb.types import PromptType

from core.model_folder import Prompts
from evaluation.domain_checks import piece_similarities, title_retrieval
from evaluation.mteb_bridge import EmbeddingMemo, MtebEncoder
from tests.evaluation.conftest import FakeModel

E5 = Prompts({"query": "query: ", "passage": "passage: "})


class PromptedModel(FakeModel):
    """A fake model with prompts that records every text it embeds."""

    def __init__(self, prompts: Prompts) -> None:
        super().__init__("prompted", lambda text: [len(text), 1.0], dim=2)
        self._prompts = prompts
        self.seen: list[str] = []

    @property
    def prompts(self) -> Prompts:
        return self._prompts

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.seen.extend(texts)
        return super().encode(texts, batch_size)


@pytest.mark.parametrize(
    ("prompts", "role", "expected"),
    [
        (E5, "query", "query: "),
        (E5, "document", "passage: "),  # e5 names its document prompt "passage"
        (Prompts({"query": "q: ", "document": "d: ", "passage": "p: "}), "document", "d: "),
        (Prompts({"query": "q: ", "all": "x: "}, default="all"), "document", "x: "),  # no role prompt: the default
        (E5, "", ""),  # a task without roles, no default prompt: none
        (Prompts(), "query", ""),
    ],
)
def test_a_role_takes_its_prompt_else_the_default(prompts: Prompts, role: str, expected: str) -> None:
    assert prompts.for_role(role) == expected


def test_mteb_queries_and_documents_are_embedded_after_their_prompts() -> None:
    model = PromptedModel(E5)
    encoder = MtebEncoder(EmbeddingMemo(model, progress=False))
    meta = SimpleNamespace(name="SomeRetrieval")
    for prompt_type in (PromptType.query, PromptType.document, None):
        encoder.encode([{"text": ["tides"]}], task_metadata=meta, hf_split="test", hf_subset="default",
                       prompt_type=prompt_type)  # fmt: skip
    assert model.seen == ["query: tides", "passage: tides", "tides"]


def test_the_domain_checks_embed_pieces_as_queries_and_rests_as_documents() -> None:
    model = PromptedModel(E5)
    held_out = [
        "Tides follow the moon. The sea rises twice a day. Coasts flood at spring tides.",
        "Compilers turn source into code. They optimise the inner loops first. Registers are allocated last.",
    ]
    piece_similarities(model, held_out, kinds=("lead",))
    assert {text.split(": ", 1)[0] for text in model.seen} == {"query", "passage"}
    assert any(t.startswith("query: Tides follow the moon") for t in model.seen)
    model.seen.clear()
    title_retrieval(model, ["tides", "compilers"], held_out)
    assert model.seen == ["query: tides", "query: compilers", *(f"passage: {t}" for t in held_out)]
