"""``POST /tokenize`` (TEI's): every token of a text, none cut, as the served model's tokenizer splits it."""

from __future__ import annotations

from pathlib import Path

import httpx
from tokenizers import Tokenizer

from service.app import create_app
from service.settings import ServiceSettings

KEY = "client-key-1"


def _client_app(registry: Path, **overrides):
    settings = ServiceSettings.from_flat(
        registry_dir=registry, default_model="tiny", registry_poll_seconds=0, adapt_enabled=False,
        intra_op_threads=1, engine="onnxruntime-fp32", **overrides,
    )  # fmt: skip
    return create_app(settings, include_adapt=False)


def test_tokens_with_spans_none_cut_behind_the_client_key(tiny_registry: Path, serve) -> None:
    text = "Tokenizers split words — ünïcode too."
    long_text = " ".join(f"word{i}" for i in range(300))  # over the model's 128 tokens: /tokenize cuts nothing
    whole = Tokenizer.from_file(str(tiny_registry / "tiny" / "current" / "tokenizer.json"))
    whole.no_truncation()
    whole.no_padding()
    with serve(_client_app(tiny_registry, api_keys=KEY)) as (url, _), httpx.Client(base_url=url, timeout=60) as c:
        headers = {"Authorization": f"Bearer {KEY}"}
        assert c.post("/tokenize", json={"inputs": text}).status_code == 401  # a client route: keyed
        got = c.post("/tokenize", json={"inputs": [text, long_text]}, headers=headers)
        assert got.status_code == 200 and got.headers["x-model-version"] == "1"
        first, second = got.json()
        assert first[0] == {"id": whole.token_to_id("[CLS]"), "text": "[CLS]", "special": True, "start": None,
                            "stop": None}  # fmt: skip
        assert first[-1]["text"] == "[SEP]" and first[-1]["special"]
        assert [t["id"] for t in first] == whole.encode(text).ids
        pieces = [token.removeprefix("##") for token in whole.encode(text).tokens[1:4]]  # token ##izer ##s
        assert [t["text"].lower() for t in first[1:4]] == pieces and first[1]["text"] == "Token"
        for token in first[1:-1]:
            assert token["text"] == text[token["start"] : token["stop"]] and not token["special"]
        assert first[-2]["text"] == "." and first[-2]["stop"] == len(text)
        assert len(second) == len(whole.encode(long_text).ids) > 128
        bare = c.post("/tokenize", json={"inputs": text, "add_special_tokens": False}, headers=headers).json()[0]
        assert [t["id"] for t in bare] == whole.encode(text, add_special_tokens=False).ids
        empty = c.post("/tokenize", json={"inputs": [""]}, headers=headers)
        assert empty.status_code == 422 and "inputs[0] is an empty string" in empty.json()["error"]["message"]
        no_prompts = c.post("/tokenize", json={"inputs": "x", "prompt_name": "query"}, headers=headers)
        assert no_prompts.status_code == 422 and "has no prompts" in no_prompts.json()["error"]["message"]
        unknown = c.post("/tokenize", json={"inputs": "x", "model": "other"}, headers=headers)
        assert unknown.status_code == 404
        metrics = c.get("/metrics").text  # counted per route and model, failures by kind
        assert 'embed_requests_total{model="tiny",route="/tokenize"} 4.0' in metrics  # the keyless one: refused first
        failed = 'embed_request_failures_total{error_type="invalid_request",model="tiny",route="/tokenize"} 2.0'
        assert failed in metrics
