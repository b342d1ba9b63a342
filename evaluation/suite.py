"""Run the offline task suite on one model: scores in points (0-100), details, skips, cached by model hash.

Results of a (model hash, task) pair are stored under ``<cache_dir>/evaluation/<hash>/`` so
re-validating an unchanged model only re-reads JSON files.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mteb
from sklearn.exceptions import UndefinedMetricWarning
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from core.durable import write_atomic
from evaluation import data
from evaluation.embedding_model import EmbeddingModel, load_model
from evaluation.mteb_bridge import EmbeddingMemo, MtebEncoder
from evaluation.tasks import DEFAULT_TASKS, OfflineTask, resolve_task

log = logging.getLogger(__name__)


def _quiet_libraries() -> None:
    import datasets

    datasets.disable_progress_bars()
    logging.getLogger("mteb").setLevel(logging.ERROR)


def _scalar_details(scores: dict[str, Any]) -> dict[str, float]:
    return {
        key: round(float(value), 6)
        for key, value in scores.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def task_texts(task: OfflineTask) -> list[str]:
    """Every text a loaded task will ask the model to embed (to embed them before mteb runs)."""
    texts: list[str] = []
    dataset = task.dataset
    if isinstance(dataset, dict) and "default" in dataset:  # retrieval: subset -> split -> RetrievalSplitData
        for split in dataset["default"].values():
            texts += list(split["queries"]["text"]) + list(split["corpus"]["text"])
        return texts
    for split in dataset.values():
        for column in ("sentence1", "sentence2", "sentences", "text"):
            if column in split.column_names:
                texts += list(split[column])
    return texts


def score_task(memo: EmbeddingMemo, task: OfflineTask, *, layer: int | None = None) -> dict[str, Any]:
    """Run one task through mteb with the memo's embeddings (``layer``: that layer's, 0 = embeddings).

    Returns ``{"score": points, "main_metric", "details": {metric: raw value}, "seconds", "mteb_version"}``.
    """
    _quiet_libraries()
    start = time.perf_counter()
    if not task.data_loaded:
        task.load_data()  # loaded by us, so mteb keeps it for the next layer's run
    memo.embed(task_texts(task), layer)  # encode with every thread first, then the classifiers on one:
    # scikit-learn's k-means on a few thousand points is 20x slower with threads on a busy 2-core machine
    with threadpool_limits(1), warnings.catch_warnings():
        # tiny or random models leave some class never predicted: precision is then 0 by definition
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        result = mteb.evaluate(MtebEncoder(memo, layer), [task], cache=None, show_progress_bar=False, raise_error=True)
    (task_result,) = result.task_results
    scores = task_result.scores["test"][0]
    main = float(scores["main_score"])
    details = _scalar_details(scores)
    stats = getattr(task, "crop_stats", None)  # CropPairRetrieval only
    if stats:
        details.update({f"crops_{k}": v for k, v in stats.items() if isinstance(v, int | float)})
    return {
        "score": round(100.0 * main, 4),
        "main_metric": task.metadata.main_score,
        "details": details,
        "seconds": round(time.perf_counter() - start, 2),
        "mteb_version": task_result.mteb_version,
    }


def no_score_reason(entry: Mapping[str, Any]) -> str:
    """Why a task whose main metric came out NaN (or infinite) has no score."""
    value = entry["details"].get("main_score", entry["score"])
    return (
        f"{entry['main_metric']} came out {value} (a correlation is undefined when the model gives every pair the "
        "same similarity: its embeddings collapsed)"
    )


def result_cache_dir(model: EmbeddingModel, cache: Path) -> Path:
    """Where ``model``'s results are kept under the cache root ``cache``."""
    return Path(cache) / "evaluation" / model.hash[:24]


def read_cached_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_cached_result(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(value, indent=1))


def domain_split(trained_on: Sequence[str], sources: Mapping[str, str], scores: Mapping[str, float]) -> dict[str, Any]:
    """Scored tasks split into in-domain and out-of-domain for a model trained on ``trained_on``, with the mean of
    each part in points (None when a part is empty). ``sources``: task → the corpus it draws from.

    The out-of-domain average is the headline: what the model does on text unlike what it was trained on. With no
    declared corpora (a pretrained model whose training data is unknown) every task counts as out-of-domain.
    """
    parts: dict[str, list[str]] = {"in_domain": [], "out_of_domain": []}
    for task in scores:
        parts["in_domain" if data.is_in_domain(sources[task], trained_on) else "out_of_domain"].append(task)
    split: dict[str, Any] = {"trained_on": list(trained_on), "declared": bool(trained_on)}
    for part, tasks in parts.items():
        mean = sum(scores[t] for t in tasks) / len(tasks) if tasks else None
        split[part] = {"tasks": tasks, "average": None if mean is None else round(mean, 4)}
    return split


def run_suite(
    model: Any,
    tasks: Sequence[Any] | None = None,
    *,
    fast: bool = False,
    progress: bool = True,
    cache: Path | None = None,
    batch_size: int = 32,
    memo: EmbeddingMemo | None = None,
) -> dict[str, Any]:
    """Score ``model`` on the offline tasks.

    Args:
        model: anything `evaluation.embedding_model.load_model` accepts (built-in name, checkpoint, bundle,
            ``registry:NAME[@VERSION]``, an ``Encoder`` or an ``EmbeddingModel``).
        tasks: task names, classes or instances (default: every task in `evaluation.tasks.TASKS`).
        fast: a few documents per task (smoke runs and tests; not comparable to full scores).
        progress: tqdm bars for tasks and batches.
        cache: a cache root (the CLI passes ``EMBED_CACHE_DIR``): reuse / store results there, keyed by the
            model's content hash and the task's data; None = always score afresh.
        memo: share embeddings with another call (e.g. layer-wise curves after the suite).

    Returns:
        ``{"model": info, "fast": bool, "scores": {task: points 0-100}, "tasks": {task: {"score", "main_metric",
        "details", "seconds", "mteb_version", "cached", "revision", "source_corpus", "in_domain"}},
        "skipped": {task: reason},
        "failed": {task: reason}, "domains": `domain_split` for the model's ``trained_on``, "seconds": float}``.
        A task whose data package is missing is listed in ``skipped`` with the reason, never raised. A task whose main
        metric came out NaN (an STS correlation of a collapsed model) is listed in ``failed``, and in neither
        ``scores`` nor ``tasks``: a NaN passes every comparison a gate makes.
    """
    emb_model = load_model(model)
    memo = memo or EmbeddingMemo(emb_model, batch_size=batch_size, progress=progress)
    resolved = [resolve_task(t, fast=fast) for t in (tasks if tasks is not None else DEFAULT_TASKS)]
    report: dict[str, Any] = {
        "model": emb_model.info(),
        "fast": fast,
        "scores": {},
        "tasks": {},
        "skipped": {},
        "failed": {},
    }
    sources: dict[str, str] = {}
    start = time.perf_counter()
    bar = tqdm(resolved, desc=f"suite {emb_model.name}", unit="task", disable=not progress)
    for task in bar:
        name = task.metadata.name
        bar.set_postfix_str(name)
        reason = task.unavailable_reason()
        if reason is not None:
            log.warning("skipping %s: %s", name, reason)
            report["skipped"][name] = reason
            continue
        path = result_cache_dir(emb_model, cache) / f"{task.cache_key}.json" if cache else None
        entry = read_cached_result(path) if path else None
        if entry is None:
            entry = score_task(memo, task)
            if cache:
                write_cached_result(path, entry)
            entry = {**entry, "cached": False}
        else:
            entry = {**entry, "cached": True}
        if not math.isfinite(entry["score"]):  # NaN compares false with every bound: it must never read as a score
            report["failed"][name] = no_score_reason(entry)
            continue
        sources[name] = task.source_corpus  # not cached: the model's trained_on is not part of its content hash
        in_domain = data.is_in_domain(task.source_corpus, emb_model.trained_on)
        report["tasks"][name] = {
            **entry, "revision": task.revision, "source_corpus": task.source_corpus, "in_domain": in_domain
        }
        report["scores"][name] = entry["score"]
    report["domains"] = domain_split(emb_model.trained_on, sources, report["scores"])
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report
