"""`embedder train` refuses bad recipe values with one line on stderr and exit code 2, before or while building
the run: models that resolve to nothing, objective parameters the objective does not take, an output folder that
cannot be created, a device that is not there. A run that diverges ends in one line too (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.test_trainer import assert_same_weights, weights
from training.cli import main as train_main
from training.config import ConfigError, TrainConfig, load_config

REPO = Path(__file__).resolve().parents[2]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *, lines: int = 1) -> str:
    """Run the CLI, check it exits 2 with ``lines`` lines on stderr and no traceback, and return the first line
    (a model that names nothing is followed by the list of built-in models)."""
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("embedder train: ") and "Traceback" not in err
    assert len(err.splitlines()) == lines if lines == 1 else len(err.splitlines()) >= lines
    return err.splitlines()[0]


def _setting(key: str, value: object) -> list[str]:
    return ["--set", f"{key}={json.dumps(value)}"]


def _tiny_run(tmp_path: Path, model: Path) -> list[str]:
    return ["-q", *_setting("model", str(model)), *_setting("output_dir", str(tmp_path / "out"))]


def test_a_model_that_names_nothing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nonexistent")
    argv = ["crop-minilm", "-q", *_setting("model", missing), *_setting("output_dir", str(tmp_path / "out"))]
    line = _refused(argv, capsys, lines=2)
    assert line.startswith(f"embedder train: model: '{missing}' is neither a built-in model")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_teacher_that_names_nothing_is_refused(
    tmp_path: Path, tiny_bert6_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nonexistent")
    argv = ["sct-tiny", *_tiny_run(tmp_path, tiny_bert6_path), *_setting("teacher", missing)]
    assert _refused(argv, capsys, lines=2).startswith(f"embedder train: teacher: '{missing}' is neither")


def test_an_objective_parameter_the_objective_does_not_take_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["crop-minilm", "--set", "objective_params.foo=1"], capsys)
    assert "objective_params.foo is not a parameter of objective 'infonce'" in line
    assert line.endswith("it takes symmetric, temperature")
    line = _refused(["crop-minilm", "--set", "objective_params.temprature=0.1", "--print-config"], capsys)
    assert "(did you mean 'temperature'?)" in line


def test_another_objective_on_a_recipe_says_how_to_drop_the_recipes_objective_parameters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # crop-minilm sets infonce's temperature; a --set cannot remove one key, only replace the table
    line = _refused(["crop-minilm", "--set", "objective=vicreg", "--print-config"], capsys)
    assert "objective_params.temperature is not a parameter of objective 'vicreg'" in line
    assert "--set 'objective_params={}'" in line
    cleared = ["--set", "objective_params={}", "--print-config"]
    assert train_main(["crop-minilm", "--set", "objective=vicreg", *cleared]) == 0


def test_an_objective_parameter_of_the_wrong_type_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["crop-minilm", "--set", "objective_params.temperature=abc"], capsys)
    assert line.endswith("objective_params.temperature expects a number, got 'abc'")
    line = _refused(["sct-tiny", "--set", "objective_params.queue_size=1.5", "--print-config"], capsys)
    assert line.endswith("objective_params.queue_size expects an integer, got 1.5")


def test_an_objective_parameter_the_objective_refuses_is_reported(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    sentence = "Sentence {j} of document {i} is long enough to be cropped, with detail about rivers and their fish."
    docs = [" ".join(sentence.format(i=i, j=j) for j in range(4)) for i in range(12)]
    corpus.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    argv = ["crop-minilm", *_tiny_run(tmp_path, tiny_bert_path), *_setting("corpus", str(corpus))]
    argv += ["--set", "objective_params.temperature=-1", "--set", "validation=none", "--set", "batch_size=4"]
    line = _refused(argv, capsys)
    assert line.startswith("embedder train: objective 'infonce' refuses its objective_params: temperature must be > 0")


def test_objective_parameters_are_checked_when_the_config_is_built() -> None:
    with pytest.raises(ConfigError, match=r"objective_params\.tau is not a parameter of objective 'sct'"):
        TrainConfig(objective="sct", views="texts", objective_params={"tau": 0.1})
    with pytest.raises(ConfigError, match=r"objective_params\.symmetric expects true or false, got 1"):
        load_config("crop-minilm", ["objective_params.symmetric=1"])
    assert load_config("crop-minilm", ["objective_params.temperature=1"]).objective_params == {"temperature": 1}


def test_an_output_dir_that_cannot_be_created_is_refused(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "out"
    argv = ["crop-minilm", "-q", *_setting("model", str(tiny_bert_path)), *_setting("output_dir", str(out))]
    line = _refused(argv, capsys)
    assert line.startswith(f"embedder train: output_dir '{out}' cannot be created (")
    assert line.endswith("set output_dir to a writable folder")


def test_an_output_dir_with_unknown_braces_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["crop-minilm", "--set", "output_dir=runs/{nam}", "--print-config"], capsys)
    assert line.endswith("output_dir may hold {name} and no other braces, got 'runs/{nam}'")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("max_steps=[1]", "config key 'max_steps' expects an integer or none, got [1]"),
        ("lr=fast", "config key 'lr' expects a number, got 'fast'"),
        ("student_layers=[0, 'a']", "config key 'student_layers' expects a list of integers, got [0, 'a']"),
        ("corpus=3", "config key 'corpus' expects a string or a list of strings, got 3"),
        ("progress_bar=1", "config key 'progress_bar' expects true or false, got 1"),
    ],
)
def test_type_errors_say_what_the_key_takes_in_words(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _refused(["crop-minilm", "--set", setting, "--print-config"], capsys) == f"embedder train: {message}"


def test_held_out_documents_too_few_for_crop_pairs_are_refused(
    tmp_path: Path, tiny_bert6_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    text = "Document {} starts here. It has a second sentence. And a third one too. The fourth closes it."
    corpus.write_text("".join(json.dumps({"text": text.format(i)}) + "\n" for i in range(30)))
    argv = ["crop-minilm", *_tiny_run(tmp_path, tiny_bert6_path), *_setting("corpus", str(corpus)),
            *_setting("max_validation_documents", 1), *_setting("max_steps", 1)]  # fmt: skip
    line = _refused(argv, capsys)
    assert "HeldOutCropPairs: only 1 of 1 documents have two crops" in line


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda", "device 'cuda' requested but CUDA is not available: set device = 'cpu'"),
        ("gpu", "device 'gpu': "),
    ],
)
def test_a_device_that_cannot_run_is_refused_before_any_work(
    device: str, message: str, tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    line = _refused(["crop-minilm", *_tiny_run(tmp_path, tiny_bert_path), *_setting("device", device)], capsys)
    assert line.startswith(f"embedder train: {message}")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def _tiny_corpus_file(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    sentence = "Sentence {j} of document {i} is long enough to be cropped, with detail about rivers and their fish."
    docs = [" ".join(sentence.format(i=i, j=j) for j in range(4)) for i in range(24)]
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return corpus


def _tiny_corpus_run(tmp_path: Path, model: Path) -> list[str]:
    """crop-minilm on the tiny model and a 24-document corpus, a quarter held out, batches of 4 crops of 32 tokens."""
    argv = ["crop-minilm", *_tiny_run(tmp_path, model), *_setting("corpus", str(_tiny_corpus_file(tmp_path)))]
    return [*argv, *_setting("validation_fraction", 0.25), *_setting("batch_size", 4), *_setting("max_seq_length", 32)]


def test_a_batch_larger_than_the_corpus_is_one_line(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused([*_tiny_corpus_run(tmp_path, tiny_bert_path), *_setting("batch_size", 64)], capsys)
    assert "fewer than batch_size=64" in line


def test_a_diverged_run_is_one_line_that_points_at_the_best_model(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_tiny_corpus_run(tmp_path, tiny_bert_path), *_setting("lr", 1e12)]
    argv += [*_setting("eval_every", 2), *_setting("max_steps", 4), "--set", "time_budget_s=none"]
    assert train_main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("embedder train: ") and "lower lr" in line
    assert line.endswith(f"the best model so far is in {tmp_path / 'out' / 'best'}")


def test_a_resume_that_changes_what_the_checkpoint_trained_is_refused(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _tiny_corpus_run(tmp_path, tiny_bert_path)
    argv += [*_setting("eval_every", 0), "--set", "time_budget_s=none"]
    assert train_main([*argv, *_setting("max_steps", 2)]) == 0
    capsys.readouterr()
    resume = [*argv, *_setting("resume", True)]
    line = _refused([*resume, *_setting("max_steps", 3), *_setting("batch_size", 6), *_setting("seed", 1)], capsys)
    assert line.startswith(f"embedder train: cannot resume {tmp_path / 'out'}: its checkpoint was trained with ")
    assert "(batch_size = 4 → 6; seed = 0 → 1)" in line
    # how long the run goes on, and how often it validates, are what a resumed run may change
    assert train_main([*resume, *_setting("max_steps", 3), *_setting("eval_every", 1)]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3


def test_a_resume_without_a_checkpoint_says_it_starts_a_new_run(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _tiny_corpus_run(tmp_path, tiny_bert_path)
    argv += [*_setting("max_steps", 1), *_setting("resume", True), "--set", "time_budget_s=none"]
    assert train_main(argv) == 0
    assert f"no checkpoint in {tmp_path / 'out'} to resume: starting a new run" in capsys.readouterr().err


def test_a_cache_that_cannot_take_a_model_is_one_line(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in model prepared into a full or read-only cache (``EMBED_CACHE_DIR``) ends in the catalog's message,
    exit 1, not a traceback."""
    from core.catalog import CacheWriteError
    from training import trainer

    def full(*args: object, **kwargs: object) -> None:
        raise CacheWriteError("cannot write minilm-l3 into /cache: No space left on device; free space there")

    monkeypatch.setattr(trainer, "train", full)
    assert train_main(_tiny_corpus_run(tmp_path, tiny_bert_path)) == 1
    err = capsys.readouterr().err
    assert err == "embedder train: cannot write minilm-l3 into /cache: No space left on device; free space there\n"


def test_help_and_a_recipe_mistake_answer_before_torch_is_imported() -> None:
    """``embedder train --help`` took 8-10 s on a 2-core machine, all of it importing torch, transformers and mteb."""
    import subprocess
    import sys

    code = """
import sys
from training.cli import main
code = main(["no-such-recipe"])
heavy = sorted(m for m in ("torch", "transformers", "mteb") if m in sys.modules)
print("EXIT", code, "HEAVY", heavy)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "EXIT 2 HEAVY []" in result.stdout, result.stdout + result.stderr
    assert "recipe 'no-such-recipe' is neither a file nor a built-in recipe" in result.stderr


# Ctrl-C is raised in a child process: a signal handled among the threads and native libraries an hour of other
# tests has left in this process would test them, not the command.
CTRL_C_DURING_VALIDATION = """
import json, signal, sys
from training.cli import main
from training.validation import CropPairValidation

signals, evaluate, calls = int(sys.argv[1]), CropPairValidation.evaluate, []

def interrupted(self, encoder):
    calls.append(1)
    if len(calls) == 1:
        for _ in range(signals):
            signal.raise_signal(signal.SIGINT)
        if signals > 1:
            raise AssertionError("the second Ctrl-C did not abort")
    return evaluate(self, encoder)

CropPairValidation.evaluate = interrupted
code = main(json.loads(sys.argv[2]))
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the caller's handler is not back"
sys.exit(code)
"""


def _ctrl_c_during_validation(argv: list[str], signals: int) -> subprocess.CompletedProcess[str]:
    """The train command in a child process whose first validation receives ``signals`` Ctrl-C (SIGINT)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(  # the child's SIGINT starts as Python's default handler, whatever this process has
        [sys.executable, "-c", "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
         f"exec({CTRL_C_DURING_VALIDATION!r})", str(signals), json.dumps(argv)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_ctrl_c_stops_the_run_at_a_checkpoint_that_resume_continues_exactly(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during the first validation: the run stops before its first step, checkpointed, exit 130; resuming
    it ends where an uninterrupted run does, with the same weights."""
    argv = [*_tiny_corpus_run(tmp_path, tiny_bert_path), *_setting("eval_every", 2), *_setting("max_steps", 4)]
    argv += ["--set", "time_budget_s=none"]
    straight = [*argv, *_setting("output_dir", str(tmp_path / "straight"))]
    assert train_main(straight) == 0
    scores = [line for line in capsys.readouterr().err.splitlines() if "validation score" in line]
    assert [line.split(":")[0] for line in scores] == ["step 0", "step 2", "step 4"]
    assert scores[0].endswith("(best so far: saved to best/)")

    stopped = _ctrl_c_during_validation(argv, signals=1)
    assert stopped.returncode == 130, stopped.stderr
    assert json.loads(stopped.stdout)["steps"] == 0 and json.loads(stopped.stdout)["stopped_by"] == "cancelled"
    assert "stopped at step 0 by Ctrl-C; --set resume=true continues the run" in stopped.stderr
    assert train_main([*argv, *_setting("resume", True)]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    assert_same_weights(weights(tmp_path / "out" / "final"), weights(tmp_path / "straight" / "final"), atol=0)


def test_a_second_ctrl_c_aborts_at_once(tmp_path: Path, tiny_bert_path: Path) -> None:
    argv = [*_tiny_corpus_run(tmp_path, tiny_bert_path), *_setting("eval_every", 2), *_setting("max_steps", 4)]
    aborted = _ctrl_c_during_validation(argv, signals=2)
    assert aborted.returncode == 130, aborted.stderr
    assert aborted.stderr.splitlines()[-1] == "embedder train: aborted"  # and the caller's handler is back (child)


def test_resuming_a_run_that_has_ended_says_so(
    tmp_path: Path, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*_tiny_corpus_run(tmp_path, tiny_bert_path), *_setting("max_steps", 2), "--set", "time_budget_s=none"]
    assert train_main(argv) == 0
    capsys.readouterr()
    assert train_main([*argv, *_setting("resume", True)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"] == 2
    assert captured.err.splitlines() == [
        f"embedder train: the run in {tmp_path / 'out'} had already ended (max_steps at step 2): nothing was "
        "trained; raise max_steps to go on"
    ]
