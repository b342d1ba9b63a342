"""The teacher-embeddings store after a run was killed while saving it, or after a power loss cut its file short:
the next run of that teacher starts and saves, and no copy of the store is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from training.encoder import Encoder
from training.targets import TeacherTargets, read_vectors

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"text number {i} about rivers and compilers." for i in range(64)]

# Fills and saves the store in a process that dies (SIGXFSZ, which Python ignores unless told otherwise) at the
# write that takes a file past ``limit`` bytes: a kill in the middle of the save.
KILLED_MID_SAVE = """
import resource, signal, sys
from training.encoder import Encoder
from training.targets import TeacherTargets
texts = [f"text number {i} about rivers and compilers." for i in range(64)]
targets = TeacherTargets(Encoder.from_pretrained(sys.argv[1], max_seq_length=32).eval(), sys.argv[2])
targets.fill(texts)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
targets.save()
"""


def _teacher(path: Path) -> Encoder:
    return Encoder.from_pretrained(path, max_seq_length=32).eval()


def test_a_save_killed_half_way_leaves_the_store_whole_and_the_next_save_clears_its_copy(
    tiny_bert_path: Path, tmp_path: Path
) -> None:
    first = TeacherTargets(_teacher(tiny_bert_path), tmp_path)
    first(TEXTS[:2])
    first.save()
    assert first.path is not None
    size = first.path.stat().st_size

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_SAVE, str(tiny_bert_path), str(tmp_path), str(2 * size)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGXFSZ, killed.stderr
    assert len(read_vectors(first.path)) == 2  # the old store, whole
    assert len(list(tmp_path.iterdir())) > 2  # the store, its lock and the killed save's copy

    again = TeacherTargets(_teacher(tiny_bert_path), tmp_path)
    again(TEXTS[2:4])
    again.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.path.name, f"{first.path.name}.lock"])
    assert len(read_vectors(first.path)) == 4


def test_a_store_file_cut_short_is_embedded_again_not_fatal(tiny_bert_path: Path, tmp_path: Path) -> None:
    first = TeacherTargets(_teacher(tiny_bert_path), tmp_path)
    first(TEXTS[:8])
    first.save()
    assert first.path is not None
    whole = first.path.read_bytes()
    first.path.write_bytes(whole[: len(whole) // 2])  # what a power loss can leave of a file it was writing

    again = TeacherTargets(_teacher(tiny_bert_path), tmp_path)
    assert again.loaded == 0
    again(TEXTS[:3])
    again.save()
    assert len(read_vectors(first.path)) == 3
