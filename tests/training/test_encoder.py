"""The encoder: pooling, batching invariance, truncation, freezing, save/load, architectures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.model_folder import POOLING_MODES
from training.encoder import Encoder, find_layers
from training.pooling import pool


@pytest.fixture(scope="module")
def minilm(minilm_l6_path: Path) -> Encoder:
    return Encoder.from_pretrained(minilm_l6_path)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


def _texts(n: int = 50) -> list[str]:
    subjects = ["The committee", "A small dog", "Researchers in Oslo", "My grandmother", "The new compiler"]
    verbs = ["approved", "chased", "published", "baked", "optimised"]
    objects = ["the budget", "a red ball", "a study on sleep", "bread for everyone", "the inner loop"]
    texts = [f"{s} {v} {o}." for s, v, o in zip(subjects * 10, verbs * 10, objects[::-1] * 10, strict=True)]
    texts = [t if i % 7 else t * (1 + i % 40) for i, t in enumerate(texts)]  # some long, truncated ones
    texts[3] = "Ünïcödé: 東京の天気は晴れです。 Москва — столица."
    texts[4] = "?"
    return texts[:n]


def test_minilm_l6_matches_sentence_transformers(minilm: Encoder, minilm_l6_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_l6_path), device="cpu")
    texts = _texts(50)
    ours = minilm.encode(texts, batch_size=16)
    theirs = reference.encode(texts, batch_size=16, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (50, 384)
    assert _cos(ours, theirs).min() > 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_text_alone_equals_text_in_padded_batch(minilm_l6_path: Path, pooling: str) -> None:
    encoder = Encoder.from_pretrained(minilm_l6_path, pooling=pooling)
    target = "A text that is short."
    batch = [target, "A much longer neighbour that forces plenty of padding onto the short one. " * 5, "x"]
    alone = encoder.encode([target])
    inside = encoder.encode(batch, batch_size=3)
    np.testing.assert_allclose(alone[0], inside[0], atol=1e-5)


def test_last_pooling_picks_final_real_token() -> None:
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(pool(hidden, mask, "last"), torch.stack([hidden[0, 1], hidden[1, 3]]))
    assert torch.equal(pool(hidden, mask, "cls"), hidden[:, 0])
    assert torch.allclose(pool(hidden, mask, "mean")[0], hidden[0, :2].mean(0))


def test_truncate_equals_pooled_hidden_state(minilm_l6_path: Path, tmp_path: Path) -> None:
    texts = ["Layer three is where we cut.", "Another sentence with more words in it than the first."]
    full = Encoder.from_pretrained(minilm_l6_path)
    layerwise = full.encode(texts, all_layers=True)
    assert layerwise.shape == (7, 2, 384)
    np.testing.assert_allclose(layerwise[6], full.encode(texts), atol=1e-5)

    truncated = Encoder.from_pretrained(minilm_l6_path).truncate(3)
    assert truncated.num_layers == 3 and truncated.config.num_hidden_layers == 3
    np.testing.assert_allclose(truncated.encode(texts), layerwise[3], atol=1e-5)

    truncated.save(tmp_path / "l3")
    reloaded = Encoder.from_pretrained(tmp_path / "l3")
    assert reloaded.num_layers == 3
    np.testing.assert_allclose(reloaded.encode(texts), layerwise[3], atol=1e-5)


def test_saved_checkpoint_loads_in_sentence_transformers(minilm: Encoder, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    minilm.clone().truncate(2).save(tmp_path / "ckpt")
    texts = ["checkpoints should load in sentence-transformers", "and agree with ours"]
    theirs = SentenceTransformer(str(tmp_path / "ckpt"), device="cpu").encode(texts)
    ours = Encoder.from_pretrained(tmp_path / "ckpt").encode(texts)
    assert _cos(ours, theirs).min() > 0.9999


@pytest.mark.parametrize("fixture", ["tiny_bert_path", "tiny_electra_path", "tiny_mpnet_path"])
def test_architectures_truncate_freeze_save_reload(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    folder: Path = request.getfixturevalue(fixture)
    texts = ["a first sentence", "a second, longer sentence with more tokens in it"]
    encoder = Encoder.from_pretrained(folder)
    assert encoder.num_layers == 4
    layerwise = encoder.encode(texts, all_layers=True)
    assert layerwise.shape == (5, 2, encoder.dim)

    encoder.truncate(2)
    np.testing.assert_allclose(encoder.encode(texts), layerwise[2], atol=1e-5)
    encoder.freeze(1)
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    _, attr = find_layers(encoder.backbone)
    last_layer = {f"backbone.{n}" for n, _ in encoder.backbone.named_parameters() if f".{attr}.1." in f".{n}"}
    assert trainable and trainable == last_layer

    encoder.save(tmp_path / "saved")
    reloaded = Encoder.from_pretrained(tmp_path / "saved")
    assert reloaded.num_layers == 2 and reloaded.pooling == encoder.pooling
    np.testing.assert_allclose(reloaded.encode(texts), layerwise[2], atol=1e-5)


def test_electra_embedding_projection_is_layer_zero(tiny_electra_path: Path) -> None:
    encoder = Encoder.from_pretrained(tiny_electra_path)
    assert encoder.config.embedding_size != encoder.config.hidden_size
    assert encoder.encode(["projection"], all_layers=True).shape == (5, 1, encoder.config.hidden_size)


def test_freeze_leaves_exactly_the_last_layers_trainable(minilm_l6_path: Path) -> None:
    encoder = Encoder.from_pretrained(minilm_l6_path)
    encoder.freeze(2)
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    assert trainable
    assert all(n.startswith(("backbone.encoder.layer.4.", "backbone.encoder.layer.5.")) for n in trainable)
    expected = sum(p.numel() for layer in encoder.backbone.encoder.layer[4:] for p in layer.parameters())
    assert sum(p.numel() for p in encoder.parameters() if p.requires_grad) == expected

    encoder.freeze(0)
    assert not any(p.requires_grad for p in encoder.parameters())
    encoder.freeze(None)
    assert all(p.requires_grad for p in encoder.backbone.parameters())


def test_frozen_layers_get_no_gradient(tiny_bert_path: Path) -> None:
    encoder = Encoder.from_pretrained(tiny_bert_path).freeze(1)
    encoder.train()
    loss = encoder(**encoder.tokenize(["gradients only reach the last layer"])).sum()
    loss.backward()
    assert encoder.backbone.embeddings.word_embeddings.weight.grad is None
    assert encoder.backbone.encoder.layer[0].attention.self.query.weight.grad is None
    assert encoder.backbone.encoder.layer[3].output.dense.weight.grad is not None


@pytest.mark.parametrize("bad", [0, 7, -1, 2.5])
def test_invalid_layer_counts_say_what_is_allowed(minilm: Encoder, bad: object) -> None:
    with pytest.raises(ValueError, match=r"layers must be an integer between 1 and 6"):
        minilm.clone().truncate(bad)  # type: ignore[arg-type]


def test_invalid_freeze_and_pooling_errors(minilm: Encoder, minilm_l6_path: Path) -> None:
    with pytest.raises(ValueError, match=r"trainable_last_layers must be between 0 and 6"):
        minilm.clone().freeze(9)
    with pytest.raises(ValueError, match=r"pooling must be one of \('mean', 'cls', 'last', 'max', 'mean_sqrt_len'\)"):
        Encoder.from_pretrained(minilm_l6_path, pooling="weightedmean")
    with pytest.raises(ValueError, match=r"distinct indices in \[0, 5\]"):
        minilm.clone().select_layers([0, 6])


def test_encode_rejects_a_bare_string(minilm: Encoder) -> None:
    with pytest.raises(TypeError, match="wrap a single text in a list"):
        minilm.encode("not a list")  # type: ignore[arg-type]
    assert minilm.encode([]).shape == (0, 384)


def test_prompts_survive_save_and_sentence_transformers_applies_them(tiny_bert_path: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from core.model_folder import ST_MODEL_CONFIG

    folder = shutil.copytree(tiny_bert_path, tmp_path / "prompted")
    prompts = {"query": "query: ", "passage": "passage: "}
    (folder / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": prompts, "default_prompt_name": "passage"}))
    encoder = Encoder.from_pretrained(folder)
    assert dict(encoder.prompts.texts) == prompts and encoder.prompts.default == "passage"
    encoder.truncate(2).save(tmp_path / "saved")  # a fine-tuned or truncated model keeps its base's prompts
    theirs = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert prompts.items() <= theirs.prompts.items() and theirs.default_prompt_name == "passage"
    ours = Encoder.from_pretrained(tmp_path / "saved")
    np.testing.assert_allclose(
        ours.encode([ours.prompts.text_for("query") + "a question"]),
        theirs.encode(["a question"], prompt_name="query"),
        atol=1e-5,
    )


def test_pooling_without_prompt_tokens_is_refused_only_when_there_are_prompts(
    tiny_bert_path: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from core.model_folder import ST_MODEL_CONFIG, read_sentence_transformers_config

    folder = shutil.copytree(tiny_bert_path, tmp_path / "instructor-like")
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling_file.write_text(json.dumps(json.loads(pooling_file.read_text()) | {"include_prompt": False}))
    assert "prompts" not in read_sentence_transformers_config(folder)  # no prompts: nothing to leave out
    (folder / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": {"query": "Represent the query: "}}))
    with pytest.raises(ValueError, match="include_prompt: false"):
        read_sentence_transformers_config(folder)


def test_the_nested_sentence_transformers_layout_loads(tiny_bert_path: Path, tmp_path: Path) -> None:
    """Folders saved by older sentence-transformers keep the Hugging Face model in ``0_Transformer/``."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from export.bundle import export_bundle

    folder = tmp_path / "nested"
    inner = folder / "0_Transformer"
    shutil.copytree(tiny_bert_path, folder)
    inner.mkdir()
    for file in folder.iterdir():
        if file.is_file() and file.name != "modules.json":
            file.rename(inner / file.name)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (folder / "modules.json").write_text(json.dumps(modules))
    texts = ["an old folder layout", "still loads"]
    theirs = SentenceTransformer(str(folder), device="cpu")
    ours = Encoder.from_pretrained(folder)
    assert ours.max_seq_length == theirs.max_seq_length == 128
    np.testing.assert_allclose(ours.encode(texts), theirs.encode(texts), atol=1e-5)
    assert export_bundle(folder, tmp_path / "registry", "nested").is_dir()


@pytest.mark.parametrize("pooling", ["max", "mean_sqrt_len"])
def test_sentence_transformers_poolings_match_theirs_in_torch_and_onnx(
    pooling: str, tiny_bert_path: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from core.model_folder import ST_POOLING_KEYS
    from core.runtime import OnnxBundle
    from export.bundle import export_bundle

    folder = shutil.copytree(tiny_bert_path, tmp_path / pooling)
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    config.update({key: mode == pooling for mode, key in ST_POOLING_KEYS.items()})
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    texts = ["a short one", "a somewhat longer text, padded beside the short one in the same batch"]
    theirs = SentenceTransformer(str(folder), device="cpu").encode(texts)
    ours = Encoder.from_pretrained(folder)
    assert ours.pooling == pooling
    np.testing.assert_allclose(ours.encode(texts), theirs, atol=1e-5)
    bundle = OnnxBundle(export_bundle(folder, tmp_path / "registry", "pooled"))
    np.testing.assert_allclose(bundle.encode(texts, batch_size=2), theirs, atol=1e-5)
