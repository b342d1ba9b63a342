"""Teacher targets: the teacher's embedding of each training text, computed once, equals the per-step one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

import training.targets as targets_module
from training.encoder import Encoder
from training.targets import (
    TeacherTargets,
    pulled_targets,
    read_vectors,
    teacher_fingerprint,
    text_key,
    write_vectors,
)


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


def test_fill_embeds_longest_first_in_batches_what_the_teacher_gives_one_by_one(tiny_bert_path: Path) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    texts = ["short.", "a text of middling length here.", "tiny", "the longest text of all, " * 4, "short."]
    targets, seen = TeacherTargets(teacher), []
    assert targets.fill(texts, batch_size=2, progress=lambda done, total: seen.append((done, total))) == 4
    assert seen == [(2, 4), (4, 4)] and targets.fill(texts) == 0  # the duplicate once; nothing twice
    with torch.no_grad():
        one_by_one = torch.cat([teacher(**teacher.tokenize([t])) for t in texts])
    torch.testing.assert_close(targets(texts), one_by_one, atol=1e-5, rtol=0)  # padding to like lengths changes nothing
    assert set(targets.of([*texts, "never embedded"])) == {text_key(t) for t in texts}


def test_preset_vectors_are_the_targets_of_their_texts_and_never_enter_the_store(
    tiny_bert_path: Path, tmp_path: Path
) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    given = torch.arange(teacher.dim, dtype=torch.float32)
    write_vectors(tmp_path / "preset.npz", {text_key("general text."): given})
    targets = TeacherTargets(teacher, tmp_path / "store", preset=tmp_path / "preset.npz")
    out = targets(["general text.", "customer text."])
    torch.testing.assert_close(out[0], given)  # not the teacher's embedding of it
    assert targets.computed == 1  # only the customer's text asked the teacher
    targets.save()
    stored = read_vectors(next((tmp_path / "store").glob("*.npz")))
    assert set(stored) == {text_key("customer text.")}


def test_the_fingerprint_of_a_folder_is_the_same_on_every_load(tiny_bert_path: Path) -> None:
    """A folder saved without BERT's (unused) pooler head gets it at random on each load: the fingerprint ignores it,
    or a store written by one process would never be found by the next."""
    first, second = (Encoder.from_pretrained(tiny_bert_path, max_seq_length=32) for _ in range(2))
    assert teacher_fingerprint(first) == teacher_fingerprint(second)
    first.backbone.embeddings.word_embeddings.weight.data[0, 0] += 1.0  # a weight that is used
    assert teacher_fingerprint(first) != teacher_fingerprint(second)


def test_pulled_targets_turn_each_piece_toward_its_own_document(tiny_bert_path: Path) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    documents = ["Rivers carry water to the sea. They cut valleys.", "Compilers turn source code into machine code."]
    pieces = [("Rivers carry water", 0), ("machine code", 1), ("They cut valleys.", 0), (documents[1], 1)]
    targets = TeacherTargets(teacher)
    pulled = pulled_targets(targets, documents, pieces, 1.0, batch_size=2)
    assert set(pulled) == {text_key(t) for t in [*documents, *(p for p, _ in pieces)]}
    own = targets.of([*documents, *(p for p, _ in pieces)])
    unit = torch.nn.functional.normalize
    for text, source in pieces[:3]:
        key, home = text_key(text), text_key(documents[source])
        torch.testing.assert_close(pulled[key].norm(), own[key].norm())  # the piece's scale kept
        expected = unit(unit(own[key], dim=0) + unit(own[home], dim=0), dim=0)  # unit(t(p)) + 1 * unit(t(d))
        torch.testing.assert_close(unit(pulled[key], dim=0), expected)
        closer = unit(pulled[key], dim=0) @ unit(own[home], dim=0) - unit(own[key], dim=0) @ unit(own[home], dim=0)
        assert closer > 0  # nearer its own document than the teacher put it
    for document in documents:  # documents, and a piece that is a whole document, keep the teacher's embedding
        torch.testing.assert_close(pulled[text_key(document)], own[text_key(document)])
    unchanged = pulled_targets(TeacherTargets(teacher), documents, pieces, 0.0)
    for key, vector in unchanged.items():
        torch.testing.assert_close(vector, own[key], atol=1e-5, rtol=0)
    shared = pulled_targets(targets, documents, pieces, 1.0, shared={"They cut valleys."})  # another holds it
    torch.testing.assert_close(shared[text_key("They cut valleys.")], own[text_key("They cut valleys.")])
    torch.testing.assert_close(shared[text_key("machine code")], pulled[text_key("machine code")])


def test_the_store_is_bounded_and_keeps_what_the_current_run_uses(tiny_bert_path: Path, tmp_path: Path) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    old = TeacherTargets(teacher, tmp_path, max_stored=4)
    old([f"an older run's text {i}." for i in range(4)])
    old.save()
    run = TeacherTargets(teacher, tmp_path, max_stored=4)
    assert run.loaded == 4
    used = ["an older run's text 1.", "a new text.", "another new text."]  # one from the store, two embedded
    run(used)
    run.save()
    stored = read_vectors(next(tmp_path.glob("*.npz")))
    # the bound holds; the run's three texts are all kept, the most recently used last; one older text is evicted
    assert list(stored) == [text_key(t) for t in ["an older run's text 3.", *used]]
    big = TeacherTargets(teacher, tmp_path, max_stored=2)
    assert big.loaded == 2  # a file over the bound is read from its newest end
    texts = [f"text {i}" for i in range(3)]
    big(texts)
    big.save()  # a run using more texts than the bound keeps them all, and nothing else
    assert set(read_vectors(next(tmp_path.glob("*.npz")))) == {text_key(t) for t in texts}


def test_runs_saving_to_one_store_together_keep_each_others_vectors(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each save reads the store, merges and writes it: two at once would both read the old file, and the later
    write would drop the other's vectors. The file's lock serialises them; the rename keeps the file whole."""
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    runs = [TeacherTargets(teacher, tmp_path) for _ in range(2)]
    for i, run in enumerate(runs):
        run([f"run {i}'s text."])
    slow_read = targets_module.read_vectors

    def read_then_wait(path: Path) -> dict[str, torch.Tensor]:
        vectors = slow_read(path)
        time.sleep(0.3)  # the other run's save starts meanwhile
        return vectors

    monkeypatch.setattr(targets_module, "read_vectors", read_then_wait)
    write_vectors(runs[0].path, {text_key("a text saved before."): torch.zeros(teacher.dim)})
    threads = [threading.Thread(target=run.save) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = ["a text saved before.", "run 0's text.", "run 1's text."]
    assert set(slow_read(runs[0].path)) == {text_key(t) for t in expected}
