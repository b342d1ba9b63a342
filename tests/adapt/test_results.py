"""A job's result as the worker stored it before `adapt_jobs.results` declared it reads back unchanged: the API answers
the same sections, keys and values (what a section did not report stays out of it; keys no model declares are
ignored)."""

from __future__ import annotations

import copy
from typing import Any

from adapt_jobs.jobs import Job
from adapt_jobs.results import JobResult
from service.adapt.schemas import AdaptJob

ROWS = [
    {"task": "CropPairRetrieval-heldout", "candidate": 76.637, "baseline": 76.637, "delta": 0.0, "status": "FAIL"},
    {"task": "PyDocModuleClustering", "candidate": 52.941, "baseline": 53.162, "delta": -0.221, "status": "ok"},
    {"task": "LeeDocSTS", "candidate": 11.2, "baseline": None, "delta": None, "status": "new"},
]
GATE = {"passed": False, "margin": 2.0, "reasons": ["CropPairRetrieval-heldout: must improve on the baseline (76.64 "
        "vs 76.64)"], "table": ROWS, "decided_on": "CropPairRetrieval-heldout"}  # fmt: skip
# what a student job stored (GET /adapt/{id} answered these sections as they are)
STUDENT_JOB: dict[str, Any] = {
    "corpus": {"train_documents": 64, "held_out_documents": 16, "crop_rule": "2 sentence(s) of 100-250 chars",
               "crop_yield": 0.9844, "usable_train_documents": 63},
    "teacher_adaptation": {"skipped": True, "why": "the student neither distils the adapted teacher nor …"},
    "student_rehearsal": {"general_texts": 16, "reference": "base_student", "weight": 1.0, "temperature": 0.2,
                          "position_weight": 10.0},
    "student_adaptation": {"steps": 3, "seconds": 1.5, "stopped_by": "max_steps"},
    "evaluation": {
        "in_domain": {"base_teacher": 76.637, "base_student": 76.637, "adapted_student": 76.637},
        "general_in_domain": ["LeeDocSTS"], "in_domain_task": "CropPairRetrieval (held-out documents, nDCG@10)",
        "crops": {"documents": 16, "pairs": 16, "rule": "2 sentence(s) of 100-250 chars", "yield": 1.0},
        "general_tasks": {"base_teacher": {"PyDocModuleClustering": 52.885},
                          "adapted_student": {"PyDocModuleClustering": 52.941}},
        "general": {"base_teacher": 52.885, "adapted_student": 52.941},
    },
    "gate": {**GATE, "compared_with": {"base_student": {**GATE, "decides": True},
                                       "base_teacher": {**GATE, "decides": False}}},
    "model": {"name": "news-tiny", "version": "1", "promoted": False},
    "a_key_no_model_declares": {"x": 1},
}  # fmt: skip
BUILD_JOB: dict[str, Any] = {
    "evaluation": {"general_in_domain": ["LeeDocSTS"], "general_tasks": {"teacher": {"PyDocModuleClustering": 52.885}},
                   "general": {"teacher": 52.885}},
    "gate": {"passed": True, "gated": False, "reasons": [], "note": "a base student is published as built"},
    "model": {"name": "tiny6--sct-tiny", "version": "1", "promoted": True, "already_built": True},
}  # fmt: skip


def _job(result: dict[str, Any]) -> Job:
    params = {"base_model": "tiny6", "name": "news-tiny", "hyperparameters": {},
              "corpus": {"has_labels": False, "usable_documents_estimate": 80}}  # fmt: skip
    return Job("adaptjob-1", "succeeded", 1.0, params, "/nowhere", 80, result=copy.deepcopy(result))


def test_a_stored_result_reads_back_as_the_api_answered_it() -> None:
    for stored in (STUDENT_JOB, BUILD_JOB):
        served = AdaptJob.from_job(_job(stored)).model_dump(mode="json")
        for section in ("evaluation", "gate", "model"):
            assert served[section] == stored[section], section
        result = JobResult.model_validate(stored)
        assert set(result.to_json()) == set(stored) - {"a_key_no_model_declares"}
        assert JobResult.model_validate(result.to_json()) == result  # what the worker stores now reads back the same
    served = AdaptJob.from_job(_job(STUDENT_JOB)).model_dump(mode="json")
    assert served["corpus"] == {"documents": 80, "has_labels": False, "usable_documents_estimate": 80,
                                **STUDENT_JOB["corpus"]}  # fmt: skip
    assert AdaptJob.from_job(_job({})).model_dump(mode="json")["evaluation"] is None
