"""load_any over every kind of spec: built-in name / checkpoint (torch), bundle folder, registry; evaluation's
own load_model takes bundles only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evaluation.embedding_model import ModelSpecError, OnnxModel, load_model
from training.torch_model import TorchModel, load_any


def test_checkpoint_loads_as_torch_model_with_layers(tiny_bert_path: Path, varied_texts: list[str]) -> None:
    model = load_any(str(tiny_bert_path))
    assert isinstance(model, TorchModel)
    emb = model.encode(varied_texts)
    assert emb.shape == (len(varied_texts), 32)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    layers = model.encode_layers(varied_texts[:3])
    assert layers.shape == (5, 3, 32)  # embeddings + 4 layers
    np.testing.assert_allclose(layers[-1], emb[:3], atol=1e-5)


def test_hash_is_content_based(tiny_bert_path: Path) -> None:
    import torch

    first, second = load_any(str(tiny_bert_path)), load_any(str(tiny_bert_path))
    assert first.hash == second.hash and len(first.hash) == 64
    with torch.no_grad():
        second.encoder.backbone.embeddings.word_embeddings.weight[0, 0] += 1.0
    del second.__dict__["hash"]  # cached_property: recompute after the edit
    assert first.hash != second.hash


def test_hash_follows_the_tokenizer_and_the_output_layer(tiny_bert_path: Path, tmp_path: Path) -> None:
    """A cached score belongs to what the model computes: a tokenizer that stops lower-casing, or other weights in
    the Dense layer after pooling, give other embeddings and so another hash."""
    import json
    import shutil

    import torch

    from core.model_folder import DenseLayer
    from training.encoder import OutputLayer

    cased = tmp_path / "cased"
    shutil.copytree(tiny_bert_path, cased)
    spec = json.loads((cased / "tokenizer.json").read_text())
    assert spec["normalizer"]["lowercase"] is True
    spec["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(spec))
    settings = json.loads((cased / "tokenizer_config.json").read_text())
    settings["do_lower_case"] = False  # or the loader lower-cases again, as the folder asks
    (cased / "tokenizer_config.json").write_text(json.dumps(settings))
    plain, other = load_any(str(tiny_bert_path)), load_any(str(cased))
    assert plain.encode(["Hello World"]).tolist() != other.encode(["Hello World"]).tolist()
    assert plain.hash != other.hash

    first, second = load_any(str(tiny_bert_path)), load_any(str(tiny_bert_path))
    dense = OutputLayer(DenseLayer(in_features=first.dim, out_features=8))
    first.encoder.output = dense
    second.encoder.output = OutputLayer(dense.spec)
    second.encoder.output.load_state_dict(dense.state_dict())
    assert first.hash == second.hash
    with torch.no_grad():
        second.encoder.output.linear.weight[0, 0] += 1.0
    del second.__dict__["hash"]
    assert first.hash != second.hash


def test_bundle_folder_and_registry_specs(
    tiny_registry: Path, tiny_bert_path: Path, varied_texts: list[str]
) -> None:
    folder = tiny_registry / "tiny" / "1"
    bundle = load_any(str(folder))
    assert isinstance(bundle, OnnxModel)
    assert bundle.name == "tiny@1" and not bundle.supports_layers
    torch_emb = load_any(str(tiny_bert_path)).encode(varied_texts)
    np.testing.assert_allclose(bundle.encode(varied_texts), torch_emb, atol=1e-3)
    assert load_any("registry:tiny", registry_dir=tiny_registry).hash == bundle.hash
    assert load_model("registry:tiny@1", registry_dir=tiny_registry).path == folder
    with pytest.raises(TypeError, match="layer-wise embeddings need the torch checkpoint"):
        bundle.encode_layers(["x"])
    with pytest.raises(ModelSpecError, match="registry:NAME@VERSION"):
        load_model("registry:tiny@7", registry_dir=tiny_registry)


def test_unknown_spec_explains_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match=r"Bundles are accepted too: a folder holding manifest.json"):
        load_any(str(tmp_path / "nowhere"))
    with pytest.raises(ModelSpecError, match=r"not an exported bundle .* load checkpoints and built-in models with"):
        load_model("minilm-l6")  # evaluation never loads torch checkpoints itself


def test_a_runs_checkpoints_are_named_with_the_run(tiny_bert_path: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "sct-tiny-seed1"
    shutil.copytree(tiny_bert_path, run / "best")
    assert load_any(str(run / "best")).name == "sct-tiny-seed1/best"
    assert load_any(str(tiny_bert_path)).name == tiny_bert_path.name
