"""The token-state term of `benchmarks/token_distillation.py`: what it adds to a run, and that it leaves no trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.benchmark_scripts import load_script
from tests.training.test_trainer import tiny_config
from training import trainer
from training.encoder import Encoder
from training.targets import TeacherTargets
from training.trainer import train

token_distillation = load_script("token_distillation")


def test_relative_error_reads_real_tokens_only() -> None:
    teacher = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]])  # (1, 3, 2); the third token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert token_distillation.relative_error(teacher.clone(), teacher, mask) == 0
    student = teacher.clone()
    student[0, 2] = -100.0  # padding: no effect
    student[0, 0, 0] = 0.0  # one real coordinate off by 1: error 1 over ||teacher||² = 1 + 4
    assert torch.isclose(token_distillation.relative_error(student, teacher, mask), torch.tensor(0.2))


def test_teacher_states_must_have_the_students_token_counts() -> None:
    targets = token_distillation.TokenTargets()
    targets.keys = ["a", "b"]
    targets.states = {"a": torch.ones(2, 3, dtype=torch.float16), "b": torch.ones(3, 3, dtype=torch.float16)}
    like = torch.zeros(2, 4, 3)
    padded = targets.padded(like, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]))
    assert padded[0, :2].eq(1).all() and padded[0, 2:].eq(0).all() and padded[1, 3].eq(0).all()
    with pytest.raises(ValueError, match="one tokeniser and one token limit"):
        targets.padded(like, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]]))


@pytest.mark.parametrize("layers", [(None, None), (0, 2)])
def test_the_token_term_joins_the_objective_inside_the_block_only(
    tmp_path: Path, tiny_bert_path: Path, layers: tuple[int | None, int | None]
) -> None:
    originals = (trainer.build_models, trainer.build_objective, TeacherTargets.__call__)
    config = tiny_config(
        tmp_path, tiny_bert_path, objective="mse_distillation", views="texts", student="layer_subset",
        student_layers=[0, 3], teacher=str(tiny_bert_path), max_steps=3, log_every=1,
    )  # fmt: skip
    with token_distillation.token_term(2.0, *layers):
        result = train(config)
    errors = [r["token_relative_error"] for r in result.history]
    assert len(errors) == 3 and all(e > 0 for e in errors)
    assert (trainer.build_models, trainer.build_objective, TeacherTargets.__call__) == originals
    plain = train(config.replace(output_dir=str(tmp_path / "plain")))
    assert all("token_relative_error" not in r for r in plain.history)
    cosines = [r["cosine"] for r in result.history]
    assert cosines[0] == plain.history[0]["cosine"]  # the same start: the first step runs before any update
    assert cosines[1:] != [r["cosine"] for r in plain.history[1:]]  # the term changed what the updates did


@pytest.mark.parametrize("layer", [None, 0, 2])
def test_token_states_are_the_named_layers_output(tiny_bert_path: Path, layer: int | None) -> None:
    encoder = Encoder.from_pretrained(tiny_bert_path).eval()
    states = token_distillation.TokenStates(encoder, layer)
    batch = encoder.tokenize(["a short text", "a longer text, with a few more words in it"])
    with torch.no_grad():
        expected = encoder.backbone(**batch, output_hidden_states=True).hidden_states
        encoder(**batch)  # last: the states read are those of the encoder's own pass, as in training
    assert states.hidden is not None and states.mask is not None
    assert torch.equal(states.hidden, expected[-1 if layer is None else layer + 1])  # [0] is the embeddings' output
    assert torch.equal(states.mask, batch["attention_mask"])


def test_layers_are_named_in_pairs() -> None:
    with pytest.raises(SystemExit):
        token_distillation.main(["--student-layer", "0", "--", "sct-tiny"])
