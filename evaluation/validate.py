"""Validation of one model (optionally against a baseline): suite + layer-wise curves + diagnostics +
speed → gate → report files. The library behind ``embedder validate``; export and adapt call it too."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from core import corpora
from core.runtime import cpu_features
from evaluation.diagnostics import (
    alignment,
    dcl_alignment,
    dcl_uniformity,
    effective_rank,
    knn_accuracy,
    uniformity,
)
from evaluation.embedding_model import EmbeddingModel, OnnxModel, load_model
from evaluation.gate import GateResult, check, check_thresholds
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.report import write_report
from evaluation.speed import measure_speed
from evaluation.suite import read_cached_result, result_cache_dir, run_suite, score_task, write_cached_result
from evaluation.tasks import CropPairRetrieval, resolve_task
from evaluation.tasks.bbc import bbc_task_split

DEFAULT_LAYER_TASKS = ("LeeDocSTS", "BBCNewsKNN")
REPORT_FORMAT = 1  # report.json's layout (docs/EVALUATION.md, "Reports and caching"): bumped when a key changes meaning
# the libraries whose versions can move a score or a timing
SCORING_PACKAGES = ("mteb", "scikit-learn", "numpy", "scipy", "torch", "transformers", "sentence-transformers",
                    "tokenizers", "onnxruntime", "openvino")  # fmt: skip
DIAGNOSTICS_REVISION = "2"  # 2: paper 002 §3.1's alignment and uniformity of the crop pairs


def layer_curves(
    model: EmbeddingModel,
    tasks: Sequence[Any],
    *,
    memo: EmbeddingMemo | None = None,
    fast: bool = False,
    cache: Path | None = None,
    progress: bool = True,
) -> dict[str, list[float]]:
    """``{task: [points per layer]}`` (layer 0 = embeddings), cached by model hash; empty for bundles."""
    if not model.supports_layers or not tasks:
        return {}
    if memo is None or not memo.all_layers:
        memo = EmbeddingMemo(model, all_layers=True, progress=progress)
    curves: dict[str, list[float]] = {}
    for task in (resolve_task(t, fast=fast) for t in tasks):
        if task.unavailable_reason() is not None:
            continue
        path = result_cache_dir(model, cache) / f"layers-{task.cache_key}.json" if cache else None
        cached = read_cached_result(path) if path else None
        if cached is None:
            layers = range(int(model.num_layers or 0) + 1)
            bar = tqdm(layers, desc=f"layers {task.metadata.name}", disable=not progress, leave=False)
            cached = {"scores": [score_task(memo, task, layer=layer)["score"] for layer in bar]}
            if cache:
                write_cached_result(path, cached)
        curves[task.metadata.name] = cached["scores"]
    return curves


def compute_diagnostics(memo: EmbeddingMemo, *, fast: bool = False) -> dict[str, float]:
    """Paper diagnostics on BBC articles (kNN 9:1, effective rank, uniformity) and Lee-background
    crop pairs (alignment and uniformity, Wang & Isola's and paper 002 §3.1's). Parts whose data is missing are
    left out."""
    out: dict[str, float] = {}
    try:
        texts, labels = corpora.bbc_articles()
        if fast:
            train, test = bbc_task_split(True)
            idx = sorted(train + test)
            texts, labels = tuple(texts[i] for i in idx), tuple(labels[i] for i in idx)
        emb = memo.embed(list(texts))
        out["bbc_knn10_euclidean_9to1"] = 100 * knn_accuracy(emb, labels, k=10, metric="euclidean", split=0.9)
        out["bbc_knn10_cosine_9to1"] = 100 * knn_accuracy(emb, labels, k=10, metric="cosine", split=0.9)
        out["bbc_effective_rank"] = effective_rank(emb)
        out["bbc_uniformity_t2"] = uniformity(emb, t=2)
    except corpora.DataUnavailableError:
        pass
    try:
        pairs = CropPairRetrieval(fast=fast).crop_pairs()
        queries = memo.embed([q for q, _ in pairs])
        positives = memo.embed([p for _, p in pairs])
        out["crop_alignment_a2"] = alignment(queries, positives)
        out["crop_uniformity_t2"] = uniformity(positives, t=2)
        out["crop_dcl_alignment_tau005"] = dcl_alignment(queries, positives, tau=0.05)
        out["crop_dcl_uniformity_tau005"] = dcl_uniformity(queries, positives, tau=0.05)
    except corpora.DataUnavailableError:
        pass
    return {k: round(float(v), 4) for k, v in out.items()}


def evaluate_model(
    model: Any,
    *,
    tasks: Sequence[Any] | None = None,
    fast: bool = False,
    layer_tasks: Sequence[Any] = DEFAULT_LAYER_TASKS,
    speed: bool = True,
    diagnostics: bool = True,
    cache: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`run_suite` plus ``layers`` (torch models), ``diagnostics`` and ``speed`` for one model."""
    emb = load_model(model)
    memo = EmbeddingMemo(emb, all_layers=emb.supports_layers and bool(layer_tasks), progress=progress)
    report = run_suite(emb, tasks, fast=fast, progress=progress, cache=cache, memo=memo)
    report["layers"] = layer_curves(emb, layer_tasks, memo=memo, fast=fast, cache=cache, progress=progress)
    if diagnostics:
        name = f"diagnostics-r{DIAGNOSTICS_REVISION}-{'fast' if fast else 'full'}.json"
        path = result_cache_dir(emb, cache) / name if cache else None
        cached = read_cached_result(path) if path else None
        if cached is None:
            cached = compute_diagnostics(memo, fast=fast)
            if cache:
                write_cached_result(path, cached)
        report["diagnostics"] = cached
    if speed:
        report["speed"] = measure_speed(emb, fast=fast, progress=progress)
    return report


def run_environment() -> dict[str, Any]:
    """Where a report was made: the CPU (model and the instruction sets that choose int8 kernels), its cores, the OS,
    Python and the versions of `SCORING_PACKAGES` (None for one not installed). Speed means nothing without it."""
    packages: dict[str, str | None] = {}
    for name in SCORING_PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "cpu": cpu_features(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": packages,
    }


def default_out_dir(model: EmbeddingModel, cache_dir: Path | None) -> Path:
    """Next to the bundle for a bundle; else ``<cache_dir>/reports/<name>-<hash>``."""
    if isinstance(model, OnnxModel):
        return model.path
    if cache_dir is None:
        raise ValueError(f"no report folder for {model.name}: give one, or a cache root")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model.name).strip("-") or "model"
    return Path(cache_dir) / "reports" / f"{safe}-{model.hash[:12]}"


def prepare_out_dir(out_dir: str | Path | None, model: EmbeddingModel, cache_dir: Path | None) -> Path:
    """The report folder — ``out_dir``, else `default_out_dir` — created now, so that a path which cannot hold
    the report (an existing file, a parent that is a file, no permission) is refused before any scoring instead
    of after it. Raises ValueError saying which path and why."""
    folder = Path(out_dir) if out_dir is not None else default_out_dir(model, cache_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the report folder {folder} is an existing file: give a folder (new or existing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the report folder {folder}: {exc}") from exc
    try:  # an existing folder may still refuse files (its mode, a read-only mount): try one, as the report will
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"cannot write the report into {folder}: {exc}") from exc
    return folder


def validate(
    model: Any,
    baseline: Any | None = None,
    *,
    tasks: Sequence[Any] | None = None,
    fast: bool = False,
    max_drop: float = 1.0,
    min_speedup: float | None = None,
    allow_skipped: bool = False,
    layer_tasks: Sequence[Any] = DEFAULT_LAYER_TASKS,
    speed: bool = True,
    diagnostics: bool = True,
    out_dir: str | Path | None = None,
    cache: Path | None = None,
    progress: bool = True,
    command: str = "",
) -> tuple[dict[str, Any], GateResult | None, dict[str, Path]]:
    """Evaluate ``model`` (and ``baseline`` on the same tasks), gate, and write the report files.

    ``allow_skipped``: let the gate pass although some tasks were scored by neither model (their data is
    missing); the report lists them either way (`evaluation.gate.check`).

    The report folder (``out_dir``, else next to a bundle, else under ``cache``: `prepare_out_dir`) is created
    before any scoring; ValueError when there is none or it cannot be created.

    Returns ``(report, gate result or None without a baseline, {file name: path written})``.
    """
    check_thresholds(max_drop, min_speedup)  # before any scoring: a bad bound would waste the whole run
    if min_speedup is not None and baseline is None:
        raise ValueError("--min-speedup compares throughput with a baseline: pass --baseline too")
    if min_speedup is not None and not speed:
        raise ValueError("--min-speedup needs the speed measurement: do not disable speed")
    candidate = load_model(model)
    folder = prepare_out_dir(out_dir, candidate, cache)
    kwargs = {
        "tasks": tasks,
        "fast": fast,
        "layer_tasks": layer_tasks,
        "speed": speed,
        "diagnostics": diagnostics,
        "cache": cache,
        "progress": progress,
    }
    report: dict[str, Any] = {
        "format_version": REPORT_FORMAT,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "environment": run_environment(),
        "fast": fast,
        "max_drop": max_drop,
        "min_speedup": min_speedup,
        "allow_skipped": allow_skipped,
        "candidate": evaluate_model(candidate, **kwargs),
        "baseline": None,
        "gate": None,
    }
    result = None
    if baseline is not None:
        report["baseline"] = evaluate_model(load_model(baseline), **kwargs)
        result = check(
            report["candidate"],
            report["baseline"],
            max_drop=max_drop,
            min_speedup=min_speedup,
            allow_skipped=allow_skipped,
        )
        report["gate"] = result.as_dict()
    written = write_report(report, folder)
    return report, result, written
