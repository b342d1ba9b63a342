"""A model whose embeddings hold NaN or infinity is refused, never scored: retrieval ranks NaN similarities in some
order and reports a plausible nDCG, which a gate would compare as if it meant something."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from evaluation.diagnostics import alignment, effective_rank, uniformity
from evaluation.embedding_model import NonFiniteEmbeddingError
from evaluation.suite import run_suite


def test_a_model_with_nan_embeddings_is_refused_not_scored(fake_model_factory) -> None:
    model = fake_model_factory("nan-model", lambda text: [math.nan] * 4, dim=4)
    with pytest.raises(NonFiniteEmbeddingError, match="nan-model returned NaN or infinite embeddings") as caught:
        run_suite(model, ["ACLSumRetrieval"], fast=True, progress=False)
    assert caught.value.model is model


def test_one_infinite_text_is_enough(fake_model_factory) -> None:
    model = fake_model_factory("inf-model", lambda text: [math.inf, 1.0] if "the" in text else [1.0, 0.5], dim=2)
    with pytest.raises(NonFiniteEmbeddingError, match=r"for \d+ of \d+ texts"):
        run_suite(model, ["LeeDocSTS"], fast=True, progress=False)


@pytest.mark.parametrize("measure", [effective_rank, uniformity, lambda x: alignment(x, x)])
def test_diagnostics_refuse_non_finite_embeddings(measure) -> None:
    emb = np.array([[1.0, 0.0], [0.0, 1.0], [math.nan, 1.0]])
    with pytest.raises(ValueError, match="NaN or infinite"):
        measure(emb)


def _nan_checkpoint(tiny_bert_path: Path, folder: Path) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_bert_path, folder)
    weights = load_file(folder / "model.safetensors")
    key = next(k for k in weights if k.endswith("embeddings.LayerNorm.weight"))
    weights[key].fill_(math.nan)  # a diverged training run
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_validate_rejects_a_nan_candidate_in_one_line(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from embedder.evaluation_cli import validate_main

    nan_model = _nan_checkpoint(tiny_bert_path, tmp_path / "diverged")
    common = ["--tasks", "LeeDocSTS", "ACLSumRetrieval", "--fast", "--quiet", "--no-speed", "--layer-tasks"]
    # the candidate: it fails validation (exit 1), whether or not there is a baseline
    assert validate_main([str(nan_model), *common, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "diverged returned NaN or infinite embeddings" in err and "Traceback" not in err
    assert validate_main([str(nan_model), "--baseline", str(tiny_bert_path), *common, "--out", str(tmp_path)]) == 1
    # the baseline: the gate could not check (exit 2)
    assert validate_main([str(tiny_bert_path), "--baseline", str(nan_model), *common, "--out", str(tmp_path)]) == 2
    assert "the baseline" in capsys.readouterr().err
