"""A run's output folder after its recipe's write was killed half-way: the run can still be resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from core.model_folder import RECIPE_FILE
from training.config import TrainConfig
from training.run_folder import prepare_output
from training.state import resume_conflicts

ROOT = Path(__file__).resolve().parents[2]

# Records the recipe again, as a resumed run does, in a process that dies (SIGXFSZ: the file size limit, which
# Python ignores unless told otherwise) at the write that goes past ``limit`` bytes: a kill in the middle of a write.
KILLED_MID_WRITE = """
import json, resource, signal, sys
from pathlib import Path
from training.config import from_dict
from training.run_folder import prepare_output
config = from_dict(json.loads(sys.argv[1]))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
prepare_output(config, config.resolved_output_dir, fresh=False)
"""


def _config(tmp_path: Path) -> TrainConfig:
    return TrainConfig(name="run", model=str(tmp_path / "model"), corpus=("lee_background",),
                       output_dir=str(tmp_path / "run"), resume=True)  # fmt: skip


def test_a_recipe_write_killed_half_way_leaves_the_recorded_recipe_whole(tmp_path: Path) -> None:
    config = _config(tmp_path)
    out = config.resolved_output_dir
    prepare_output(config, out, fresh=True)
    recorded = (out / RECIPE_FILE).read_text()
    limit = len(recorded) // 3

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, json.dumps(config.to_dict()), str(limit)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert killed.returncode == -signal.SIGXFSZ, killed.stderr
    assert (out / RECIPE_FILE).read_text() == recorded
    assert resume_conflicts(config, out / RECIPE_FILE) == []  # what a resume reads first
