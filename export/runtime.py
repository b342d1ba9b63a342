"""Run an exported bundle with onnxruntime and the fast tokenizer — no torch.

Used by the service backend, the evaluation suite (bundles as models) and export's parity check.
The graph already pools and normalises, so a forward pass returns final embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from export.registry import read_manifest

OUTPUT_NAME = "sentence_embedding"


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
    ) -> None:
        self.path = Path(path)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        self.variant = variant or self.manifest.get("serve_variant", "fp32")
        files = self.manifest["onnx"]
        if self.variant not in files:
            raise ValueError(f"bundle {self.path} has no {self.variant!r} variant; it has {sorted(files)}")
        self.session = ort.InferenceSession(
            str(self.path / files[self.variant]),
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
