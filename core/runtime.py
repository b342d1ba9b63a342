"""Run an exported bundle with onnxruntime and the fast tokenizer — no torch.

Used by the service backend, the evaluation suite (bundles as models) and export's parity check.
The graph already pools and normalises, so a forward pass returns final embeddings.

An int8 graph's numbers depend on the CPU that runs it (onnxruntime's u8×s8 kernels saturate on
CPUs without VNNI), so a bundle carries the fp32 reference embeddings of its probe texts
(``probes.npz``) and `load_checked` re-checks the int8 graph on *this* CPU before serving it,
falling back to fp32 when it misses the bars.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from core.registry import read_manifest

log = logging.getLogger(__name__)

OUTPUT_NAME = "sentence_embedding"
PROBES_FILE = "probes.npz"  # probe texts and their fp32 (torch) reference embeddings
# CPU features that decide which int8 kernels onnxruntime runs (and so the int8 graph's numbers).
_KERNEL_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


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


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``(N, D)`` arrays, in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(denom, 1e-12)


def int8_failures(cos: np.ndarray, bars: ParityBars, texts: Sequence[str]) -> list[str]:
    """What an int8 graph's cosines to the reference miss of the bars (empty when it passes)."""
    failures = []
    if not np.isfinite(cos).all():
        return ["int8: output has NaN or infinite values"]
    if cos.mean() < bars.int8_mean_cosine:
        failures.append(f"int8: mean cosine to torch {cos.mean():.5f} < {bars.int8_mean_cosine}")
    if cos.min() < bars.int8_min_cosine:
        worst = repr(texts[int(np.argmin(cos))][:60])
        failures.append(f"int8: min cosine to torch {cos.min():.5f} < {bars.int8_min_cosine} (probe {worst})")
    return failures


def session_options(
    intra_op_threads: int, inter_op_threads: int = 1, allow_spinning: bool = True
) -> ort.SessionOptions:
    """Explicit thread counts: onnxruntime's default (all cores, spinning) fights the event loop.

    ``allow_spinning=False`` makes idle intra-op threads sleep at once instead of busy-waiting for the next
    run (``session.intra_op.allow_spinning``): a spinning worker keeps a core busy between requests, the core
    the server's event loop needs on a small machine.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return options


class OnnxBundle:
    """One bundle folder loaded for inference.

    Args:
        path: the bundle folder (``<registry>/<name>/<version>``).
        variant: ``fp32`` or ``int8``; default: the manifest's ``serve_variant``.
        intra_op_threads: threads one inference may use.
        allow_spinning: let idle intra-op threads busy-wait for the next run (see `session_options`).
        providers: onnxruntime execution providers (default CPU).
        onnx_file: a graph file in the folder to run instead of the variant's (export tries candidates this way).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        variant: str | None = None,
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        providers: Sequence[str] | None = None,
        allow_spinning: bool = True,
        onnx_file: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        self.variant = variant or self.manifest.get("serve_variant", "fp32")
        files = self.manifest["onnx"]
        if onnx_file is None and self.variant not in files:
            raise ValueError(f"bundle {self.path} has no {self.variant!r} variant; it has {sorted(files)}")
        self.session = ort.InferenceSession(
            str(self.path / (onnx_file or files[self.variant])),
            sess_options=session_options(intra_op_threads, inter_op_threads, allow_spinning),
            providers=list(providers or ["CPUExecutionProvider"]),
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
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

    def tokenize(self, texts: Sequence[str]) -> list[Encoding]:
        """Token ids per text, truncated to ``max_seq_length`` (``enc.overflowing`` says if cut)."""
        return self.tokenizer.encode_batch(list(texts), add_special_tokens=True)

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
        """Padded inputs → ``(B, dim)`` float32 embeddings (pooled and normalised in the graph)."""
        (out,) = self.session.run([OUTPUT_NAME], feeds)
        return out

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


@dataclass(frozen=True)
class Int8Check:
    """Which graph `load_checked` chose, and why: ``status`` is ``passed``, ``failed``, ``disabled``,
    ``no-int8`` (the bundle has only fp32) or ``no-references`` (exported before probes were stored)."""

    variant: str
    status: str
    reason: str = ""
    mean_cosine: float | None = None
    min_cosine: float | None = None
    cpu: dict[str, Any] = field(default_factory=cpu_features)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def check_int8(bundle: OnnxBundle, bars: ParityBars = ParityBars()) -> Int8Check:
    """Embed the bundle's probes with its int8 graph on this CPU and hold them against the stored references."""
    probes = read_probes(bundle.path)
    if probes is None:
        return Int8Check("fp32", "no-references", f"{bundle.path} stores no {PROBES_FILE}; re-export it to serve int8")
    texts, reference = probes
    cos = cosines(bundle.encode(texts, batch_size=16), reference)
    failures = int8_failures(cos, bars, texts)
    figures = {"mean_cosine": float(np.mean(cos)), "min_cosine": float(np.min(cos))}
    if failures:
        return Int8Check("fp32", "failed", "; ".join(failures), **figures)
    return Int8Check("int8", "passed", "", **figures)


def load_checked(path: str | Path, *, serve_int8: bool = True, **session: Any) -> tuple[OnnxBundle, Int8Check]:
    """Load the bundle's int8 graph if it has one and it keeps the parity bars on this CPU, else its fp32 graph.

    ``session`` are `OnnxBundle`'s keyword arguments (threads, spinning, providers). Never silently worse
    vectors: a failed check is logged with its figures and returned, so callers can show it.
    """
    manifest = read_manifest(Path(path))
    if "int8" not in manifest.get("onnx", {}):
        return OnnxBundle(path, variant="fp32", **session), Int8Check("fp32", "no-int8")
    if not serve_int8:
        return OnnxBundle(path, variant="fp32", **session), Int8Check("fp32", "disabled", "int8 serving is off")
    bundle = OnnxBundle(path, variant="int8", **session)
    check = check_int8(bundle)
    if check.variant == "int8":
        return bundle, check
    cpu = check.cpu
    log.warning(
        "bundle %s: serving fp32, not int8, on this CPU (%s; %s): %s",
        path, cpu["model"], ",".join(cpu["flags"]) or "no int8 extensions", check.reason,
    )  # fmt: skip
    return OnnxBundle(path, variant="fp32", **session), check
