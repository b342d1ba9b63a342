"""`embedder train RECIPE [--set key=value ...]`: run a training recipe from a TOML file or a built-in name."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from core.settings import get_settings
from core.text import CorpusError
from training.config import RECIPES_DIR, ConfigError, load_config
from training.trainer import train


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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()  # a recipe's own device / num_threads still win
    try:
        result = train(config, device=settings.device, threads=settings.num_threads, cache_dir=settings.cache_dir)
    except CorpusError as exc:  # a corpus that names nothing readable or holds too little: the recipe's to fix
        print(f"embedder train: {exc}", file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
