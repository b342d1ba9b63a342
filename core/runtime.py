"""Run an exported bundle with onnxruntime (or OpenVINO) and the fast tokenizer — no torch.

Used by the service backend, the evaluation suite (bundles as models) and export's parity check.
The graph already pools and normalises, so a forward pass returns final embeddings.

An int8 graph's numbers depend on the CPU that runs it (onnxruntime's u8×s8 kernels saturate on
CPUs without VNNI), so a bundle carries the fp32 reference embeddings of its probe texts
(``probes.npz``); `core.engines.load_engine` checks every candidate engine on *this* CPU against them
before serving the fastest that keeps the bars.
"""

from __future__ import annotations

import math
import platform
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from core.registry import read_manifest

TRUNCATION_DIRECTIONS = ("right", "left")  # which end of an over-long text is cut

OUTPUT_NAME = "sentence_embedding"
# The manifest's graphs by variant: ``onnx`` holds the ONNX graphs every runtime reads (fp32, onnxruntime's int8),
# ``openvino`` the graphs only OpenVINO runs (``openvino-int8``: NNCF's int8 of the fp32 graph, OpenVINO IR).
GRAPH_KEYS = ("onnx", "openvino")
PROBES_FILE = "probes.npz"  # probe texts and their fp32 (torch) reference embeddings
# CPU features that decide which int8 and bf16 kernels the engines run (and so their numbers and speed).
_KERNEL_FLAGS = (
    "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "asimddp", "i8mm",
)  # fmt: skip


@dataclass(frozen=True)
class ParityBars:
    """Cosine to the fp32 (torch) reference an exported graph must keep on the probe set."""

    fp32_min_cosine: float = 0.9999
    int8_mean_cosine: float = 0.99
    int8_min_cosine: float = 0.97
    norm_tolerance: float = 1e-3


@cache
def cpu_features() -> dict[str, Any]:
    """The CPU model and the instruction-set flags that select onnxruntime's int8 kernels (Linux; else platform)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features"):
                flags.update(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return {"model": model, "machine": platform.machine(), "flags": [f for f in _KERNEL_FLAGS if f in flags]}


def cpu_text(cpu: dict[str, Any]) -> str:
    """A `cpu_features` result as one line: the model and the flags that decide the kernels."""
    return f"{cpu['model']} ({', '.join(cpu['flags'])})"


def graph_files(manifest: dict[str, Any]) -> dict[str, str]:
    """Every graph file of a bundle by variant (`GRAPH_KEYS`), relative to its folder."""
    return {variant: file for key in GRAPH_KEYS for variant, file in (manifest.get(key) or {}).items()}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``(N, D)`` arrays, in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(denom, 1e-12)


def mixed_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The probes' indices in batches of mixed lengths: sorted longest first and dealt out in turn, so every batch
    holds one of the longest probes and its shorter ones are padded to it."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    count = -(-len(order) // batch_size)
    return [order[start::count] for start in range(count)]


def probe_outputs(bundle: OnnxBundle, texts: Sequence[str], batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``bundle``'s embeddings of ``texts`` in length-sorted batches and in `mixed_batches`, each ``(N, dim)``."""
    sorted_out = bundle.encode(list(texts), batch_size=batch_size)
    encodings = bundle.tokenize(list(texts))
    mixed_out = np.zeros_like(sorted_out)
    for rows in mixed_batches([len(encoding.ids) for encoding in encodings], batch_size):
        mixed_out[rows] = bundle.run(bundle.pad([encodings[i] for i in rows]))
    return sorted_out, mixed_out


def probe_cosines(bundle: OnnxBundle, texts: Sequence[str], reference: np.ndarray, batch_size: int = 16) -> np.ndarray:
    """Each probe's cosine to ``reference`` (torch's embeddings), the lower of its two batchings'."""
    sorted_out, mixed_out = probe_outputs(bundle, texts, batch_size)
    return np.minimum(cosines(sorted_out, reference), cosines(mixed_out, reference))


def int8_failures(cos: np.ndarray, bars: ParityBars, texts: Sequence[str], label: str = "int8") -> list[str]:
    """What a reduced-precision graph's cosines to the reference miss of the int8 bars (empty when it passes);
    ``label`` names the graph or engine in the messages."""
    failures = []
    if not np.isfinite(cos).all():
        return [f"{label}: output has NaN or infinite values"]
    if cos.mean() < bars.int8_mean_cosine:
        failures.append(f"{label}: mean cosine to torch {cos.mean():.5f} < {bars.int8_mean_cosine}")
    if cos.min() < bars.int8_min_cosine:
        worst = repr(texts[int(np.argmin(cos))][:60])
        failures.append(f"{label}: min cosine to torch {cos.min():.5f} < {bars.int8_min_cosine} (probe {worst})")
    return failures


# What onnxruntime's idle intra-op threads do (`session_options`).
SPINNING = ("never", "during-runs", "always")


def session_options(intra_op_threads: int, inter_op_threads: int = 1, spinning: str = "always") -> ort.SessionOptions:
    """Explicit thread counts: onnxruntime's default (all cores, spinning) fights the event loop.

    ``spinning`` (`SPINNING`) is what an intra-op thread does when it has no work: ``always`` busy-wait
    (onnxruntime's default), between runs too — a spinning worker keeps a core busy between requests, the core the
    server's event loop needs on a small machine; ``never`` sleep at once (``session.intra_op.allow_spinning`` 0),
    so each parallel section of a run wakes it again, and a run of a few milliseconds pays that wake-up at every
    operator; ``during-runs`` busy-wait while a run lasts and sleep once the last concurrent run returns
    (``session.force_spinning_stop``).
    """
    if spinning not in SPINNING:
        raise ValueError(f"unknown spinning {spinning!r}; use one of {SPINNING}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0" if spinning == "never" else "1")
    options.add_session_config_entry("session.force_spinning_stop", "1" if spinning == "during-runs" else "0")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return options


class _OrtRunner:
    """An onnxruntime session (thread-safe: ``run`` may be called from several threads)."""

    def __init__(self, file: Path, options: ort.SessionOptions, providers: Sequence[str]) -> None:
        self.session = ort.InferenceSession(str(file), sess_options=options, providers=list(providers))
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        (out,) = self.session.run([OUTPUT_NAME], feeds)
        return out


class _OpenVinoRunner:
    """A graph of the bundle (ONNX or OpenVINO IR) compiled by OpenVINO for this CPU at ``precision`` (``bf16`` or
    ``f32``; an int8 graph's quantised matmuls stay int8).

    One infer request behind a lock: the service runs one batch at a time per model, and a request per
    caller would hold a second copy of the intermediate buffers for nothing.
    """

    def __init__(self, file: Path, threads: int, precision: str) -> None:
        import openvino as ov  # optional: only a process that loads this engine pays for the import

        config = {
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
        }
        compiled = ov.Core().compile_model(str(file), "CPU", config)
        self.input_names = [port.get_any_name() for port in compiled.inputs]
        self._output = compiled.output(OUTPUT_NAME)
        self._request = compiled.create_infer_request()
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        with self._lock:
            result = self._request.infer(feeds)
            return np.array(result[self._output], dtype=np.float32, copy=True)  # the request reuses its buffers


RUNTIMES = ("onnxruntime", "openvino")

Shape = tuple[int, int]  # a padded batch's (texts, padded length)


def nearest_shape(shapes: Sequence[Shape], rows: int, width: int) -> int:
    """The index of the first of ``shapes`` nearest a batch of ``rows`` texts padded to ``width`` tokens, on log
    scales of both (squared distance): 64 short texts are nearer 32 short ones than 4 long ones of the same padded
    tokens, and one 256-token text nearer 4 of them than one short text."""
    distances = [math.log(texts / rows) ** 2 + math.log(length / width) ** 2 for texts, length in shapes]
    return distances.index(min(distances))


class OnnxBundle:
    """One bundle folder loaded for inference.

    Args:
        path: the bundle folder (``<registry>/<name>/<version>``).
        variant: a graph of the bundle (`graph_files`: ``fp32``, ``int8``, ``openvino-int8``); default: the
            manifest's ``serve_variant``.
        intra_op_threads: threads one inference may use.
        spinning: what idle intra-op threads do (`SPINNING`; see `session_options`).
        providers: onnxruntime execution providers (default CPU).
        onnx_file: a graph file in the folder to run instead of the variant's (export tries candidates this way).
        runtime: ``onnxruntime`` or ``openvino`` (which reads the same ONNX file; see `core.engines`).
        precision: OpenVINO's inference precision, ``bf16`` or ``f32``, for what the graph leaves in floating point
            (onnxruntime runs the graph as stored).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        variant: str | None = None,
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        providers: Sequence[str] | None = None,
        spinning: str = "always",
        onnx_file: str | None = None,
        runtime: str = "onnxruntime",
        precision: str = "f32",
    ) -> None:
        self.path = Path(path)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        self.variant = variant or self.manifest.get("serve_variant", "fp32")
        files = graph_files(self.manifest)
        if onnx_file is None and self.variant not in files:
            raise ValueError(f"bundle {self.path} has no {self.variant!r} variant; it has {sorted(files)}")
        file = self.path / (onnx_file or files[self.variant])
        self._runner: _OrtRunner | _OpenVinoRunner
        if runtime == "onnxruntime":
            options = session_options(intra_op_threads, inter_op_threads, spinning)
            self._runner = _OrtRunner(file, options, providers or ["CPUExecutionProvider"])
        elif runtime == "openvino":
            self._runner = _OpenVinoRunner(file, intra_op_threads, precision)
        else:
            raise ValueError(f"unknown runtime {runtime!r}; use one of {RUNTIMES}")
        self.runtime = runtime
        self._route_shapes: list[Shape] = []
        self._route_runners: list[_OrtRunner | _OpenVinoRunner] = []
        self.precision = precision if runtime == "openvino" else self.variant
        self.input_names = self._runner.input_names
        self.max_seq_length = int(self.manifest["max_seq_length"])
        self.pad_token_id = int(self.manifest.get("pad_token_id", 0))
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def tokenize(self, texts: Sequence[str], direction: str = "right") -> list[Encoding]:
        """Token ids per text, truncated to ``max_seq_length`` (``enc.overflowing`` says if cut): the end of a long
        text is cut (``direction`` "right"), or its start ("left"); the special tokens stay either way."""
        if direction not in TRUNCATION_DIRECTIONS:
            raise ValueError(f"direction must be one of {TRUNCATION_DIRECTIONS}, got {direction!r}")
        tokenizer = self.tokenizer if direction == "right" else self._left_tokenizer
        return tokenizer.encode_batch(list(texts), add_special_tokens=True)

    @cached_property
    def _left_tokenizer(self) -> Tokenizer:
        # its own copy: the shared tokenizer's settings must not change under other threads
        tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
        tokenizer.enable_truncation(max_length=self.max_seq_length, direction="left")
        return tokenizer

    def pad(self, encodings: Sequence[Encoding]) -> dict[str, np.ndarray]:
        """Right-pad a batch into the model's int64 inputs."""
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: feeds[name] for name in self.input_names}

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Padded inputs → ``(B, dim)`` float32 embeddings (pooled and normalised in the graph), on the engine of the
        batch's route (`route_batches`)."""
        if not self._route_shapes:
            return self._runner.run(feeds)
        rows, width = feeds["input_ids"].shape
        return self._route_runners[nearest_shape(self._route_shapes, rows, width)].run(feeds)

    def route_batches(self, routes: Sequence[tuple[Shape, OnnxBundle]]) -> None:
        """Run each batch on the engine of the route whose shape — ``(texts, padded length)`` of a timing batch its
        engine was chosen on — is nearest the batch's (`nearest_shape`); without routes, on this bundle's own engine.
        Each bundle is one of the same folder (another engine of it, or this one): `core.engine_choice.pick_routes`
        chooses the engine fastest on each timing batch."""
        shapes = [tuple(shape) for shape, _ in routes]
        if len(set(shapes)) != len(shapes) or any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError(f"route shapes must be distinct (texts, padded length) pairs of positive ints: {shapes}")
        for _, other in routes:
            if other.path != self.path:
                raise ValueError(f"routes must run the same bundle: {other.path} is not {self.path}")
        self._route_shapes = [(int(rows), int(width)) for rows, width in shapes]
        self._route_runners = [other._runner for _, other in routes]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embed texts in length-sorted batches; rows come back in input order."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list")
        encodings = self.tokenize(texts)
        out = np.zeros((len(encodings), self.dim), dtype=np.float32)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            out[rows] = self.run(self.pad([encodings[i] for i in rows]))
        return out


def read_probes(path: str | Path) -> tuple[list[str], np.ndarray] | None:
    """A bundle's probe texts and fp32 reference embeddings, or None if it stores none."""
    file = Path(path) / PROBES_FILE
    if not file.is_file():
        return None
    with np.load(file, allow_pickle=False) as data:
        return [str(t) for t in data["texts"]], np.asarray(data["embeddings"], dtype=np.float32)


def write_probes(path: str | Path, texts: Sequence[str], embeddings: np.ndarray) -> Path:
    file = Path(path) / PROBES_FILE
    np.savez_compressed(file, texts=np.asarray(list(texts), dtype=str), embeddings=embeddings.astype(np.float32))
    return file
