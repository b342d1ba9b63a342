"""Teacher targets: the teacher's embedding of each training text, computed once, equals the per-step one."""

from __future__ import annotations

from pathlib import Path

import torch

from training.encoder import Encoder
from training.targets import TeacherTargets


def test_memoised_targets_equal_the_teacher_run_on_the_batch(tiny_bert_path: Path) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    long = "A much longer text about rivers, jazz and compilers, " * 3
    targets = TeacherTargets(teacher)
    first = targets(["a short one.", long, "a short one."])
    assert len(targets) == 2  # each distinct text embedded once
    torch.testing.assert_close(first[0], first[2])
    batch = ["third", long, "a short one."]  # one new text, two remembered ones, in another batch and order
    with torch.no_grad():
        expected = teacher(**teacher.tokenize(batch))
    torch.testing.assert_close(targets(batch), expected, atol=1e-5, rtol=0)
    assert len(targets) == 3 and not targets(batch).requires_grad


def test_the_store_keeps_vectors_for_the_next_run_of_the_same_teacher(tiny_bert_path: Path, tmp_path: Path) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    first = TeacherTargets(teacher, tmp_path)
    vectors = first(["one text.", "two texts."])
    first.save()
    again = TeacherTargets(teacher, tmp_path)
    assert (again.loaded, len(again)) == (2, 2)
    torch.testing.assert_close(again(["two texts.", "one text."]), vectors.flip(0))
    assert again.computed == 0  # nothing re-embedded
    again(["a third."])
    again.save()
    assert TeacherTargets(teacher, tmp_path).loaded == 3
    other = Encoder.from_pretrained(tiny_bert_path, max_seq_length=16).eval()  # another token limit: another teacher
    assert TeacherTargets(other, tmp_path).loaded == 0
