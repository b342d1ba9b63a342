"""The `embedder` command: the top floor, wiring the packages below together. Each subcommand is imported
only when it runs, so `embedder serve` never imports torch and `embedder models list` starts fast."""

from __future__ import annotations

import importlib
import os
import sys

# name -> ("module:function", one-line help). The function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("embedder.models_cli:main", "list, prepare and locate the built-in offline models"),
    "registry": (
        "embedder.registry_cli:main",
        "a model's versions in the registry: list them, promote one (rollback), prune old ones",
    ),
    "export": ("export.cli:main", "export a model to a parity-checked ONNX bundle (optionally int8) in the registry"),
    "adapt": ("embedder.adapt_cli:main", "submit a corpus to a server's /adapt, follow the job (--student: compact)"),
    "adapt-worker": ("adapt_worker.worker:main", "run queued /adapt jobs (the service starts and supervises this)"),
    "serve": ("service.cli:main", "serve promoted bundles over HTTP (OpenAI/TEI routes, metrics); see --help"),
    "train": ("training.cli:main", "train an embedder from a TOML recipe (sct-tiny, tmft, crop-mpnet, ...)"),
    "validate": (
        "embedder.evaluation_cli:validate_main",
        "offline suite, report, plots; gate vs a baseline (exit 1 on a drop)",
    ),
    "layers": (
        "embedder.evaluation_cli:layers_main",
        "score every layer's pooled embedding (TMFT: pick the layer to keep)",
    ),
    "bench": (
        "embedder.evaluation_cli:bench_main",
        "encode speed: texts/s and p50 latency, batch 1/32, short/long texts",
    ),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: embedder COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `embedder COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _run(argv)
    except BrokenPipeError:  # the reader of stdout went away (`embedder models list | head -1`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command stopped by a closed pipe


def _run(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"embedder: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, func_name = COMMANDS[name][0].partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
