"""sentence-transformers' prompts: read from the model folder at export, served by name, the default applied."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from core.model_folder import ST_MODEL_CONFIG
from core.runtime import OnnxBundle
from service.app import create_app
from service.settings import ServiceSettings

PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5's


@pytest.fixture(scope="module")
def prompted_registry(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """The tiny model with e5's prompts exported twice: ``plain`` (no default prompt) and ``passages`` (whose
    default prompt is ``passage``, as sentence-transformers applies it when a caller names none)."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("prompted-registry")
    for name, default in (("plain", None), ("passages", "passage")):
        folder = shutil.copytree(tiny_bert_path, tmp_path_factory.mktemp(name) / "model")
        (folder / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": PROMPTS, "default_prompt_name": default}))
        manifest = json.loads((export_bundle(folder, root, name, promote=True) / "manifest.json").read_text())
        assert manifest["prompts"] == PROMPTS and manifest["default_prompt_name"] == default
    return root


def _app(registry: Path, default_model: str = "plain"):
    settings = ServiceSettings.from_flat(
        registry_dir=registry, default_model=default_model, registry_poll_seconds=0, adapt_enabled=False,
        intra_op_threads=1, engine="onnxruntime-fp32",
    )  # fmt: skip
    return create_app(settings, include_adapt=False)


def test_each_route_embeds_after_the_named_prompt(prompted_registry, serve, varied_texts):
    reference = OnnxBundle(prompted_registry / "plain" / "current")
    texts = varied_texts[:5]
    queried = [PROMPTS["query"] + t for t in texts]
    as_queries = reference.encode(queried)
    with serve(_app(prompted_registry)) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        plain = client.post("/embed", json={"inputs": texts, "truncate": True}).json()
        np.testing.assert_allclose(plain, reference.encode(texts), atol=1e-5)  # no default prompt: text as sent
        queries = client.post("/embed", json={"inputs": texts, "truncate": True, "prompt_name": "query"}).json()
        np.testing.assert_allclose(queries, as_queries, atol=1e-5)
        scores = client.post(
            "/similarity",
            json={"inputs": {"source_sentence": texts[0], "sentences": texts[1:]}, "prompt_name": "query"},
        ).json()
        np.testing.assert_allclose(scores, as_queries[1:] @ as_queries[0], atol=1e-5)

        oai = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0, timeout=60)
        made = oai.embeddings.create(model="plain", input=texts, extra_body={"prompt_name": "query"})
        np.testing.assert_allclose([d.embedding for d in made.data], as_queries, atol=1e-5)
        assert made.usage.prompt_tokens == sum(len(e) for e in reference.tokenize(queried))

        tokens = client.post("/tokenize", json={"inputs": texts[0], "prompt_name": "query"}).json()[0]
        assert [t["text"] for t in tokens[1:3]] == ["query", ":"]  # the prompt's tokens, as the model sees them

        card = client.get("/v1/models/plain").json()
        assert card["prompts"] == PROMPTS and card["default_prompt_name"] is None


def test_the_default_prompt_applies_when_none_is_named(prompted_registry, serve):
    reference = OnnxBundle(prompted_registry / "passages" / "current")
    texts = ["a document about tides", "another about compilers"]
    with serve(_app(prompted_registry)) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        default = client.post("/embed", json={"inputs": texts, "model": "passages"}).json()
        np.testing.assert_allclose(default, reference.encode([PROMPTS["passage"] + t for t in texts]), atol=1e-5)
        query = client.post("/embed", json={"inputs": texts, "model": "passages", "prompt_name": "query"}).json()
        np.testing.assert_allclose(query, reference.encode([PROMPTS["query"] + t for t in texts]), atol=1e-5)
        assert client.get("/v1/models/passages").json()["default_prompt_name"] == "passage"


def test_a_prompt_the_model_lacks_is_a_422_that_lists_its_prompts(prompted_registry, tiny_registry, serve):
    with serve(_app(prompted_registry)) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        wrong = client.post("/embed", json={"inputs": "x", "prompt_name": "search_query"})
        assert wrong.status_code == 422
        assert wrong.json()["error"]["message"] == (
            "prompt_name 'search_query' is not one of the model's prompts (passage, query) (model 'plain')"
        )
        long_text = "word " * 200  # over the tiny model's 128 tokens with or without the prompt
        refused = client.post("/embed", json={"inputs": [long_text], "prompt_name": "query"})
        assert refused.status_code == 422
        assert "inputs[0] has 204 tokens with the prompt 'query: '" in refused.json()["error"]["message"]
    with serve(_app(tiny_registry, "tiny")) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        none = client.post("/v1/embeddings", json={"input": "x", "prompt_name": "query"})
        assert none.status_code == 422
        assert "prompt_name 'query' was given, but the model has no prompts" in none.json()["error"]["message"]
        assert client.get("/v1/models/tiny").json()["prompts"] == {}
