"""`embedder export MODEL --layers L --quantize {none,int8,auto} --name NAME --registry DIR [--promote]`."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from core.model_folder import POOLING_MODES
from core.settings import add_registry_flag, get_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedder export",
        description=(
            "Export a model to an ONNX bundle (pooling and L2 normalisation inside the graph), check "
            "parity against torch on a fixed probe set, and publish it as a new version in the registry."
        ),
    )
    parser.add_argument("model", help="a built-in model name (minilm-l6, minilm-l3, mpnet-base) or a model folder")
    parser.add_argument("--name", required=True, help="bundle name in the registry (lower-case slug)")
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="keep the embedding layer and the first L transformer layers (default: all); "
        "fewer layers are faster at some cost in quality",
    )
    parser.add_argument(
        "--quantize",
        choices=["none", "int8", "auto"],
        default="auto",
        help="auto (default, as the server's own default bundle): also write a dynamically quantised graph — each "
        "of optimum's CPU presets is tried and the fastest that keeps cosine to torch ≥ 0.99 mean / 0.97 min on "
        "this CPU, in length-sorted and mixed-length batches, is kept, else fp32 only; the service re-checks it on "
        "its own CPU and serves fp32 where it misses (1.4-2.4x fp32's texts/s on the CPUs in docs/BENCHMARKS.md, "
        "for ~20 s more export). int8: "
        "the same, but fail if no preset keeps the bars. none: fp32 only",
    )
    add_registry_flag(parser)
    parser.add_argument("--promote", action="store_true", help="make this version the one served (<name>/current)")
    parser.add_argument(
        "--pooling", choices=POOLING_MODES, default=None,
        help="override the model's pooling",
    )  # fmt: skip
    parser.add_argument("--parent", default=None, help="the bundle this derives from, e.g. minilm-l6@2")
    return parser


class _Stopped(BaseException):
    """SIGTERM during an export, raised where the export is so that its clean-up runs (a BaseException: no
    ``except Exception`` of a library on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """Turn SIGTERM into `_Stopped` while the export runs. Python's default for SIGTERM ends the process at once,
    leaving the export's temporary folder (the traced, optimised and quantised graphs: hundreds of MB) behind, and
    a copy half made into the registry; this is what a service stopping, ``kill`` or a container's stop sends."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    registry_dir = args.registry if args.registry is not None else settings.registry_dir

    from core.catalog import ChecksumError, ModelNotFoundError
    from core.registry import RegistryError, current_version
    from core.runtime import cpu_text
    from export.bundle import export_bundle  # imports torch: only once the arguments are known to be valid
    from export.parity import ParityError

    if settings.num_threads is not None:
        import torch

        torch.set_num_threads(settings.num_threads)
    try:
        with _stopped_by_sigterm():
            bundle = export_bundle(
                args.model,
                registry_dir,
                args.name,
                layers=args.layers,
                quantize=args.quantize,
                promote=args.promote,
                parent=args.parent,
                pooling=args.pooling,
            )
    except (ParityError, RegistryError, ModelNotFoundError, ChecksumError, ValueError, OSError) as err:
        print(f"embedder export: {err}", file=sys.stderr)
        return 1
    except _Stopped as stop:
        print(f"embedder export: stopped by {stop.signal_name} before it finished", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:  # Ctrl-C: the export cleaned up on its way out
        print("embedder export: stopped by SIGINT before it finished", file=sys.stderr)
        return 128 + signal.SIGINT
    manifest = json.loads((bundle / "manifest.json").read_text())
    print(bundle)
    parity = manifest["parity"]
    if manifest.get("int8"):
        cpu = cpu_text(manifest["int8"]["checked_on"])
        if manifest["int8"]["chosen"] is not None:
            print(f"int8 setting: {manifest['int8']['chosen']} (checked on {cpu})")
        else:  # --quantize auto published fp32 alone
            print(f"int8: none kept the parity bars; serving fp32 (checked on {cpu})")
    for variant in manifest["onnx"]:
        figures = parity[variant]
        print(
            f"parity {variant}: min cosine {figures['min_cosine']:.6f}, mean cosine {figures['mean_cosine']:.6f}, "
            f"max abs diff {figures['max_abs_diff']:.2e} over {parity['probes']} probes"
        )
    openvino = manifest.get("openvino_int8")
    if openvino and "mean_cosine" in openvino:
        print(
            f"parity openvino-int8: min cosine {openvino['min_cosine']:.6f}, mean cosine {openvino['mean_cosine']:.6f}"
            + ("" if openvino["kept"] else " — below the bars, left out")
        )
    elif openvino:
        print(f"openvino-int8: left out ({'; '.join(openvino['failures'])})")
    promoted = ""
    if args.promote:  # promotion leaves a newer version of the name, published meanwhile, current
        current = current_version(Path(registry_dir), manifest["name"])
        promoted = (" (promoted)" if current == manifest["version"]
                    else f" (not promoted: version {current}, published meanwhile, stays current)")  # fmt: skip
    print(
        f"{manifest['name']} version {manifest['version']}{promoted}: {manifest['layers']}/{manifest['source_layers']} "
        f"layers, dim {manifest['dim']}, {manifest['pooling']} pooling, max_seq_length {manifest['max_seq_length']}, "
        f"serves {manifest['serve_variant']}"
    )
    if manifest.get("prompts"):  # what clients pass as prompt_name
        default = manifest.get("default_prompt_name") or "none"
        print(f"prompts (prompt_name): {', '.join(sorted(manifest['prompts']))}; default prompt: {default}")
    return 0
