"""`embedder registry list [NAME] | promote NAME VERSION | prune NAME --keep N [--dry-run]`: the model registry's
versions — what each is, which one is served, a rollback, and removing old ones (`core.registry`; no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core import registry
from core.settings import add_registry_flag, get_settings

PROG = "embedder registry"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    add_registry_flag(common)
    common.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of text")
    sub = parser.add_subparsers(dest="action", required=True)
    p_list = sub.add_parser(
        "list", parents=[common], help="every model and its versions, or one model's versions in detail"
    )
    p_list.add_argument("name", nargs="?", help="one model name (default: every model in the registry)")
    p_promote = sub.add_parser(
        "promote",
        parents=[common],
        help="serve an existing version (an older one too: a rollback); replicas switch without a restart",
    )
    p_promote.add_argument("name")
    p_promote.add_argument("version")
    p_prune = sub.add_parser(
        "prune",
        parents=[common],
        help="remove versions older than the newest N (never the current one or one being published)",
    )
    p_prune.add_argument("name")
    p_prune.add_argument("--keep", type=int, required=True, help="how many of the newest versions stay (at least 1)")
    p_prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    p_prune.add_argument(
        "--min-age",
        type=float,
        default=registry.PRUNE_GRACE_SECONDS,
        metavar="SECONDS",
        help="keep versions published less than this many seconds ago: their publisher may not have promoted them "
        f"yet (default {registry.PRUNE_GRACE_SECONDS:g})",
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    root = args.registry if args.registry is not None else get_settings().registry_dir
    try:
        if args.action == "list":
            return _list(root, args.name, as_json=args.json)
        if args.action == "promote":
            return _promote(root, args.name, args.version, as_json=args.json)
        return _prune(root, args.name, args.keep, dry_run=args.dry_run, min_age=args.min_age, as_json=args.json)
    except (registry.RegistryError, OSError) as err:
        print(f"{PROG} {args.action}: {err}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------------------------------- list
def _model(root: Path, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "current": registry.current_version(root, name),
        "versions": [registry.version_summary(root, name, v) for v in registry.list_versions(root, name)],
        "publishing": registry.publishing_versions(root, name),
    }


def _list(root: Path, name: str | None, *, as_json: bool) -> int:
    if name is not None:
        registry.validate_name(name)
        if name not in registry.model_names(root):
            names = ", ".join(registry.model_names(root)) or "none"
            raise registry.RegistryError(f"no model {name!r} in registry {root} (models: {names})")
    models = [_model(root, n) for n in ([name] if name else registry.model_names(root))]
    if as_json:
        print(json.dumps({"registry": str(root), "models": models}, indent=2))
        return 0
    if not models:
        print(f"no models in registry {root}")
        return 0
    if name is None:
        _print_overview(root, models)
    else:
        _print_versions(root, models[0])
    return 0


def _print_overview(root: Path, models: list[dict[str, Any]]) -> None:
    rows = [["NAME", "CURRENT", "VERSIONS", "SIZE", "PUBLISHING"]]
    for model in models:
        versions = [v["version"] for v in model["versions"]]
        rows.append([
            model["name"],
            model["current"] or "-",
            _ranges(versions) or "-",
            _bytes(sum(v["size_bytes"] for v in model["versions"])),
            ", ".join(model["publishing"]) or "-",
        ])  # fmt: skip
    print(f"registry {root}")
    _table(rows)
    print(f"\n`{PROG} list NAME` shows what each version is.")


def _print_versions(root: Path, model: dict[str, Any]) -> None:
    rows = [["VERSION", "", "CREATED", "BASE", "METHOD", "QUANT", "GATE", "SIZE"]]
    for v in model["versions"]:
        rows.append([
            v["version"],
            "current" if v["current"] else ("BROKEN" if v["problem"] else ""),
            _when(v["created_at"]),
            str(v["base_model"] or "-"),
            str(v["method"] or "-"),
            str(v["quantization"] or "-"),
            _gate(v["validation"]),
            _bytes(v["size_bytes"]),
        ])  # fmt: skip
    for version in model["publishing"]:
        rows.append([version, "publishing", "-", "-", "-", "-", "-", "-"])
    print(f"{model['name']} in registry {root}")
    if len(rows) == 1:
        print("  no published version")
        return
    _table(rows)
    for v in model["versions"]:
        if v["problem"]:
            print(f"version {v['version']}: {v['problem']}")
    if model["current"] is None:
        print(f"no version is current: `{PROG} promote {model['name']} VERSION` serves one")


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _ranges(versions: list[str]) -> str:
    """``1-3, 5`` for versions 1, 2, 3, 5."""
    numbers, spans = sorted(int(v) for v in versions), []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _when(created_at: str | None) -> str:
    return created_at.replace("T", " ")[:16] if created_at else "-"


def _gate(validation: dict[str, Any] | None) -> str:
    """``passed ShortPieceRetrieval-heldout 61.20→70.30`` from an /adapt job's gate; ``-`` without one."""
    if not validation:
        return "-"
    verdict = {True: "passed", False: "FAILED"}.get(validation["gate_passed"], "?")
    row = validation["decided_on_score"]
    if not row or row.get("baseline") is None or row.get("candidate") is None:
        return verdict
    return f"{verdict} {row['task']} {row['baseline']:.2f}→{row['candidate']:.2f}"


def _bytes(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------------- promote
def _promote(root: Path, name: str, version: str, *, as_json: bool) -> int:
    before = registry.make_current(root, name, version)
    if as_json:
        print(json.dumps({"name": name, "version": version, "previous": before, "changed": before != version}))
    elif before == version:
        print(f"{name}: version {version} is already current; nothing changed")
    else:
        older = before is not None and before.isdigit() and int(before) > int(version)
        what = f"rolled back from version {before}" if older else f"was {before or 'none'}"
        print(f"{name}: version {version} is current ({what}); servers switch to it at their next registry poll "
              "(EMBED_REGISTRY_POLL_SECONDS), without a restart")  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------------- prune
def _prune(root: Path, name: str, keep: int, *, dry_run: bool, min_age: float, as_json: bool) -> int:
    result = registry.prune(root, name, keep, dry_run=dry_run, grace_seconds=min_age)
    if as_json:
        print(json.dumps(result.as_dict()))
        return 0
    verb = "would remove" if dry_run else "removed"
    if result.removed:
        freed = "would free" if dry_run else "freed"
        print(f"{name}: {verb} version{'s' if len(result.removed) > 1 else ''} {', '.join(result.removed)} "
              f"({_bytes(result.freed_bytes)} {freed})")  # fmt: skip
    else:
        print(f"{name}: nothing to remove")
    for version, why in result.kept.items():
        print(f"  kept {version}: {why}")
    for version in result.publishing:
        print(f"  left {version}: still being published")
    return 0
