"""Which end of an over-long text is cut: TEI's ``truncation_direction`` on the real bundle path."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from core.runtime import OnnxBundle
from service.app import create_app
from service.settings import ServiceSettings

LONG = " ".join(f"word{i}" for i in range(300))  # far over the tiny model's 128 tokens


@pytest.fixture(scope="module")
def bundle(tiny_registry: Path) -> OnnxBundle:
    return OnnxBundle(tiny_registry / "tiny" / "current")


def test_left_truncation_keeps_the_end_and_the_special_tokens(bundle: OnnxBundle) -> None:
    right, left = bundle.tokenize([LONG])[0], bundle.tokenize([LONG], "left")[0]
    assert len(right.ids) == len(left.ids) == bundle.max_seq_length and left.overflowing
    assert left.tokens[0] == right.tokens[0] == "[CLS]" and left.tokens[-1] == right.tokens[-1] == "[SEP]"
    assert right.ids[1:5] == bundle.tokenize([LONG], "right")[0].ids[1:5]
    whole = Tokenizer.from_str(bundle.tokenizer.to_str())
    whole.no_truncation()
    ids = whole.encode(LONG, add_special_tokens=False).ids
    assert left.ids[1:-1] == ids[len(ids) - bundle.max_seq_length + 2 :]  # the text's last tokens
    with pytest.raises(ValueError, match="direction must be one of"):
        bundle.tokenize([LONG], "middle")


def test_embed_and_similarity_cut_the_end_the_request_names(tiny_registry: Path, bundle: OnnxBundle, serve) -> None:
    settings = ServiceSettings.from_flat(
        registry_dir=tiny_registry, default_model="tiny", registry_poll_seconds=0, adapt_enabled=False,
        intra_op_threads=1, engine="onnxruntime-fp32",
    )  # fmt: skip
    left = bundle.run(bundle.pad(bundle.tokenize([LONG], "left")))[0]
    right = bundle.encode([LONG])[0]
    assert float(left @ right) < 0.999  # the two ends embed differently
    with serve(create_app(settings, include_adapt=False)) as (url, _), httpx.Client(base_url=url, timeout=60) as c:
        for direction, expected in (("Left", left), ("left", left), ("Right", right)):
            got = c.post("/embed", json={"inputs": LONG, "truncate": True, "truncation_direction": direction})
            np.testing.assert_allclose(got.json()[0], expected, atol=1e-5)
        default = c.post("/embed", json={"inputs": LONG, "truncate": True}).json()[0]
        np.testing.assert_allclose(default, right, atol=1e-5)
        short = "a short sentence"
        scores = c.post(
            "/similarity",
            json={"inputs": {"source_sentence": short, "sentences": [LONG]}, "truncation_direction": "Left"},
        ).json()
        np.testing.assert_allclose(scores, [bundle.encode([short])[0] @ left], atol=1e-5)
        wrong = c.post("/embed", json={"inputs": LONG, "truncate": True, "truncation_direction": "Middle"})
        assert wrong.status_code == 422 and "truncation_direction" in wrong.json()["error"]["message"]
