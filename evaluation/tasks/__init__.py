"""The offline task suite: real mteb task classes whose data comes from pinned packages.

| task | data | main score |
|---|---|---|
| `LeeDocSTS` | gensim Lee corpus, 1,225 human-scored document pairs | Spearman (cosine) |
| `BBCNewsClustering` | 2,125 distinct BBC articles, 5 classes | V-measure |
| `BBCNewsClassification` | BBC, seeded 70/30 split | logistic-regression accuracy |
| `BBCNewsKNN` | BBC, same split | kNN accuracy (k = 10, cosine) |
| `ACLSumRetrieval` | 750 ACLSum summaries → 250 abstracts | nDCG@10 |
| `CropPairRetrieval` | any corpus (default: Lee background news) | nDCG@10 |
| `BibleParaphraseRetrieval` | 1,205 Open English Bible verses → the same verses in the 1901 ASV | nDCG@10 |
| `PyDocSummaryRetrieval` | 340 stdlib docstring summary lines → the rest of their docstrings | nDCG@10 |
| `PyDocModuleClustering` | 710 stdlib docstring summary lines, 23 modules | V-measure |

Every task class names the corpus its texts come from in ``source_corpus`` (`core.corpora.CORPUS_*`); its domain
(`core.corpora.CORPUS_DOMAINS`) decides, per model, whether the task is in-domain or out-of-domain.
"""

from __future__ import annotations

from typing import Any

from evaluation.tasks.aclsum import ACLSumRetrieval
from evaluation.tasks.base import OfflineTask
from evaluation.tasks.bbc import BBCNewsClassification, BBCNewsClustering, BBCNewsKNN
from evaluation.tasks.bible import BibleParaphraseRetrieval
from evaluation.tasks.crops import CropPairRetrieval
from evaluation.tasks.lee import LeeDocSTS
from evaluation.tasks.pydoc import PyDocModuleClustering, PyDocSummaryRetrieval

TASKS: dict[str, type[OfflineTask]] = {
    "LeeDocSTS": LeeDocSTS,
    "BBCNewsClustering": BBCNewsClustering,
    "BBCNewsClassification": BBCNewsClassification,
    "BBCNewsKNN": BBCNewsKNN,
    "ACLSumRetrieval": ACLSumRetrieval,
    "CropPairRetrieval-LeeBackground": CropPairRetrieval,
    "BibleParaphraseRetrieval": BibleParaphraseRetrieval,
    "PyDocSummaryRetrieval": PyDocSummaryRetrieval,
    "PyDocModuleClustering": PyDocModuleClustering,
}
DEFAULT_TASKS = tuple(TASKS)


def resolve_task(task: Any, *, fast: bool = False) -> OfflineTask:
    """A task instance from a name in `TASKS` (case-insensitive), a task class, or an instance (returned as is)."""
    if isinstance(task, OfflineTask):
        return task
    if isinstance(task, type) and issubclass(task, OfflineTask):
        return task(fast=fast)
    if isinstance(task, str):
        by_lower = {name.lower(): cls for name, cls in TASKS.items()}
        if task.lower() in by_lower:
            return by_lower[task.lower()](fast=fast)
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    raise TypeError(f"a task is a name, an OfflineTask class or instance; got {type(task).__name__}")


__all__ = [
    "DEFAULT_TASKS",
    "TASKS",
    "ACLSumRetrieval",
    "BBCNewsClassification",
    "BBCNewsClustering",
    "BBCNewsKNN",
    "BibleParaphraseRetrieval",
    "CropPairRetrieval",
    "LeeDocSTS",
    "OfflineTask",
    "PyDocModuleClustering",
    "PyDocSummaryRetrieval",
    "resolve_task",
]
