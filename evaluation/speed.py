"""Speed in the same report as quality: texts/s and p50 latency for batch 1 and 32, short and long texts.

Short texts are first sentences of gensim's Lee background news (≈ 20-40 tokens); long texts are the
whole documents (hundreds of tokens, so the model's ``max_seq_length`` truncation applies). Timings
include tokenisation, as a caller of the model sees them. Numbers on a shared 2-core machine are
noisy: compare models measured in the same run.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from core import corpora
from evaluation.embedding_model import EmbeddingModel, load_model

BATCH_SIZES = (1, 32)
WARMUP_CALLS = 2


def speed_texts() -> dict[str, list[str]]:
    """``{"short": [...], "long": [...]}`` from the Lee background corpus."""
    docs = list(corpora.lee_background())
    firsts = [re.split(r"(?<=\.)\s+", doc, maxsplit=1)[0] for doc in docs]
    return {"short": firsts, "long": docs}


def _cycle(texts: Sequence[str], n: int, offset: int) -> list[str]:
    return [texts[(offset + i) % len(texts)] for i in range(n)]


def measure_speed(
    model: Any,
    *,
    texts: dict[str, Sequence[str]] | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    calls: int = 24,
    fast: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Time ``model.encode`` per setting (text length × batch size).

    Args:
        model: anything `load_model` accepts.
        texts: ``{label: texts}``; default `speed_texts`.
        calls: timed calls per batch-1 setting; batch-32 settings time ``max(2, calls // 8)`` calls.
        fast: 2 calls per setting after one warm-up (tests).

    Returns ``{"settings": [{"setting", "batch_size", "texts", "calls", "p50_ms", "texts_per_s"}],
    "threads": int}``; p50 is the median latency of one call (one batch).
    """
    emb: EmbeddingModel = load_model(model)
    texts = texts or speed_texts()
    rows = []
    plan = [(label, bs) for label in texts for bs in batch_sizes]
    for label, batch_size in tqdm(plan, desc=f"speed {emb.name}", disable=not progress, leave=False):
        pool = list(texts[label])
        n_calls = 2 if fast else (calls if batch_size == 1 else max(2, calls // 8))
        for w in range(1 if fast else WARMUP_CALLS):
            emb.encode(_cycle(pool, batch_size, w), batch_size=batch_size)
        latencies = []
        for c in range(n_calls):
            batch = _cycle(pool, batch_size, c * batch_size)
            start = time.perf_counter()
            emb.encode(batch, batch_size=batch_size)
            latencies.append(time.perf_counter() - start)
        rows.append(
            {
                "setting": f"{label}/b{batch_size}",
                "batch_size": batch_size,
                "texts": label,
                "calls": n_calls,
                "p50_ms": round(1000 * statistics.median(latencies), 2),
                "texts_per_s": round(batch_size * n_calls / sum(latencies), 2),
            }
        )
    return {"settings": rows, "threads": _threads()}


def median_speed(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from several `measure_speed` runs of a model (e.g. rounds interleaved with other models, so a
    machine's slow minute falls on all of them): per setting the median texts/s and the median p50 over the runs.

    Raises ValueError when ``runs`` is empty or the runs measured different settings."""
    if not runs:
        raise ValueError("median_speed needs at least one measure_speed run")
    settings = [[row["setting"] for row in run["settings"]] for run in runs]
    if any(names != settings[0] for names in settings):
        raise ValueError(f"the runs measured different settings: {settings}")
    rows = []
    for i, first in enumerate(runs[0]["settings"]):
        same = [run["settings"][i] for run in runs]
        rows.append(
            {
                **first,
                "calls": sum(row["calls"] for row in same),
                "p50_ms": round(statistics.median(row["p50_ms"] for row in same), 2),
                "texts_per_s": round(statistics.median(row["texts_per_s"] for row in same), 2),
            }
        )
    return {"settings": rows, "threads": runs[0]["threads"], "rounds": len(runs)}


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())
