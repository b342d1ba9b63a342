"""Shared fixtures: real small models loaded once per session, and tiny random ones of each
architecture family the code must handle (BERT, ELECTRA with embedding_size != hidden_size, MPNet).

The tiny models reuse MiniLM's uncased tokenizer (30,522 tokens); their weights are random and
seeded, so they test wiring, never quality.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.catalog import resolve_model
from tests.postgres import PostgresServer

VARIED_TEXTS = [
    "A man is playing a guitar.",
    "The stock market fell sharply on Monday after the announcement.",
    "Ünïcödé façade — naïve café, 東京 and Москва.",
    "ok",
    "Transformers encode text into vectors; pooling turns token states into one embedding. " * 12,
    "Short.",
    "What is the capital of France?",
    "def add(a, b):\n    return a + b",
]


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep rebuilt models out of the user's cache unless EMBED_CACHE_DIR says otherwise."""
    import os

    os.environ.setdefault("EMBED_CACHE_DIR", str(tmp_path_factory.mktemp("embed-cache")))


@pytest.fixture(autouse=True, scope="session")
def _test_host_names() -> None:
    """The host names the tests call the server by besides this machine's own: Starlette's test client sends
    ``Host: testserver`` and the raw-socket tests ``Host: x`` (`tests/service/test_browser_bounds.py` checks the
    names a server answers to with settings of its own)."""
    import os

    os.environ.setdefault("EMBED_ALLOWED_HOSTS", "testserver,x")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the whole session (started on first use)."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each adapt job store backend: the embedded SQLite file, and a fresh database on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'jobs.sqlite3'}"
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture(scope="session")
def minilm_l6_path() -> Path:
    return resolve_model("minilm-l6")


@pytest.fixture(scope="session")
def minilm_l3_path() -> Path:
    return resolve_model("minilm-l3")


def _save_tiny(folder: Path, backbone_factory: Callable[[], object], minilm_l6_path: Path, **st_kwargs) -> Path:
    import torch
    from transformers import AutoTokenizer

    from training.encoder import Encoder

    torch.manual_seed(0)
    backbone = backbone_factory()
    tokenizer = AutoTokenizer.from_pretrained(minilm_l6_path)
    encoder = Encoder(backbone, tokenizer, **st_kwargs)
    encoder.save(folder)
    return folder


def _tiny_bert(folder: Path, minilm_l6_path: Path, layers: int) -> Path:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return _save_tiny(
        folder,
        lambda: BertModel(config, add_pooling_layer=False),
        minilm_l6_path,
        pooling="mean",
        normalize=True,
        max_seq_length=128,
    )


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory: pytest.TempPathFactory, minilm_l6_path: Path) -> Path:
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert"), minilm_l6_path, layers=4)


@pytest.fixture(scope="session")
def tiny_bert6_path(tmp_path_factory: pytest.TempPathFactory, minilm_l6_path: Path) -> Path:
    """Six layers, like minilm-l6: the sct-tiny student keeps its layers [0, 5]."""
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert6"), minilm_l6_path, layers=6)


@pytest.fixture(scope="session")
def tiny_electra_path(tmp_path_factory: pytest.TempPathFactory, minilm_l6_path: Path) -> Path:
    from transformers import ElectraConfig, ElectraModel

    config = ElectraConfig(
        vocab_size=30522,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return _save_tiny(
        tmp_path_factory.mktemp("tiny-electra"),
        lambda: ElectraModel(config),
        minilm_l6_path,
        pooling="cls",
        normalize=True,
        max_seq_length=128,
    )


@pytest.fixture(scope="session")
def tiny_mpnet_path(tmp_path_factory: pytest.TempPathFactory, minilm_l6_path: Path) -> Path:
    from transformers import MPNetConfig, MPNetModel

    config = MPNetConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=0,
    )
    return _save_tiny(
        tmp_path_factory.mktemp("tiny-mpnet"),
        lambda: MPNetModel(config, add_pooling_layer=False),
        minilm_l6_path,
        pooling="mean",
        normalize=True,
        max_seq_length=128,
    )


@pytest.fixture(scope="session")
def varied_texts() -> list[str]:
    return list(VARIED_TEXTS)


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """A registry with the tiny random BERT exported to ONNX and promoted as ``tiny`` (version 1): a real bundle
    (tokenizer, onnxruntime) that is fast to load. Shared by the whole session: tests only read it."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("tiny-registry")
    export_bundle(tiny_bert_path, root, "tiny", promote=True)
    return root
