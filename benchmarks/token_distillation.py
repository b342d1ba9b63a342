"""Train a distillation recipe with one more term: the student's token states regress the teacher's.

`embedder train` distils pooled embeddings only (the teacher's vector of each whole text). This script runs the same
recipe and adds, per step, the relative squared error between the student's and the teacher's last hidden state at
every real token of the batch's texts,

    ``weight · Σ_{b,t} ||h_s(b, t) − h_t(b, t)||² / Σ_{b,t} ||h_t(b, t)||²``,

the hidden-state loss of TinyBERT (Jiao et al. 2020) made scale-free. Student and teacher must share the
tokeniser and token limit, so that token t of a text is the same word piece in both (a text whose token counts
differ stops the run). The teacher's states of each text are
computed once, kept in memory as float16 and reused across epochs (whole-text views only: ``views = "texts"``). Both
states are read through forward hooks on the backbones, so the recipe's own objective, validation and output are
untouched; the objective's metrics gain ``token_relative_error``. With ``--student-layer S --teacher-layer T`` the term
reads the output of the student's transformer layer S and of the teacher's layer T instead (0-based): for the
``sct-tiny`` student, layers [0, 5] of minilm-l6, ``--student-layer 0 --teacher-layer 4`` asks its first layer for
what the teacher's first five compute, the input its second layer (the teacher's last) was trained on.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/token_distillation.py --weight 4 -- sct-tiny \
        --set output_dir=runs/sct-tiny-tokens --set max_steps=300 --set max_documents=8000

Everything after ``--`` is `embedder train`'s command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from training import trainer
from training.cli import main as train_main
from training.encoder import Encoder, find_layers
from training.targets import TeacherTargets, text_key


class TokenStates:
    """The token states (the last hidden state, or the output of transformer layer ``layer``) and the attention mask
    of an encoder's latest forward pass, read by hooks."""

    def __init__(self, encoder: Encoder, layer: int | None = None) -> None:
        self.hidden: Tensor | None = None
        self.mask: Tensor | None = None
        self.layer = layer
        encoder.backbone.register_forward_hook(self._keep, with_kwargs=True)
        if layer is not None:
            owner, name = find_layers(encoder.backbone)
            getattr(owner, name)[layer].register_forward_hook(self._keep_layer)

    def _keep(self, _module: nn.Module, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
        self.mask = kwargs["attention_mask"]
        if self.layer is None:
            self.hidden = output.last_hidden_state

    def _keep_layer(self, _module: nn.Module, _args: Any, output: Any) -> None:
        self.hidden = output[0] if isinstance(output, tuple) else output


class TokenTargets:
    """The teacher's token states of each text (text SHA-256 → ``(tokens, D)`` float16), computed once."""

    def __init__(self, layer: int | None = None) -> None:
        self.layer = layer  # the teacher's transformer layer whose output is the target; None: its last hidden state
        self.states: dict[str, Tensor] = {}
        self.keys: list[str] = []  # the texts of the latest `TeacherTargets` call: the batch the student just embedded
        self._teacher: TokenStates | None = None

    def watch(self, teacher: Encoder) -> None:
        """Read the states of every pass ``teacher`` makes from now on (once per teacher)."""
        if self._teacher is None:
            self._teacher = TokenStates(teacher, self.layer)

    def keep(self, keyed: Sequence[tuple[str, str]]) -> None:
        """Keep the states of the texts of ``keyed`` ``(key, text)`` from the teacher's latest pass, made over them."""
        assert self._teacher is not None and self._teacher.hidden is not None and self._teacher.mask is not None
        hidden, mask = self._teacher.hidden, self._teacher.mask
        for i, (key, _text) in enumerate(keyed):
            self.states[key] = hidden[i, : int(mask[i].sum())].to(torch.float16).cpu()

    def record(self, targets: TeacherTargets, texts: Sequence[str]) -> None:
        """The batch is ``texts``; the teacher embeds those whose states neither an earlier batch nor the pass
        `TeacherTargets` just made for their vectors gave."""
        self.keys = [text_key(t) for t in texts]
        missing = list(dict.fromkeys((k, t) for k, t in zip(self.keys, texts, strict=True) if k not in self.states))
        if missing:
            with torch.no_grad():
                targets.teacher(**targets.teacher.tokenize([t for _k, t in missing]))
            self.keep(missing)

    def padded(self, like: Tensor, mask: Tensor) -> Tensor:
        """The batch's teacher states padded to ``like`` ``(B, T, D)``, the student's states; ``mask``
        ``(B, T)`` the student's attention mask, whose token counts the teacher's must equal."""
        out = torch.zeros_like(like)
        for i, key in enumerate(self.keys):
            state = self.states[key]
            if state.shape[0] != int(mask[i].sum()):
                raise ValueError(
                    f"a text has {int(mask[i].sum())} tokens for the student and {state.shape[0]} for the teacher: "
                    "the token term needs one tokeniser and one token limit for both"
                )
            out[i, : state.shape[0]] = state.to(like.dtype)
        return out


def relative_error(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """``Σ ||student − teacher||² / Σ ||teacher||²`` over the real tokens (``mask`` 1) of ``(B, T, D)`` states."""
    weights = mask.unsqueeze(-1).to(student.dtype)
    return ((student - teacher.detach()) ** 2 * weights).sum() / (teacher.detach() ** 2 * weights).sum().clamp_min(1e-6)


class WithTokenTerm(nn.Module):
    """The recipe's objective plus ``weight`` × the token term of the batch the student last embedded."""

    def __init__(self, objective: nn.Module, student: TokenStates, teacher: TokenTargets, weight: float) -> None:
        super().__init__()
        self.objective, self.student, self.teacher, self.weight = objective, student, teacher, weight

    def forward(self, view1: Tensor, view2: Tensor, **extra: Tensor) -> tuple[Tensor, dict[str, float]]:
        loss, metrics = self.objective(view1, view2, **extra)
        hidden, mask = self.student.hidden, self.student.mask
        if hidden is None or mask is None or len(self.teacher.keys) != hidden.shape[0]:
            raise RuntimeError("the token term needs whole-text views (views = 'texts') and a teacher")
        error = relative_error(hidden, self.teacher.padded(hidden, mask), mask)
        return loss + self.weight * error, {**metrics, "token_relative_error": float(error.detach())}


@contextmanager
def token_term(weight: float, student_layer: int | None = None, teacher_layer: int | None = None) -> Iterator[None]:
    """Within the block, `training.trainer.train` adds the token term with ``weight`` to the recipe's objective: the
    output of the student's transformer layer ``student_layer`` regresses that of the teacher's ``teacher_layer``
    (None: the last hidden state)."""
    teacher_states = TokenTargets(teacher_layer)
    holder: dict[str, TokenStates] = {}
    build_models, build_objective = trainer.build_models, trainer.build_objective
    targets_call, targets_embed = TeacherTargets.__call__, TeacherTargets._embed

    def models_with_hook(*args: Any, **kwargs: Any) -> Any:
        models = build_models(*args, **kwargs)
        holder["student"] = TokenStates(models.student, student_layer)
        return models

    def objective_with_term(*args: Any, **kwargs: Any) -> nn.Module:
        return WithTokenTerm(build_objective(*args, **kwargs), holder["student"], teacher_states, weight)

    def embed_keeping_states(self: TeacherTargets, missing: Sequence[tuple[str, str]]) -> None:
        teacher_states.watch(self.teacher)
        targets_embed(self, missing)  # the teacher's pass for the vectors: its states come with it
        teacher_states.keep(missing)

    def targets_with_states(self: TeacherTargets, texts: Sequence[str]) -> Tensor:
        teacher_states.watch(self.teacher)
        vectors = targets_call(self, texts)
        teacher_states.record(self, texts)
        return vectors

    trainer.build_models, trainer.build_objective = models_with_hook, objective_with_term
    TeacherTargets.__call__ = targets_with_states  # type: ignore[method-assign]
    TeacherTargets._embed = embed_keeping_states  # type: ignore[method-assign]
    try:
        yield
    finally:
        trainer.build_models, trainer.build_objective = build_models, build_objective
        TeacherTargets.__call__, TeacherTargets._embed = targets_call, targets_embed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weight", type=float, default=1.0, help="the token term's weight (default 1)")
    parser.add_argument("--student-layer", type=int, help="the student's transformer layer (0-based) whose output "
                        "is regressed (default: the last hidden state)")  # fmt: skip
    parser.add_argument("--teacher-layer", type=int, help="the teacher's transformer layer (0-based) whose output is "
                        "the target (default: the last hidden state)")  # fmt: skip
    args = parser.parse_args(argv[:split])
    if args.weight <= 0:
        parser.error(f"--weight must be > 0, got {args.weight}")
    if (args.student_layer is None) != (args.teacher_layer is None):
        parser.error("--student-layer and --teacher-layer go together")
    with token_term(args.weight, args.student_layer, args.teacher_layer):
        return train_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
