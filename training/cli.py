"""`embedder train RECIPE [--set key=value ...]`: run a training recipe from a TOML file or a built-in name."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from core.catalog import CacheWriteError, ModelNotFoundError, resolve_model
from core.settings import get_settings
from core.text import CorpusError
from training.config import RECIPES_DIR, ConfigError, TrainConfig, load_config

# torch, transformers and mteb (the modules below import them) take seconds to import: `--help`, `--print-config`
# and a recipe's mistakes answer before they are loaded


def _parser() -> argparse.ArgumentParser:
    builtin = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
    parser = argparse.ArgumentParser(
        prog="embedder train",
        description="Train an embedder from a TOML recipe. The selected model is written to OUTPUT_DIR/best "
        "(an HF folder sentence-transformers and `embedder export` load as is).",
    )
    parser.add_argument("recipe", help=f"a recipe .toml file or a built-in recipe name ({builtin})")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe field (TOML value syntax: lr=1e-4, student_layers=[0,5], output_dir=runs/x, "
        "objective_params.temperature=0.1); repeatable",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return parser


def _missing_model(config: TrainConfig) -> str | None:
    """The first model the run loads (``model``, the ``teacher`` of a teacher objective, the ``rehearsal_model``)
    that names neither a built-in model nor a model folder, as a message naming the key; else None."""
    from training.assembly import needs_reference

    keys = ["model"]
    if needs_reference(config):
        keys.append("teacher")
    if config.rehearsal_weight > 0:
        keys.append("rehearsal_model")
    for key in keys:
        name = getattr(config, key)
        if name is None:
            continue
        try:
            resolve_model(name)
        except ModelNotFoundError as exc:
            return f"{key}: {exc}"
    return None


def _unusable_device(name: str) -> str | None:
    """Why the run cannot use the torch device ``name`` (a recipe's ``device``, else ``EMBED_DEVICE``), else None."""
    from training.assembly import resolve_device

    try:
        resolve_device(name)
    except (ValueError, RuntimeError) as exc:  # RuntimeError: a name torch does not know ("gpu")
        return str(exc) if "CUDA" in str(exc) else f"device {name!r}: {exc}"
    return None


def _unwritable_output(out: Path) -> str | None:
    """Why the run cannot write into ``out`` (created here when missing), else None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"output_dir {str(out)!r} cannot be created ({exc.strerror or exc}): set output_dir to a writable folder"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"output_dir {str(out)!r} is not writable: set output_dir to a writable folder"
    return None


# the setting that ended a run, by ``stopped_by``: what a resumed run raises to go on
_LIMITS = {"max_steps": "max_steps", "epochs": "epochs", "time_budget": "time_budget_s",
           "early_stopping": "early_stopping_patience"}  # fmt: skip

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT)


class _StopOnInterrupt:
    """The SIGINT handler of a run: the first Ctrl-C asks the run to stop before its next step (it then validates,
    checkpoints and saves ``final/``, so ``--set resume=true`` continues it exactly); a second one aborts at once."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write("embedder train: stopping after this step and saving a checkpoint (Ctrl-C again to abort)",
                   file=sys.stderr)  # fmt: skip


def _show_validation(record: dict[str, Any]) -> None:
    """Print each validation's score above the progress bar (the bar shows the training loss only)."""
    if record["kind"] == "eval":
        best = " (best so far: saved to best/)" if record.get("best") else ""
        tqdm.write(f"step {record['step']}: validation score {record['score']:.4g}{best}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = list(args.overrides) + (["progress_bar=false"] if args.quiet else [])
    try:
        config = load_config(args.recipe, overrides)
    except ConfigError as exc:
        print(f"embedder train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    from evaluation.tasks.crops import TooFewCropPairs
    from training.state import BEST_DIR, STATE_FILE
    from training.trainer import train

    settings = get_settings()  # a recipe's own device / num_threads still win
    device = str(config.device or settings.device)
    problem = _unusable_device(device) or _missing_model(config) or _unwritable_output(config.resolved_output_dir)
    if problem:
        print(f"embedder train: {problem}", file=sys.stderr)
        return 2
    out = config.resolved_output_dir
    if config.resume and not (out / "checkpoint" / STATE_FILE).is_file():
        print(f"embedder train: no checkpoint in {out} to resume: starting a new run", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = _StopOnInterrupt()
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may install a signal handler
    previous = signal.signal(signal.SIGINT, stop) if in_main_thread else None
    try:
        result = train(
            config, progress=_show_validation, should_stop=lambda: stop.requested, device=device,
            threads=settings.num_threads, cache_dir=settings.cache_dir,
        )  # fmt: skip
    except KeyboardInterrupt:
        checkpoint = out / "checkpoint"
        where = f"; --set resume=true continues from the last checkpoint in {checkpoint}" if checkpoint.is_dir() else ""
        print(f"embedder train: aborted{where}", file=sys.stderr)
        return INTERRUPTED
    # a corpus that names nothing readable or holds too little, a model name that resolves to no folder, objective
    # parameters the objective refuses, held-out documents too few or short for crop pairs, a batch larger than an
    # epoch, layers the model does not have, a checkpoint of another model or trained with other settings (`train`
    # refuses such a resume before any work): the recipe's to fix
    except (CorpusError, ModelNotFoundError, ConfigError, TooFewCropPairs, ValueError) as exc:
        print(f"embedder train: {exc}", file=sys.stderr)
        return 2
    except CacheWriteError as exc:  # the model cache cannot take a model the run prepares: the message says what to do
        print(f"embedder train: {exc}", file=sys.stderr)
        return 1
    except FloatingPointError as exc:  # the run diverged: the message says which setting to lower
        kept = config.resolved_output_dir / BEST_DIR
        print(f"embedder train: {exc}" + (f"; the best model so far is in {kept}" if kept.is_dir() else ""),
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    print(
        json.dumps(
            {
                "best_dir": str(result.best_dir),
                "final_dir": str(result.final_dir),
                "steps": result.steps,
                "elapsed_s": round(result.elapsed, 1),
                "best_step": result.best_step,
                "best_score": result.best_score,
                "layers": result.layers,
                "stopped_by": result.stopped_by,
            },
            indent=2,
        )
    )
    if result.already_ended:
        print(f"embedder train: the run in {out} had already ended ({result.stopped_by} at step {result.steps}): "
              f"nothing was trained; raise {_LIMITS.get(result.stopped_by, 'max_steps')} to go on",
              file=sys.stderr)  # fmt: skip
    if result.stopped_by == "cancelled":
        print(f"embedder train: stopped at step {result.steps} by Ctrl-C; --set resume=true continues the run",
              file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
