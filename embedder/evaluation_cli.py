"""``embedder validate``, ``embedder layers`` and ``embedder bench``.

Exit codes: 0 = passed (or nothing to gate), 1 = the gate failed (the failing tasks are printed) or the candidate
returned NaN or infinite embeddings (with or without a baseline: such a model cannot pass), 2 = bad arguments, a
model that cannot be loaded, a baseline with NaN or infinite embeddings, or a gate that could not check: a task named
with --tasks that neither model scored (its data is missing; --allow-skipped accepts that), or, on the default suite,
no task at all (the default suite leaves out, and lists, the tasks whose data is not installed).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from core.settings import Settings, get_settings

MODEL_HELP = (
    "built-in name (minilm-l6, minilm-l3, mpnet-base), a Hugging Face folder or training checkpoint, "
    "a bundle folder (with manifest.json) or registry:NAME[@VERSION]"
)


def _common(parser: argparse.ArgumentParser, *, fast_help: str, out_help: str) -> None:
    """The options every command has; ``--fast`` and ``--out`` mean something else to each, so each says what."""
    parser.add_argument("--fast", action="store_true", help=fast_help)
    parser.add_argument("--out", type=Path, help=out_help)
    parser.add_argument("--device", default=None, help="torch device for checkpoints (default: settings.device)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _setup_torch(device: str | None, settings: Settings) -> str:
    import torch

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    return device or settings.device


def _onnxruntime_load_errors() -> tuple[type[Exception], ...]:
    """What onnxruntime raises when it cannot open a graph (its own classes, none a subclass of OSError or
    ValueError): a corrupt or truncated file, a graph it cannot build or run here."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "InvalidProtobuf", "InvalidGraph", "NotImplemented",
             "RuntimeException", "EPFail", "ModelRequiresCompilation")  # fmt: skip
    return tuple(getattr(ort_state, name) for name in names if hasattr(ort_state, name))


def _load(spec: str, device: str, settings: Settings):  # type: ignore[no-untyped-def]
    """A checkpoint, built-in name or bundle → an evaluation model (the thin adapter the card puts here).

    A folder whose files cannot be read (a config.json without weights, a missing tokenizer, an unreadable bundle
    manifest, an ONNX graph onnxruntime cannot open) raises `ModelSpecError` naming the spec in one line, like a
    spec that names nothing: the commands exit 2 for it, which a gate reads as "could not load", not "failed"."""
    from core.registry import RegistryError
    from evaluation.embedding_model import ModelSpecError
    from training.torch_model import load_any

    try:
        model = load_any(spec, device=device, registry_dir=settings.registry_dir, threads=settings.num_threads)
    except ModelSpecError:
        raise
    except (OSError, RegistryError) as exc:
        raise ModelSpecError(f"cannot load model {spec!r}: {exc}") from exc
    except _onnxruntime_load_errors() as exc:
        message = " ".join(str(exc).split("\n"))
        raise ModelSpecError(f"cannot load model {spec!r}: {type(exc).__name__}: {message}") from exc
    if model.source is None:  # reports name the folder, not only its last part ("best" of runs/<run>/best)
        path = Path(spec).expanduser()
        model.source = str(path.resolve()) if path.exists() else spec
    return model


def validate_main(argv: list[str]) -> int:
    """``embedder validate MODEL [--baseline MODEL] [--max-drop 1.0] [--min-speedup X] [--tasks ...]``."""
    parser = argparse.ArgumentParser(
        prog="embedder validate",
        description="Run the offline suite, layer-wise curves, diagnostics and speed on MODEL (and BASELINE on "
        "the same tasks), write report.json/report.md/PNG plots, and exit 1 when a task drops more than "
        "--max-drop points or the speed floor is missed. Results are cached by model content hash.",
    )
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--baseline", help="model to compare against (same kinds of spec as MODEL)")
    parser.add_argument("--max-drop", type=float, default=1.0, help="largest allowed drop per task, in points")
    parser.add_argument(
        "--min-speedup",
        type=float,
        default=None,
        help="required throughput ratio vs the baseline (geometric mean over speed settings)",
    )
    parser.add_argument("--tasks", nargs="+", help="task names (default: all); see `embedder validate --list-tasks`")
    parser.add_argument(
        "--allow-skipped",
        action="store_true",
        help="let the gate pass although tasks named with --tasks were scored by neither model (their data is "
        "missing; they are still listed); without it such tasks make the gate exit 2. The default suite (no "
        "--tasks) always leaves out, and lists, the tasks whose data is not installed, and exits 2 only when it "
        "compared none",
    )
    parser.add_argument(
        "--layer-tasks",
        nargs="*",
        default=None,
        help="tasks for layer-wise curves (default: LeeDocSTS BBCNewsKNN; none to skip)",
    )
    parser.add_argument("--no-speed", action="store_true", help="skip the speed measurement")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip kNN 9:1, effective rank, alignment...")
    parser.add_argument("--no-cache", action="store_true", help="recompute instead of reusing cached results")
    parser.add_argument("--list-tasks", action="store_true", help="print the task names and exit")
    _common(
        parser,
        fast_help="a few documents per task and 2 timed calls per speed setting (smoke test; not comparable)",
        out_help="report folder (default: the bundle folder for a bundle, else <cache dir>/reports/<name>-<hash>)",
    )
    if "--list-tasks" in argv:
        from evaluation.tasks import INDEPENDENT_TASKS, TASKS

        print("\n".join(TASKS))
        print("\n# independent set (run only when named):\n" + "\n".join(INDEPENDENT_TASKS))
        return 0
    args = parser.parse_args(argv)
    from evaluation.gate import check_thresholds

    try:
        check_thresholds(args.max_drop, args.min_speedup, names=("--max-drop", "--min-speedup"))
    except ValueError as exc:
        print(f"embedder validate: {exc}", file=sys.stderr)
        return 2
    if args.min_speedup is not None and args.baseline is None:
        parser.error("--min-speedup compares throughput with a baseline: pass --baseline too")
    if args.min_speedup is not None and args.no_speed:
        parser.error("--min-speedup needs the speed measurement: drop --no-speed")
    settings = get_settings()
    device = _setup_torch(args.device, settings)
    from evaluation.embedding_model import ModelSpecError, NonFiniteEmbeddingError
    from evaluation.tasks import resolve_task
    from evaluation.validate import DEFAULT_LAYER_TASKS, prepare_out_dir, validate

    try:
        for name in (args.tasks or []) + (args.layer_tasks or []):
            resolve_task(name, fast=True)
        model = _load(args.model, device, settings)
        baseline = _load(args.baseline, device, settings) if args.baseline else None
        # --no-cache recomputes the scores; the report still goes where it would without it
        out = prepare_out_dir(args.out, model, settings.cache_dir)
    except (ModelSpecError, ValueError) as exc:
        print(f"embedder validate: {exc}", file=sys.stderr)
        return 2
    try:
        report, gate, written = validate(
            model,
            baseline,
            tasks=args.tasks,
            fast=args.fast,
            max_drop=args.max_drop,
            min_speedup=args.min_speedup,
            allow_skipped=args.allow_skipped or not args.tasks,  # the default suite: what the install holds
            layer_tasks=DEFAULT_LAYER_TASKS if args.layer_tasks is None else args.layer_tasks,
            speed=not args.no_speed,
            diagnostics=not args.no_diagnostics,
            out_dir=out,
            cache=None if args.no_cache else settings.cache_dir,
            progress=not args.quiet,
            command="embedder validate " + shlex.join(argv),
        )
    except NonFiniteEmbeddingError as exc:  # the candidate fails validation; a broken baseline leaves it unchecked
        role = "the candidate" if exc.model is model else "the baseline"
        print(f"embedder validate: {role}: {exc}", file=sys.stderr)
        return 1 if exc.model is model else 2
    if gate is not None:
        print(gate.format_table())
    else:
        cand = report["candidate"]
        for task, score in cand["scores"].items():
            print(f"{task:<34} {score:8.2f}")
        for task, reason in cand["skipped"].items():
            print(f"{task:<34} skipped: {reason}")
        for task, reason in cand.get("failed", {}).items():
            print(f"{task:<34} no score: {reason}")
    for role in ("candidate", "baseline"):
        if report.get(role):
            print(_domain_summary(role, report[role]))
    print(f"report: {written['report.md']}")
    if gate is not None and gate.could_not_check:
        print(
            f"not checked: {', '.join(gate.unchecked)} — scored by neither model (install the data as the table "
            "says" + (", or pass --allow-skipped to accept a gate without them)" if args.tasks else ")"),
            file=sys.stderr,
        )
        return 2
    if gate is not None and not gate.passed:
        print("failing: " + ", ".join(f.split(":")[0] for f in gate.failures), file=sys.stderr)
        return 1
    return 0


def _domain_summary(role: str, model_report: dict) -> str:
    """One line per model: the out-of-domain and in-domain averages and the corpora that split them."""
    from evaluation.report import describe_trained_on

    d = model_report["domains"]
    parts = []
    for label, part in (("out-of-domain", d["out_of_domain"]), ("in-domain", d["in_domain"])):
        average = "-" if part["average"] is None else f"{part['average']:.2f}"
        parts.append(f"{label} {average} ({len(part['tasks'])} tasks)")
    return f"{role} {model_report['model']['name']}: {', '.join(parts)}; trained on: {describe_trained_on(d)}"


def layers_main(argv: list[str]) -> int:
    """``embedder layers MODEL [--baseline MODEL] [--tasks ...]``: the layer-wise table and plot."""
    parser = argparse.ArgumentParser(
        prog="embedder layers",
        description="Score the pooled embedding of every layer (layer 0 = embeddings) on offline tasks, without "
        "fine-tuning, as in the cropping paper's Figure 4b: where to look for the layer l TMFT truncates at (the "
        "TMFT paper picks l by fine-tuning each truncation, its Figure 2).",
    )
    parser.add_argument("model", help="a torch model: built-in name or checkpoint folder (bundles have no layers)")
    parser.add_argument("--baseline", help="a second torch model on the same axes (e.g. before fine-tuning)")
    parser.add_argument("--tasks", nargs="+", default=["LeeDocSTS", "BBCNewsKNN"], help="tasks to score per layer")
    parser.add_argument("--no-cache", action="store_true", help="recompute instead of reusing cached results")
    _common(
        parser,
        fast_help="a few documents per task (smoke test; not comparable)",
        out_help="folder for layers.png and layers.json (default: <cache dir>/reports/<name>-<hash> of MODEL)",
    )
    args = parser.parse_args(argv)
    settings = get_settings()
    device = _setup_torch(args.device, settings)
    from evaluation.embedding_model import ModelSpecError
    from evaluation.report import plot_layers
    from evaluation.tasks import resolve_task
    from evaluation.validate import layer_curves, prepare_out_dir

    try:
        for name in args.tasks:
            resolve_task(name, fast=True)
        specs = [args.model] + ([args.baseline] if args.baseline else [])
        models = [_load(spec, device, settings) for spec in specs]
        for m in models:
            if not m.supports_layers:
                raise ValueError(f"{m.name} is an exported bundle: layer-wise scores need the torch checkpoint")
        out = prepare_out_dir(args.out, models[0], settings.cache_dir)
    except (ModelSpecError, ValueError) as exc:
        print(f"embedder layers: {exc}", file=sys.stderr)
        return 2
    from evaluation.embedding_model import NonFiniteEmbeddingError

    cache = None if args.no_cache else settings.cache_dir
    try:
        curves = {m.name: layer_curves(m, args.tasks, fast=args.fast, cache=cache, progress=not args.quiet)
                  for m in models}  # fmt: skip
    except NonFiniteEmbeddingError as exc:
        print(f"embedder layers: {exc}", file=sys.stderr)
        return 2
    for label, per_task in curves.items():
        for task, ys in per_task.items():
            best = max(range(len(ys)), key=ys.__getitem__)
            print(f"{label} {task} (best layer {best})")
            for layer, y in enumerate(ys):
                print(f"  layer {layer:>2}  {y:7.2f}" + ("  <- best" if layer == best else ""))
    plot_layers(curves, out / "layers.png", title="Layer-wise quality" + (" (fast mode)" if args.fast else ""))
    (out / "layers.json").write_text(json.dumps({"fast": args.fast, "curves": curves}, indent=1) + "\n")
    print(f"plot: {out / 'layers.png'}")
    return 0


def bench_main(argv: list[str]) -> int:
    """``embedder bench MODEL [MODEL ...]``: texts/s and p50 latency, batch 1 and 32, short and long texts."""
    parser = argparse.ArgumentParser(
        prog="embedder bench",
        description="Measure encode speed (tokenisation included) for each MODEL: texts/s and median latency "
        "per call, batch 1 and 32, short and long texts. Set EMBED_NUM_THREADS to fix torch's thread count.",
    )
    parser.add_argument("models", nargs="+", help=MODEL_HELP)
    parser.add_argument("--calls", type=int, default=24, help="timed calls per batch-1 setting (batch 32: calls/8)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the models in turn this many times and report each setting's median (a slow minute of a "
        "shared machine then falls on every model)",
    )
    _common(
        parser,
        fast_help="one warm-up and 2 timed calls per setting, whatever --calls says (smoke test; noisy numbers)",
        out_help="folder to write speed.json to (default: none; the table is only printed)",
    )
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    settings = get_settings()
    device = _setup_torch(args.device, settings)
    from evaluation.embedding_model import ModelSpecError
    from evaluation.gate import throughput_speedup
    from evaluation.speed import measure_speed, median_speed
    from evaluation.validate import prepare_out_dir

    models = {}
    try:
        for spec in args.models:
            model = _load(spec, device, settings)
            models[model.name] = model
        if args.out is not None:  # before measuring: a path that cannot be a folder is refused up front
            prepare_out_dir(args.out, model, settings.cache_dir)
    except (ModelSpecError, ValueError) as exc:  # ValueError: e.g. a bundle whose manifest lists no graph
        print(f"embedder bench: {exc}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            runs[name].append(measure_speed(model, calls=args.calls, fast=args.fast, progress=not args.quiet))
    results = {name: median_speed(measured) for name, measured in runs.items()}
    width = max(24, *(len(name) for name in results))
    print(f"{'model':<{width}} {'setting':<10} {'texts/s':>9} {'p50 ms':>9}")
    for name, speed in results.items():
        for row in speed["settings"]:
            print(f"{name:<{width}} {row['setting']:<10} {row['texts_per_s']:>9.1f} {row['p50_ms']:>9.1f}")
    first, *others = results
    for name in others:  # the ratio a speed target is judged by, against the first model measured in the same run
        ratio = throughput_speedup({"speed": results[name]}, {"speed": results[first]})
        print(f"{name}: {ratio:.2f}x {first}'s texts/s (geometric mean over the settings"
              f"{f', medians of {args.rounds} rounds' if args.rounds > 1 else ''})")  # fmt: skip
    if args.out:
        (args.out / "speed.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0
