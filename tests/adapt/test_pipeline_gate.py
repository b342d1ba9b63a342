"""The gate stage of an /adapt job (`adapt_worker.release.judge`) decides on the short pieces of the held-out documents:
a model that wins crop pairs while its pieces lose their documents is refused, as an adapted model and as a student
(against the base student, which decides, and the base teacher, reported). The scores are computed by the job's own
checks on the corpus and models of tests/evaluation/test_domain_checks.py: every document names its subject in its
opening and repeats a marker of its own in every body sentence; the "adapted" model sees only the markers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapt_jobs.knobs import BASE_STUDENT, BASE_TEACHER
from adapt_jobs.results import Evaluation
from adapt_worker.attempt import Baseline, Trained
from adapt_worker.release import judge
from adapt_worker.student import ADAPTED_STUDENT
from adapt_worker.teacher import ADAPTED, BASE
from core.text import choose_crop_rule
from evaluation.domain_checks import ndcg_at_10, piece_retrieval
from evaluation.gate import AGREEMENT_TASK, IN_DOMAIN_TASK, PIECES_TASK
from evaluation.tasks import CropPairRetrieval
from tests.evaluation.conftest import FakeModel
from tests.evaluation.test_domain_checks import DIM, _bag, _corpus

UNUSED = Path("not-read-by-the-gate")


@pytest.fixture(scope="module")
def scores() -> dict[str, dict[str, float]]:
    """Crop pairs and pieces of a model that matches subjects (``names``) and one that matches markers (``markers``)."""
    docs = _corpus()
    crops = CropPairRetrieval.from_corpus(docs, seed=0, rule=choose_crop_rule(docs)).crop_pairs()
    out: dict[str, dict[str, float]] = {"crops": {}, "pieces": {}}
    for which, weights in {"names": {"key": 1.0, "fill": 0.0}, "markers": {"key": 0.0, "fill": 1.0}}.items():
        model = FakeModel(which, _bag(weights), DIM)
        q, d = model.encode([a for a, _ in crops]), model.encode([b for _, b in crops])
        out["crops"][which] = float(ndcg_at_10(q @ d.T, [[i] for i in range(len(crops))]).mean())
        out["pieces"][which] = float(np.mean([v.mean() for v in piece_retrieval(model, docs).values()]))
    assert out["crops"]["markers"] > out["crops"]["names"] and out["pieces"]["markers"] < out["pieces"]["names"]
    return out


def _evaluation(scores: dict[str, dict[str, float]], roles: dict[str, str]) -> Evaluation:
    """Each role scored as the model ``roles`` names."""
    return Evaluation(
        in_domain={role: scores["crops"][model] for role, model in roles.items()},
        pieces={role: scores["pieces"][model] for role, model in roles.items()},
    )


def test_an_adapted_model_that_wins_crop_pairs_but_loses_the_short_pieces_is_refused(scores) -> None:
    trained = Trained(UNUSED, "base", (), ADAPTED, (Baseline(BASE, UNUSED),), (BASE,))
    gate = judge(_evaluation(scores, {BASE: "names", ADAPTED: "markers"}), trained, margin=2.0)
    assert not gate.passed and gate.decided_on == PIECES_TASK and gate.compared_with is None
    assert any(r.startswith(f"{PIECES_TASK}: must improve") for r in gate.reasons)
    assert not any(r.startswith(IN_DOMAIN_TASK) for r in gate.reasons)  # crop pairs improved
    # the other way round the pieces improve, and the crop pairs' drop (past the margin) is what refuses it
    back = judge(_evaluation(scores, {BASE: "markers", ADAPTED: "names"}), trained, margin=2.0)
    assert not back.passed and [r.split(":")[0] for r in back.reasons] == [IN_DOMAIN_TASK]
    assert judge(_evaluation(scores, {BASE: "markers", ADAPTED: "names"}), trained, margin=100.0).passed


def test_a_student_must_pass_the_short_pieces_against_the_base_student(scores) -> None:
    baselines = (Baseline(BASE_TEACHER, UNUSED), Baseline(BASE_STUDENT, UNUSED))
    trained = Trained(UNUSED, "base--sct-tiny", (), ADAPTED_STUDENT, baselines, (BASE_STUDENT, BASE_TEACHER))
    roles = {BASE_TEACHER: "markers", BASE_STUDENT: "names", ADAPTED_STUDENT: "markers"}
    gate = judge(_evaluation(scores, roles), trained, margin=2.0)
    assert gate.compared_with is not None
    decides, reported = gate.compared_with[BASE_STUDENT], gate.compared_with[BASE_TEACHER]
    assert decides.decides and not reported.decides
    assert not gate.passed and not decides.passed and decides.decided_on == PIECES_TASK
    assert any(r.startswith(f"{PIECES_TASK}: must improve") for r in gate.reasons)
    assert not reported.passed  # equal to the base teacher: not an improvement either (reported, not deciding)
    # the base teacher's comparison never decides: a student that beats the base student passes below the teacher
    roles = {BASE_TEACHER: "names", BASE_STUDENT: "markers", ADAPTED_STUDENT: "names"}
    gate = judge(_evaluation(scores, roles), trained, margin=100.0)
    assert gate.passed and gate.compared_with is not None and not gate.compared_with[BASE_TEACHER].passed


def test_a_student_whose_pieces_rise_while_it_retrieves_less_like_its_teacher_is_refused(scores) -> None:
    """The student's short pieces improve on the base student's, but its retrieval of them follows the base teacher's
    less closely (as the crop step did on CWE, where the real task fell): refused on the agreement alone. The same
    student following the teacher more closely passes. The base teacher is the reference, so its own reported
    comparison has no agreement row."""
    baselines = (Baseline(BASE_TEACHER, UNUSED), Baseline(BASE_STUDENT, UNUSED))
    trained = Trained(UNUSED, "base--sct-tiny", (), ADAPTED_STUDENT, baselines, (BASE_STUDENT, BASE_TEACHER),
                      reference=BASE_TEACHER)  # fmt: skip
    roles = {BASE_TEACHER: "names", BASE_STUDENT: "markers", ADAPTED_STUDENT: "names"}
    evaluation = _evaluation(scores, roles)
    away = evaluation.model_copy(update={"teacher_agreement": {BASE_STUDENT: 61.0, ADAPTED_STUDENT: 57.0}})
    gate = judge(away, trained, margin=100.0)
    assert not gate.passed and [r.split(":")[0] for r in gate.reasons] == [AGREEMENT_TASK]
    assert gate.compared_with is not None
    assert all(row.task != AGREEMENT_TASK for row in gate.compared_with[BASE_TEACHER].table)
    closer = evaluation.model_copy(update={"teacher_agreement": {BASE_STUDENT: 61.0, ADAPTED_STUDENT: 64.0}})
    assert judge(closer, trained, margin=100.0).passed
    assert judge(evaluation, trained, margin=100.0).passed  # no agreement scored (no reference): pieces decide
