"""Recipes: every built-in recipe loads and runs a few steps on a tiny model; overrides and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.cli import main as train_main
from training.config import (
    RECIPES_DIR,
    RENAMED_RECIPES,
    ConfigError,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_config,
)
from training.encoder import Encoder
from training.recipe_values import parse_value
from training.trainer import train

BUILTIN_RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))
SHIPPED = ("sct-tiny", "sct-small", "distil-tiny", "distil-tiny-pca", "tmft", "crop-mpnet", "crop-minilm")


def tiny_corpus(n: int = 24) -> list[str]:
    """Documents of four sentences of 100–250 characters, so every document yields crop pairs."""
    topics = ["river ecology", "jazz history", "compiler design", "volcanic soils", "chess openings", "tax law"]
    docs = []
    for i in range(n):
        topic = topics[i % len(topics)]
        sentences = [
            f"Document {i} discusses {topic} in some depth, sentence {j}, adding detail about measurements, "
            f"methods and the people who studied {topic} for many years."
            for j in range(4)
        ]
        docs.append(" ".join(sentences))
    return docs


def load_tiny(recipe: str, tmp_path: Path, model: Path, **extra: object) -> TrainConfig:
    """A built-in recipe shrunk to a tiny model, a tiny corpus and two steps."""
    config = load_config(recipe)
    params = dict(config.objective_params)
    if "queue_size" in _objective_parameters(config):
        params["queue_size"] = 16
    values = {
        "model": str(model),
        "corpus": tiny_corpus(),
        "max_steps": 2,
        "batch_size": 4,
        "max_seq_length": 32,
        "max_documents": None,
        "validation_fraction": 0.25,
        "eval_every": 1,
        "checkpoint_every": 0,
        "time_budget_s": None,
        "output_dir": str(tmp_path / "run"),
        "progress_bar": False,
        "objective_params": params,
        **extra,
    }
    return config.replace(**values)


def _objective_parameters(config: TrainConfig) -> set[str]:
    import inspect

    from training.objectives import OBJECTIVES

    name = "infonce" if config.objective == "simcse" else config.objective
    return set(inspect.signature(OBJECTIVES[name]).parameters)


def test_the_shipped_recipes_exist_and_load() -> None:
    assert set(SHIPPED) <= set(BUILTIN_RECIPES)
    for name in BUILTIN_RECIPES:
        config = load_config(name)
        assert config.name == name
        budget = config.time_budget_s
        assert budget is not None and budget <= 30 * 60, f"{name}: defaults must finish within 30 minutes"


def test_crop_mpnet_follows_the_cropping_paper() -> None:
    config = load_config("crop-mpnet")
    assert (config.model, config.objective, config.views) == ("mpnet-base", "infonce", "crop")
    assert (config.batch_size, config.lr, config.epochs) == (64, 2e-5, 1.0)
    assert config.objective_params["temperature"] == 0.05
    assert config.train_last_layers == 2  # paper 000 Fig. 4a: the last layers, what fits a 110M model on 2 CPU cores
    minilm = load_config("crop-minilm")
    assert minilm.model == "minilm-l6" and minilm.objective_params == config.objective_params


def test_student_recipes_are_named_for_their_objectives() -> None:
    sct, mse, pca = load_config("sct-tiny"), load_config("distil-tiny"), load_config("distil-tiny-pca")
    assert sct.model == mse.model == pca.model == "minilm-l6"
    # sct-tiny runs SCT's distillation (papers/001 §3.4) with the MSE term; the distil-* recipes MSE alone
    assert sct.objective == "sct" and sct.objective_params == {"projector_layers": 0, "mse_weight": 1.0}
    assert mse.objective == pca.objective == "mse_distillation"
    # all three distil the teacher's embedding of whole texts and are selected by fidelity to it
    for recipe in (sct, mse, pca):
        assert (recipe.views, recipe.validation_metric) == ("texts", "teacher_fidelity")
        assert recipe.max_seq_length == 128 and recipe.text_sentences >= 1
    # the two 2 x 384 recipes differ only in the objective: the comparison of docs/RESULTS.md
    differ = {f for f in sct.__dataclass_fields__ if getattr(sct, f) != getattr(mse, f)}
    assert differ == {"name", "objective", "objective_params"}
    assert pca.student_output_dim == "teacher"  # the 128 → 384 output layer stays in the saved model
    assert sct.student == "layer_subset" and sct.student_layers == (0, 5)
    # sct-small is sct-tiny with the third layer the 3 x 384 builds of docs/RESULTS.md kept: nothing else differs
    small = load_config("sct-small")
    assert {f for f in sct.__dataclass_fields__ if getattr(sct, f) != getattr(small, f)} == {"name", "student_layers"}
    assert small.student_layers == (0, 3, 5)
    assert pca.student == "tiny_bert" and (pca.student_num_layers, pca.student_hidden_size) == (2, 128)


@pytest.mark.parametrize("recipe", ["sct-tiny", "distil-tiny", "distil-tiny-pca"])
def test_student_recipe_smoke(recipe: str, tmp_path: Path, tiny_bert_path: Path) -> None:
    config = load_tiny(recipe, tmp_path, tiny_bert_path, student_layers=[0, 3], student_hidden_size=16)
    result = train(config)
    assert result.steps == 2 and result.layers == 2
    student = Encoder.from_pretrained(result.best_dir)
    assert student.num_layers == 2
    # the PCA student keeps its output layer into the teacher's width (this teacher's 32)
    assert student.dim == 32 and student.hidden_size == (16 if recipe == "distil-tiny-pca" else 32)
    assert student.encode(["a tiny check"]).shape == (1, 32)


def test_renamed_recipes_keep_their_old_names() -> None:
    # a recipe is named for its objective; scripts that use an old name still run the same recipe
    for old, new in RENAMED_RECIPES.items():
        with pytest.warns(UserWarning, match=f"recipe '{old}' is now called '{new}'"):
            renamed = load_config(old)
        assert renamed == load_config(new) and renamed.name == new
        assert old not in BUILTIN_RECIPES
    assert RENAMED_RECIPES["sct-tiny-pca"] == "distil-tiny-pca"


def test_tmft_probes_truncates_and_fine_tunes_electra(tmp_path: Path, tiny_electra_path: Path) -> None:
    config = load_tiny("tmft", tmp_path, tiny_electra_path, probe_max_layers=2)
    result = train(config)
    probe = result.extra["probe"]
    assert len(probe) == 5  # embeddings + 4 layers
    best = max(probe[1:3])
    expected = max(layer for layer in (1, 2) if probe[layer] >= best - config.probe_tolerance)  # deepest near-best
    assert result.layers == expected
    model = Encoder.from_pretrained(result.best_dir)
    assert model.num_layers == expected and type(model.backbone).__name__ == "ElectraModel"


@pytest.mark.parametrize("recipe,fixture", [("crop-mpnet", "tiny_mpnet_path"), ("crop-minilm", "minilm_l6_path")])
def test_crop_recipes_smoke(recipe: str, fixture: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    model = request.getfixturevalue(fixture)
    config = load_tiny(recipe, tmp_path, model, max_steps=1, eval_every=0)
    result = train(config)
    assert result.steps == 1 and result.stopped_by == "max_steps"
    assert (result.best_dir / "modules.json").is_file()  # sentence-transformers layout for export
    lines = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["train", "eval"]
    assert lines[0]["loss"] > 0 and "accuracy" in lines[0]


def test_supervised_pairs_use_cosent(tmp_path: Path, tiny_bert_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"text1": f"topic {i} text", "text2": f"topic {i % 5} words", "score": float(i % 5 == i % 7)} for i in range(24)
    ]
    pairs.write_text("\n".join(json.dumps(r) for r in rows))
    config = load_tiny("tmft", tmp_path, tiny_bert_path, pairs=str(pairs), truncate=2)
    result = train(config)
    assert result.steps == 2 and result.layers == 2
    assert "pair_spearman" in result.evaluations[-1]


# --- overrides and their errors -------------------------------------------------------------------


def test_set_values_parse_as_toml() -> None:
    assert parse_value("1e-4") == 1e-4
    assert parse_value("[0, 5]") == [0, 5]
    assert parse_value("true") is True
    assert parse_value("runs/x") == "runs/x"
    assert parse_value("none") is None and load_config("crop-minilm", ["time_budget_s=none"]).time_budget_s is None
    values = apply_overrides({"lr": 1.0}, ["lr=3e-5", "student_layers=[0,2]", "objective_params.temperature=0.1"])
    config = from_dict(values)
    assert config.lr == 3e-5 and config.student_layers == (0, 2)
    assert config.objective_params == {"temperature": 0.1}


def test_unknown_key_names_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'lrr' \(did you mean 'lr'\?\)"):
        load_config("crop-minilm", ["lrr=1e-3"])


def test_wrong_type_and_malformed_overrides_fail_clearly() -> None:
    with pytest.raises(ConfigError, match=r"'batch_size' expects an integer, got 'big'"):
        load_config("crop-minilm", ["batch_size=big"])
    with pytest.raises(ConfigError, match="--set expects key=value"):
        load_config("crop-minilm", ["batch_size"])
    with pytest.raises(ConfigError, match="only objective_params"):
        load_config("crop-minilm", ["model.name=x"])
    with pytest.raises(ConfigError, match="objective must be one of"):
        load_config("crop-minilm", ["objective=triplet"])
    with pytest.raises(ConfigError, match="set views = 'dropout'"):
        load_config("crop-minilm", ["objective=simcse"])
    with pytest.raises(ConfigError, match="neither a file nor a built-in recipe"):
        load_config("no-such-recipe")


def test_cli_reports_bad_keys_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(["crop-minilm", "--set", "bacth_size=4"]) == 2
    assert "did you mean 'batch_size'" in capsys.readouterr().err


def test_cli_reports_a_corpus_it_cannot_read_with_exit_code_2(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    argv = ["crop-minilm", "-q", "--set", f"model={json.dumps(str(tiny_bert_path))}"]
    argv += ["--set", f"corpus={json.dumps(str(missing))}", "--set", f"output_dir={json.dumps(str(tmp_path / 'out'))}"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("embedder train: ") and str(missing) in err and "Traceback" not in err


def test_cli_prints_the_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(["crop-minilm", "--set", "lr=1e-4", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["lr"] == 1e-4


def test_cli_trains_and_prints_the_best_dir(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d}) for d in tiny_corpus()))
    argv = ["crop-minilm", "-q", "--set", f"model={json.dumps(str(tiny_bert_path))}"]
    for item in (
        f"corpus={json.dumps(str(corpus))}",
        "max_documents=20",
        "max_steps=1",
        "batch_size=4",
        "max_seq_length=32",
        f"output_dir={json.dumps(str(tmp_path / 'out'))}",
    ):
        argv += ["--set", item]
    assert train_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["best_dir"] == str(tmp_path / "out" / "best") and report["steps"] == 1
