"""Reading a sentence-transformers folder's module files: the module chain this project reproduces is accepted,
anything else is refused by name, and the prompts sentence-transformers writes are read as it applies them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.catalog import BUILTIN_MODELS, resolve_model
from core.model_folder import (
    ST_MODEL_CONFIG,
    DenseLayer,
    read_sentence_transformers_config,
    write_sentence_transformers_config,
)

ST = "sentence_transformers.models."


def _folder(tmp_path: Path, *, normalize: bool = True, dense: bool = False) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    layer = DenseLayer(in_features=8, out_features=4) if dense else None
    write_sentence_transformers_config(
        folder, dim=8, pooling="mean", normalize=normalize, max_seq_length=32, dense=layer
    )
    return folder


def _write_modules(folder: Path, kinds: list[str]) -> None:
    modules = []
    for idx, kind in enumerate(kinds):
        path = "" if kind == "Transformer" else f"{idx}_{kind}"
        (folder / path).mkdir(parents=True, exist_ok=True)
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": ST + kind})
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize(("normalize", "dense"), [(False, False), (True, False), (False, True), (True, True)])
def test_the_supported_module_chains_are_read(tmp_path: Path, normalize: bool, dense: bool) -> None:
    found = read_sentence_transformers_config(_folder(tmp_path, normalize=normalize, dense=dense))
    assert found["pooling"] == "mean" and found["normalize"] is normalize and found["max_seq_length"] == 32
    assert ("dense" in found) is dense


@pytest.mark.parametrize(
    ("kinds", "offender"),
    [
        (["Transformer", "Pooling", "LayerNorm", "Normalize"], 2),  # a module this project lacks
        (["Transformer", "Pooling", "Normalize", "Dense"], 3),  # Dense after normalising: not reproduced
        (["Transformer", "Pooling", "Dense", "Dense"], 3),  # only one output layer
        (["Transformer", "Pooling", "Normalize", "Normalize"], 3),
        (["Transformer", "Dense", "Pooling"], 1),  # Dense on token states
        (["Pooling", "Transformer"], 0),
        (["Transformer", "WordWeights", "Pooling"], 1),
    ],
)
def test_other_module_chains_are_refused_naming_the_module(tmp_path: Path, kinds: list[str], offender: int) -> None:
    folder = _folder(tmp_path, dense=True)
    _write_modules(folder, kinds)
    with pytest.raises(ValueError, match="Transformer, then Pooling") as err:
        read_sentence_transformers_config(folder)
    assert f"{ST}{kinds[offender]}" in str(err.value) and repr(f"{offender}_{kinds[offender]}") in str(err.value)


def test_a_folder_without_pooling_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _write_modules(folder, ["Transformer"])
    with pytest.raises(ValueError, match="no Pooling module"):
        read_sentence_transformers_config(folder)


def test_the_builtin_folders_load(minilm_l6_path: Path, minilm_l3_path: Path) -> None:
    assert read_sentence_transformers_config(minilm_l6_path)["normalize"] is True
    assert read_sentence_transformers_config(minilm_l3_path)["pooling"] == "mean"
    if BUILTIN_MODELS["mpnet-base"].installed():
        assert read_sentence_transformers_config(resolve_model("mpnet-base"))["normalize"] is True


def _exclude_prompt_tokens(folder: Path, prompts: dict[str, str], default: str | None = None) -> None:
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling_file.write_text(json.dumps(json.loads(pooling_file.read_text()) | {"include_prompt": False}))
    (folder / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": prompts, "default_prompt_name": default}))


def test_empty_prompts_do_not_block_pooling_without_prompt_tokens(tmp_path: Path) -> None:
    """sentence-transformers 3+ saves ``{"query": "", "document": ""}`` into every model: with nothing to leave
    out, include_prompt: false pools exactly as this project does, and the names stay valid (adding nothing)."""
    folder = _folder(tmp_path)
    _exclude_prompt_tokens(folder, {"query": "", "document": ""})
    found = read_sentence_transformers_config(folder)
    assert found["pooling"] == "mean" and not found["prompts"].nonempty
    assert found["prompts"].text_for("query") == "" and found["prompts"].text_for(None) == ""


def test_an_empty_document_prompt_does_not_hide_a_passage_prompt(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    e5 = {"query": "query: ", "document": "", "passage": "passage: "}
    (folder / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": e5, "default_prompt_name": None}))
    prompts = read_sentence_transformers_config(folder)["prompts"]
    assert prompts.for_role("document") == "passage: " and prompts.for_role("query") == "query: "
    assert prompts.text_for("document") == ""  # named, it is what the folder says
    only_empty = {"prompts": {"query": "", "document": ""}}
    (folder / ST_MODEL_CONFIG).write_text(json.dumps(only_empty))
    assert read_sentence_transformers_config(folder)["prompts"].for_role("document") == ""


def test_a_non_empty_prompt_with_pooling_without_prompt_tokens_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _exclude_prompt_tokens(folder, {"query": "Represent the query: ", "document": ""})
    with pytest.raises(ValueError, match="include_prompt: false"):
        read_sentence_transformers_config(folder)
