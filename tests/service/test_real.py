"""The real path: ONNX bundles exported by `export.bundle`, served by uvicorn, called by real clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.engine_choice import shapes_text
from core.runtime import OnnxBundle, cosines, read_probes, write_probes
from service.app import create_app
from service.settings import ServiceSettings
from tests.ports import free_port
from tests.service.conftest import wait_ready

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(tiny_registry: Path) -> OnnxBundle:
    return OnnxBundle(tiny_registry / "tiny" / "current")


def _settings(registry: Path, **overrides) -> ServiceSettings:
    """Settings for a real server; the fp32 graph on onnxruntime unless told, so its vectors can be held against
    `reference` to 1e-5 (under ``engine=auto`` another engine may serve some batches, within the parity bars)."""
    values = {
        "registry_dir": registry, "default_model": "tiny", "registry_poll_seconds": 0, "adapt_enabled": False,
        "intra_op_threads": 1, "max_batch_size": 16, "max_batch_tokens": 2048, "engine": "onnxruntime-fp32",
    } | overrides  # fmt: skip
    return ServiceSettings.from_flat(**values)


def test_openai_client_float_and_base64_equal_the_bundle(tiny_registry, reference, serve, varied_texts):
    app = create_app(_settings(tiny_registry), include_adapt=False)
    with serve(app) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0, timeout=60)
        single = client.embeddings.create(model="tiny", input="A man is playing a guitar.", encoding_format="float")
        np.testing.assert_allclose(
            single.data[0].embedding, reference.encode(["A man is playing a guitar."])[0], atol=1e-5
        )
        assert single.model == "tiny" and single.usage.prompt_tokens == len(
            reference.tokenize(["A man is playing a guitar."])[0]
        )
        listed = client.embeddings.create(model="tiny", input=varied_texts)  # the client asks for base64, decodes it
        got = np.array([d.embedding for d in sorted(listed.data, key=lambda d: d.index)], dtype=np.float32)
        np.testing.assert_allclose(got, reference.encode(varied_texts), atol=1e-5)
        floats = client.embeddings.create(model="tiny", input=varied_texts, encoding_format="float")
        np.testing.assert_allclose([d.embedding for d in floats.data], got, atol=1e-6)
        assert listed.usage.total_tokens == sum(len(e) for e in reference.tokenize(varied_texts))
        with pytest.raises(openai.NotFoundError, match="served models: tiny"):
            client.embeddings.create(model="other", input="x")
        with pytest.raises(openai.UnprocessableEntityError, match="input is empty"):
            client.embeddings.create(model="tiny", input=[])
        assert [m.id for m in client.models.list()] == ["tiny"] and client.models.retrieve("tiny").id == "tiny"
        with pytest.raises(openai.NotFoundError, match="served models: tiny"):
            client.models.retrieve("other")
        with pytest.raises(openai.UnprocessableEntityError, match="input holds token ids"):
            client.embeddings.create(model="tiny", input=[[101, 2023, 102]])


@pytest.fixture
def hub_http() -> Iterator[None]:
    """huggingface_hub refuses every request under HF_HUB_OFFLINE=1 (CI sets it), even to loopback: give it a plain
    session for the test, then restore the offline guard."""
    import requests
    from huggingface_hub import configure_http_backend

    configure_http_backend(backend_factory=requests.Session)
    yield
    configure_http_backend()


def test_huggingface_hub_inference_client_posts_to_the_root(tiny_registry, reference, serve, varied_texts, hub_http):
    """TEI's own client: ``InferenceClient(base_url=...).feature_extraction`` posts ``{"inputs", "truncate"?, ...}``
    to ``POST /`` and reads back ``[[float]]``."""
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    app = create_app(_settings(tiny_registry), include_adapt=False)
    long_text = "word " * 400
    with serve(app) as (url, _):
        client = InferenceClient(base_url=url, timeout=60)
        vector = client.feature_extraction(varied_texts[0])
        assert vector.shape == (1, 32) and vector.dtype == np.float32
        np.testing.assert_allclose(vector[0], reference.encode(varied_texts[:1])[0], atol=1e-5)
        cut = client.feature_extraction(long_text, truncate=True, normalize=True)
        np.testing.assert_allclose(cut[0], reference.encode([long_text])[0], atol=1e-5)
        with pytest.raises(HfHubHTTPError) as refused:  # TEI's default: no truncation, an over-long text is a 422
            client.feature_extraction(long_text)
        assert refused.value.response.status_code == 422
        assert "more than model 'tiny' accepts" in refused.value.response.json()["error"]["message"]


def test_tei_shapes_truncation_and_prometheus(tiny_registry, reference, serve, varied_texts):
    app = create_app(_settings(tiny_registry), include_adapt=False)
    long_text = "word " * 400  # more than the bundle's 128 tokens
    with serve(app) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        vectors = client.post("/embed", json={"inputs": varied_texts, "truncate": True}).json()
        np.testing.assert_allclose(vectors, reference.encode(varied_texts), atol=1e-5)
        refused = client.post("/embed", json={"inputs": ["fine", long_text]})
        assert refused.status_code == 422
        assert "inputs[1] has 402 tokens, more than model 'tiny' accepts (128)" in refused.json()["error"]["message"]
        cut = client.post("/embed", json={"inputs": [long_text], "truncate": True}).json()
        np.testing.assert_allclose(cut[0], reference.encode([long_text])[0], atol=1e-5)
        scores = client.post(
            "/similarity", json={"inputs": {"source_sentence": varied_texts[0], "sentences": varied_texts[1:4]}}
        ).json()
        ref = reference.encode(varied_texts[:4])
        np.testing.assert_allclose(scores, ref[1:] @ ref[0], atol=1e-5)
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        batches = [s for s in families["embed_batch_size"].samples if s.name.endswith("_count")]
        assert sum(s.value for s in batches if s.labels["model"] == "tiny") >= 1
        served = [s for s in families["embed_embeddings"].samples if s.labels.get("model") == "tiny"]
        assert served[0].value == len(varied_texts) + 1 + 4  # the refused request embedded nothing


def test_a_text_alone_equals_the_same_text_inside_a_large_mixed_batch(tiny_registry, reference, serve, varied_texts):
    app = create_app(_settings(tiny_registry, max_batch_size=64, max_batch_tokens=8192), include_adapt=False)
    rng = np.random.default_rng(0)
    mixed = [varied_texts[i] for i in rng.integers(0, len(varied_texts), 120)]
    mixed += [" ".join(["token"] * int(n)) for n in rng.integers(1, 150, 60)]
    with serve(app) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        alone = {text: np.asarray(client.post("/embed", json={"inputs": text, "truncate": True}).json()[0])
                 for text in varied_texts}  # fmt: skip
        batch = client.post("/embed", json={"inputs": mixed, "truncate": True}).json()
    for text, vector in zip(mixed, batch, strict=True):
        if text in alone:
            np.testing.assert_allclose(vector, alone[text], atol=1e-5)
    assert sum(text in alone for text in mixed) == 120


def test_the_service_never_imports_torch_or_training(tiny_registry):
    code = f"""
import sys
from fastapi.testclient import TestClient
from service.app import create_app
import service.cli
from service.settings import ServiceSettings
settings = ServiceSettings.from_flat(
    registry_dir={str(tiny_registry)!r}, default_model="tiny", adapt_supervise_worker=False,
    adapt_dir={str(tiny_registry.parent / "adapt-jobs")!r},
)
with TestClient(create_app(settings)) as client:
    assert client.post("/embed", json={{"inputs": "hello"}}).status_code == 200
    assert client.get("/adapt").status_code in (200, 401)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "training", "transformers"))
print("LEAKED", leaked)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LEAKED []" in result.stdout, result.stdout


def test_the_readme_serve_command_end_to_end_and_sigterm(tiny_registry, tmp_path):
    """``bash scripts/serve.sh`` (the README's first command: set-up, then ``embedder serve``), flags passed on."""
    port = free_port()
    env = {**os.environ, "EMBED_API_KEYS": "s3cret", "HF_HUB_OFFLINE": "1"}
    command = [
        "bash", "scripts/serve.sh", "--registry-dir", str(tiny_registry), "--port", str(port),
        "--default-model", "tiny", "--no-adapt-enabled", "--no-adapt-supervise-worker",
        "--adapt-dir", str(tmp_path / "adapt"), "--intra-op-threads", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        assert httpx.post(url, json={"input": "hi"}).status_code == 401
        ok = httpx.post(url, json={"input": "hi"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 32
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert "s3cret" not in output
    assert "stopped" in output
    assert not (tmp_path / "adapt").exists()  # /adapt off: its job store was never opened, its folder never made


@pytest.mark.parametrize(
    ("spinning", "allow", "stop"), [("never", "0", "0"), ("during-runs", "1", "1"), ("always", "1", "0")]
)
def test_the_spinning_setting_reaches_the_onnxruntime_session(
    tiny_registry, reference, varied_texts, spinning, allow, stop
):
    from core.runtime import SPINNING, session_options
    from service.backend.onnx import onnx_backend_factory

    assert typing.get_args(ServiceSettings.model_fields["ort_spinning"].annotation) == SPINNING
    options = session_options(1, spinning=spinning)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == allow
    assert options.get_session_config_entry("session.force_spinning_stop") == stop
    backend = onnx_backend_factory(tiny_registry / "tiny" / "current", _settings(tiny_registry, ort_spinning=spinning))
    embedded = backend.embed(backend.tokenize(varied_texts[:4]))
    np.testing.assert_allclose(embedded, reference.encode(varied_texts[:4]), atol=1e-5)


def test_an_unknown_spinning_mode_is_refused():
    from core.runtime import session_options

    with pytest.raises(ValueError, match="unknown spinning 'sometimes'"):
        session_options(1, spinning="sometimes")


@pytest.fixture(scope="module")
def int8_registry(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """Two int8 bundles of the tiny model: ``good``, and ``bad`` whose stored probe references no graph can
    match (as on a CPU whose int8 kernels lose precision)."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("int8-registry")
    for name in ("good", "bad"):
        export_bundle(tiny_bert_path, root, name, quantize="int8", promote=True)
    bad = root / "bad" / "current"
    texts, reference = read_probes(bad)
    write_probes(bad, texts, np.roll(reference, 1, axis=1))
    return root


def test_int8_is_served_only_where_it_passes_the_probe_check_on_this_cpu(int8_registry, serve, varied_texts):
    app = create_app(_settings(int8_registry, default_model="good", engine="onnxruntime-int8"), include_adapt=False)
    with serve(app) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
        assert cards["good"]["quantization"] == "int8" and cards["good"]["int8_check"]["status"] == "passed"
        assert cards["bad"]["quantization"] == "none" and cards["bad"]["int8_check"]["status"] == "failed"
        assert "mean cosine" in cards["bad"]["int8_check"]["reason"]
        for name, variant in (("good", "int8"), ("bad", "fp32")):
            vectors = client.post("/embed", json={"inputs": varied_texts, "model": name, "truncate": True}).json()
            served = OnnxBundle(int8_registry / name / "current", variant=variant).encode(varied_texts)
            np.testing.assert_allclose(vectors, served, atol=1e-5)
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        flags = {s.labels["model"]: s.value for s in families["embed_model_int8"].samples}
        assert flags == {"good": 1.0, "bad": 0.0}
    fp32_only = create_app(
        _settings(int8_registry, default_model="good", serve_int8=False, engine="onnxruntime-fp32"),
        include_adapt=False,
    )
    with serve(fp32_only) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        card = client.get("/v1/models").json()["data"][1]
        assert (card["id"], card["quantization"], card["engine"]) == ("good", "none", "onnxruntime-fp32")
        assert card["int8_check"]["status"] == "not-tried"


def test_the_engine_chosen_on_this_cpu_is_shown_and_serves_what_it_says(int8_registry, serve, varied_texts):
    app = create_app(_settings(int8_registry, default_model="good", engine="auto"), include_adapt=False)
    with serve(app) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "good")
        choice = card["engine_choice"]
        assert card["engine"] == choice["engine"] and choice["setting"] == "auto" and choice["reason"]
        trials = {t["engine"]: t for t in choice["trials"]}
        assert trials[card["engine"]]["status"] == "passed" and trials[card["engine"]]["min_cosine"] >= 0.97
        assert card["quantization"] == {"int8": "int8", "bf16": "bf16"}.get(choice["precision"], "none")
        assert client.get("/info").json()["models"][1]["engine_choice"] == choice
        assert choice["routes"][-1]["engine"] == card["engine"]
        assert all(trials[route["engine"]]["status"] == "passed" for route in choice["routes"])
        # Whichever engine ran each batch, every vector keeps the parity bar against the fp32 graph.
        vectors = client.post("/embed", json={"inputs": varied_texts, "model": "good", "truncate": True}).json()
        fp32 = OnnxBundle(int8_registry / "good" / "current", variant="fp32").encode(varied_texts)
        assert cosines(np.asarray(vectors), fp32).min() >= 0.97
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        (sample,) = [s for s in families["embed_model_engine"].samples if s.labels["model"] == "good"]
        assert (sample.labels["engine"], sample.labels["precision"], sample.value) == (
            card["engine"],
            choice["precision"],
            1.0,
        )
        routes = [s for s in families["embed_model_engine_route"].samples if s.labels["model"] == "good"]
        assert sorted(
            (s.labels["engine"], s.labels["precision"], s.labels["shapes"], s.value) for s in routes
        ) == sorted(
            (r["engine"], r["precision"], shapes_text(r["shapes"]) if len(choice["routes"]) > 1 else "all", 1.0)
            for r in choice["routes"]
        )
