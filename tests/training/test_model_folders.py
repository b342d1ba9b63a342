"""The run's model folders (best/, final/): a save interrupted at any moment leaves the old model or the new one,
whole, in the folder once the next run starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from tests.training.interrupts import Interrupted, interrupt_after
from tests.training.test_trainer import tiny_config
from training.assembly import recover_model_folder, save_model
from training.encoder import Encoder
from training.trainer import train


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def test_a_save_interrupted_at_any_moment_leaves_a_whole_model(tmp_path: Path, tiny_bert_path: Path) -> None:
    old = Encoder.from_pretrained(tiny_bert_path)
    new = Encoder.from_pretrained(tiny_bert_path)
    with torch.no_grad():
        next(new.parameters()).add_(1.0)
    save_model(old, tmp_path / "old", old.max_seq_length)
    save_model(new, tmp_path / "new", new.max_seq_length)
    expected = {_weights(tmp_path / "old"): "old", _weights(tmp_path / "new"): "new"}
    folder = tmp_path / "best"
    seen, completed = set(), False
    for operation in range(1, 20):
        shutil.rmtree(folder, ignore_errors=True)
        save_model(old, folder, old.max_seq_length)
        with pytest.MonkeyPatch.context() as monkeypatch:
            interrupt_after(monkeypatch, operation, (Encoder, "save"))
            try:
                save_model(new, folder, new.max_seq_length)
                completed = True
            except Interrupted:
                pass
        recover_model_folder(folder)  # what the next run does first
        assert folder.is_dir(), f"no model after an interruption at file operation {operation}"
        seen.add(expected[_weights(folder)])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "new", "old"], "a leftover folder stayed"
        assert Encoder.from_pretrained(folder).dim == old.dim
        if completed:
            break
    assert completed and seen == {"old", "new"}


def test_a_run_restores_a_best_folder_left_aside(tmp_path: Path, tiny_bert_path: Path) -> None:
    """Interrupted between moving the old best/ aside and renaming the new one in: resuming finds best/ again."""
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=1, eval_every=1)
    first = train(config)
    best = _weights(first.best_dir)
    aside = [p for p in tmp_path.glob("run/best.*")]
    assert not aside
    first.best_dir.rename(first.best_dir.with_name("best.old"))
    resumed = train(config.replace(resume=True, max_steps=1))
    assert _weights(resumed.best_dir) == best and resumed.best_step == first.best_step
    assert sorted(p.name for p in resumed.output_dir.iterdir() if p.name.startswith("best")) == ["best"]


def test_a_saved_folder_tokenizes_on_its_own_as_the_model_reads(tmp_path: Path, tiny_bert_path: Path) -> None:
    """The tokenizer keeps its last call's truncation (the training length) and a batch's padding; best/ and final/
    carry the model's own limit instead, for whatever reads tokenizer.json without sentence-transformers."""
    result = train(tiny_config(tmp_path, tiny_bert_path, max_steps=1, eval_every=1, max_seq_length=16))
    long_text = "word " * 300
    for folder in (result.best_dir, result.final_dir):
        limit = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
        assert limit == 128  # the model's, not the run's 16
        saved = json.loads((folder / "tokenizer.json").read_text())
        assert saved["truncation"]["max_length"] == limit and saved["padding"] is None
        assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == limit
        alone = Tokenizer.from_file(str(folder / "tokenizer.json"))
        assert [len(e.ids) for e in alone.encode_batch([long_text, "short"])] == [limit, 3]
