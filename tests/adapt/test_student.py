"""/adapt with ``"student"``: the job waits for the one-time build of its base student (a job of its own), adapts the
teacher, distils it into a copy of that student and publishes the 2-layer student; a second job reuses the built
student. Teacher: a tiny 6-layer BERT (sct-tiny keeps its layers [0, 5]); every budget is a few steps, so this tests
the machinery, not the quality (docs/BENCHMARKS.md "Adapt: a compact student" has the figures)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from adapt_jobs.results import JobResult
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.spec import JobSpec, StudentPlan
from adapt_worker.attempt import Attempt, HeldOutSplit
from adapt_worker.student import (
    DistillationTargets,
    StudentStart,
    base_student_checkpoint,
    distillation_config,
    distillation_targets,
)
from core import registry
from core.model_folder import RECIPE_FILE
from embedder import adapt_cli
from evaluation.gate import AGREEMENT_TASK
from service.app import create_app
from service.settings import ServiceSettings
from tests.adapt.cluster import ADMIN, AUTH, wait_for
from training.assembly import cut_texts
from training.config import load_config
from training.encoder import Encoder
from training.inputs import recipe_training_texts
from training.targets import read_vectors, text_key

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, base_registry: Path, tiny_bert6_path: Path
) -> Iterator[tuple[TestClient, ServiceSettings]]:
    root = tmp_path_factory.mktemp("adapt-student")
    shutil.copytree(base_registry, root / "registry", symlinks=True)
    # the adapted teacher's route, not the default: distil the adapted teacher, keep its view of the general texts,
    # then the crop step
    settings = ServiceSettings.from_flat(**_flat_settings(root, tiny_bert6_path),
                                         adapt_student_distil_teacher="adapted_teacher",
                                         adapt_student_general_targets="adapted_teacher",
                                         adapt_student_adapt_steps=3)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        yield client, settings


def _flat_settings(root: Path, teacher: Path) -> dict[str, Any]:
    """Every budget a few steps; otherwise the service's defaults (the base teacher distilled, no crop step)."""
    return dict(
        registry_dir=root / "registry", default_model="tiny-base", registry_poll_seconds=0.3, warmup=False,
        admin_api_keys=[ADMIN], adapt_dir=root / "adapt", adapt_base_models={"tiny6": str(teacher)},
        adapt_min_documents=16, adapt_batch_size=8, adapt_max_steps=6, adapt_lr=5e-3, adapt_train_last_layers=0,
        adapt_worker_threads=1, adapt_general_tasks=["LeeDocSTS", "PyDocModuleClustering"], adapt_general_fast=True,
        adapt_lease_seconds=5.0, adapt_student_general_texts=16, adapt_student_max_steps=4,
        adapt_student_build_max_steps=3, adapt_student_build_max_documents=48,
    )  # fmt: skip


def _job(client: TestClient, job_id: str) -> dict[str, Any]:
    r = client.get(f"/adapt/{job_id}", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def _finished(client: TestClient, job_id: str) -> dict[str, Any]:
    active = ("queued", "running", "evaluating")
    return wait_for(lambda: (j := _job(client, job_id))["state"] not in active and j, timeout_s=300)


def _events(client: TestClient, job_id: str, kind: str) -> list[dict[str, Any]]:
    """The data of a finished job's events of ``kind``."""
    found, current = [], None
    with client.stream("GET", f"/adapt/{job_id}/events", headers=AUTH) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                current = line.removeprefix("event: ")
            elif line.startswith("data: ") and current == kind:
                found.append(json.loads(line.removeprefix("data: ")))
    return found


def test_a_student_job_waits_for_the_base_student_build_then_publishes_a_two_layer_student(
    service: tuple[TestClient, ServiceSettings], corpus: list[str]
) -> None:
    client, settings = service
    body = {"base_model": "tiny6", "name": "news-tiny", "texts": corpus, "student": "sct-tiny"}
    r = client.post("/adapt", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "adapt" and job["student"]["recipe"] == "sct-tiny"
    build_id = job["after_job"]
    assert build_id is not None
    listed = {j["id"]: j for j in client.get("/adapt", headers=AUTH).json()["data"]}
    assert listed[build_id]["kind"] == "student-build" and listed[build_id]["name"] == "tiny6--sct-tiny"
    # a second request while the build is pending waits for the same build, not a new one
    again = client.post("/adapt", json={**body, "name": "news-tiny-2", "promote": "never"}, headers=AUTH).json()
    assert again["after_job"] == build_id

    build = _finished(client, build_id)
    assert build["state"] == "succeeded", build["error"]
    assert build["model"] == {"name": "tiny6--sct-tiny", "version": "1", "promoted": True}
    student_bundle = registry.current_bundle(settings.registry_dir, "tiny6--sct-tiny")
    manifest = json.loads((student_bundle / registry.MANIFEST).read_text())
    assert manifest["layers"] == 2 and manifest["method"]["name"] == "student"
    # published with the int8 trial (adapt_publish_int8, on by default): int8 served where a setting passed here
    assert manifest["int8"] is not None and manifest["serve_variant"] == (
        "int8" if manifest["int8"]["chosen"] else "fp32"
    )
    assert (student_bundle / "checkpoint" / "config.json").is_file()

    done = _finished(client, job["id"])
    assert done["state"] == "succeeded", done["error"]
    roles = {"base_teacher", "adapted_teacher", "base_student", "adapted_student"}
    assert set(done["evaluation"]["in_domain"]) == roles
    # the general tasks the student trained on (Lee's news) are left out for every role; the rest score all but
    # the adapted teacher, which is not served
    assert done["evaluation"]["general_in_domain"] == ["LeeDocSTS"]
    assert set(done["evaluation"]["general"]) == roles - {"adapted_teacher"}
    # how closely each model retrieves the short pieces as the base teacher does (the teacher itself left out)
    assert set(done["evaluation"]["teacher_agreement"]) == roles - {"base_teacher"}
    assert "base_teacher" in done["evaluation"]["teacher_agreement_task"]
    gate = done["gate"]
    assert gate["compared_with"]["base_student"]["decides"] is True
    assert gate["compared_with"]["base_teacher"]["decides"] is False
    assert gate["passed"] == gate["compared_with"]["base_student"]["passed"]
    deciding = {row["task"] for row in gate["compared_with"]["base_student"]["table"]}
    assert AGREEMENT_TASK in deciding
    assert AGREEMENT_TASK not in {row["task"] for row in gate["compared_with"]["base_teacher"]["table"]}
    published = registry.read_manifest(settings.registry_dir / "news-tiny" / done["model"]["version"])
    assert published["layers"] == 2 and published["method"]["hyperparameters"]["student"]["recipe"] == "sct-tiny"
    assert published["int8"] is not None and published["int8"]["candidates"]
    assert published["base_model"] == "tiny6--sct-tiny"  # distilled into that student, from the adapted tiny6
    assert "adapt:news-tiny" in published["trained_on"] and "lee_background" in published["trained_on"]
    # the distillation's texts: the customer's and 16 of those the base student was built on, all toward the adapted
    # teacher's embeddings (this route's; a frozen model's targets: below)
    targets = _events(client, job["id"], "distillation_targets")[0]["distillation_targets"]
    assert targets["general_texts"] == 16 and targets["customer_texts"] > 0
    assert targets["general_targets"] == "adapted_teacher" and "base_student" not in targets
    # then the crop step, rehearsing the same 16 general texts under the adapted teacher's similarities
    rehearsal = _events(client, job["id"], "student_rehearsal")[0]["student_rehearsal"]
    assert rehearsal == {
        "general_texts": 16,
        "reference": "adapted_teacher",
        "weight": 1.0,
        "temperature": 0.2,
        "position_weight": 10.0,
    }
    assert _finished(client, again["id"])["state"] == "succeeded"

    # built once: the next job starts at once
    third = client.post("/adapt", json={**body, "name": "news-tiny-3", "promote": "never"}, headers=AUTH).json()
    assert third["after_job"] is None
    assert _finished(client, third["id"])["state"] == "succeeded"


def test_by_default_the_student_learns_the_base_teachers_embeddings_of_the_customers_texts_and_their_pieces(
    service: tuple[TestClient, ServiceSettings], corpus: list[str], tiny_bert6_path: Path
) -> None:
    """A second replica with the default student settings (the distillation cut to a few steps) over the same
    registry and job store: its job distils the base teacher's embeddings of the customer's texts — with their short
    pieces, sentences and word runs — and of the general texts; no crop step runs and nothing learns from an adapted
    teacher, so the job does not adapt one. Runs after the build of the first test (the registry holds
    tiny6--sct-tiny)."""
    _, first = service
    root = first.registry_dir.parent
    settings = ServiceSettings.from_flat(**_flat_settings(root, tiny_bert6_path))
    defaults, adapt = AdaptSettings(), settings.adapt
    chosen = ("student_distil_teacher", "student_distil_spans", "student_general_targets", "student_adapt_steps")
    expected = ["base_teacher", 8, "base_teacher", 0]
    assert [getattr(adapt, k) for k in chosen] == [getattr(defaults, k) for k in chosen] == expected
    with TestClient(create_app(settings)) as client:
        body = {"base_model": "tiny6", "name": "news-distil", "texts": corpus, "student": "sct-tiny",
                "promote": "never"}  # fmt: skip
        job = client.post("/adapt", json=body, headers=AUTH).json()
        assert job["after_job"] is None and job["student"]["distil_teacher"] == "base_teacher"
        done = _finished(client, job["id"])
        assert done["state"] == "succeeded", done["error"]
        stages = {e.get("stage") for e in _events(client, job["id"], "progress")}
        assert {"distilling", "distilled"} <= stages
        assert not {"training", "trained", "adapting student", "student adapted"} & stages  # no crop step anywhere
        assert _events(client, job["id"], "teacher_adaptation")[0]["teacher_adaptation"]["skipped"] is True
        assert not _events(client, job["id"], "student_rehearsal")
        targets = _events(client, job["id"], "distillation_targets")[0]["distillation_targets"]
        # the general texts' targets are the distillation's own teacher's, embedded when drawn; the customer's texts
        # are more than a document and a sentence of each (sct-tiny's text units): their pieces and word runs too
        assert targets["general_targets"] == targets["distil_teacher"] == "base_teacher"
        assert "base_teacher" not in targets  # nothing embedded ahead of the clock
        assert targets["customer_texts"] > 2 * len(corpus)
        assert set(done["evaluation"]["in_domain"]) == {"base_teacher", "base_student", "adapted_student"}
        assert done["gate"]["compared_with"]["base_teacher"]["decides"] is False


class _Recorder:
    """A job context that keeps what the job reports."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def stage(self, name: str, **data: Any) -> None:
        pass

    def result(self, data: JobResult, **_: Any) -> None:
        self.results.update(data.to_json())


def test_general_targets_from_a_frozen_model_are_given_to_the_trainer_and_kept_for_the_next_job(
    service: tuple[TestClient, ServiceSettings], corpus: list[str], tiny_bert6_path: Path, tmp_path: Path
) -> None:
    """With ``student_general_targets = base_student`` the general texts' targets are the base student's own
    embeddings, computed before the clock and kept in the cache's store; the customer's are left to the
    distillation's teacher. Runs after the build of the first test (the registry holds tiny6--sct-tiny)."""
    _, settings = service
    base = base_student_checkpoint(settings.registry_dir, "tiny6--sct-tiny")
    config = AdaptConfig(registry_dir=settings.registry_dir, cache_dir=tmp_path / "cache", settings=AdaptSettings())
    models = {"base_student": base, "base_teacher": tiny_bert6_path, "adapted_teacher": tiny_bert6_path}

    def targets(general_targets: str, distil_teacher: str = "adapted_teacher") -> tuple[Any, dict[str, Any]]:
        plan = dataclasses.replace(StudentPlan.build(AdaptSettings(), "sct-tiny"), max_steps=4, time_budget_s=None,
                                   distil_teacher=distil_teacher, general_texts=16, general_targets=general_targets,
                                   distil_spans=0)  # fmt: skip
        spec = dataclasses.replace(JobSpec.build(AdaptSettings(), base_model="tiny6", name="news"), student=plan)
        ctx = _Recorder()
        # what distillation_targets reads of an attempt: its context, config, spec, scratch and training documents
        attempt = Attempt(job=None, ctx=ctx, config=config, work=tmp_path, spec=spec, base_path=tiny_bert6_path,
                          split=HeldOutSplit(corpus[:8], [], []), rule=None, checks=None, labelled=None)  # fmt: skip
        general = recipe_training_texts(base / RECIPE_FILE)[:16]
        start = StudentStart("tiny6--sct-tiny", base, (), general, models, load_config("sct-tiny"))
        got = distillation_targets(attempt, start)
        return got, ctx.results["distillation_targets"]

    first, report = targets("base_student")
    assert report["base_student"]["embedded"] == 16 and report["customer_texts"] == len(first.texts) - 16
    given = read_vectors(first.path)
    assert set(given) == {text_key(t) for t in first.texts[-16:]}  # the general texts only
    student = cut_texts(Encoder.from_pretrained(base), 128).eval()
    with torch.no_grad():
        own = student(**student.tokenize([first.texts[-1]]))[0]
    torch.testing.assert_close(given[text_key(first.texts[-1])], own, atol=1e-5, rtol=0)  # its own embedding
    again, report = targets("base_student")
    assert report["base_student"]["embedded"] == 0 and again.texts == first.texts  # every vector from the store
    lazily, report = targets("adapted_teacher")
    assert lazily.path is None and "adapted_teacher" not in report  # the trainer's teacher embeds them when drawn
    lazily, report = targets("base_teacher", distil_teacher="base_teacher")
    assert lazily.path is None and "base_teacher" not in report
    # another model than the distillation's teacher: embedded before the clock, the adapted teacher's never stored
    ahead, report = targets("adapted_teacher", distil_teacher="base_teacher")
    assert ahead.path is not None and report["adapted_teacher"]["embedded"] == 16
    assert targets("adapted_teacher", distil_teacher="base_teacher")[1]["adapted_teacher"]["embedded"] == 16


def test_the_distillation_runs_at_the_plans_learning_rate_or_else_its_recipes(tmp_path: Path) -> None:
    """``student_distil_lr`` sets the distillation's peak learning rate (the default, 2e-4, twice sct-tiny's own);
    0, what a job stored before the setting ran with, keeps the student recipe's."""
    recipe = load_config("sct-tiny")
    config = AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=AdaptSettings())
    targets = DistillationTargets(texts=("a text.",), path=None)

    def lr(distil_lr: float) -> float:
        plan = dataclasses.replace(StudentPlan.build(AdaptSettings(), "sct-tiny"), distil_lr=distil_lr)
        spec = dataclasses.replace(JobSpec.build(AdaptSettings(), base_model="tiny6", name="news"), student=plan)
        attempt = Attempt(job=None, ctx=_Recorder(), config=config, work=tmp_path, spec=spec, base_path=tmp_path,
                          split=HeldOutSplit([], [], []), rule=None, checks=None, labelled=None)  # fmt: skip
        start = StudentStart("tiny6--sct-tiny", tmp_path / "student", (), [], {"base_teacher": tmp_path}, recipe)
        return distillation_config(attempt, start, targets).lr

    assert AdaptSettings().student_distil_lr == 2e-4 == lr(2e-4)
    assert lr(3e-4) == 3e-4
    assert lr(0.0) == recipe.lr == 1e-4


def test_the_cli_submits_a_corpus_file_follows_the_job_and_says_how_it_ended(
    service: tuple[TestClient, ServiceSettings], corpus: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    client, _ = service
    path = tmp_path / "news.jsonl"
    path.write_text("".join(json.dumps(text) + "\n" for text in corpus))
    argv = [str(path), "--base-model", "tiny6", "--name", "news-cli", "--student", "sct-tiny", "--max-steps", "3"]
    args = adapt_cli.parse_args([*argv, "--json"])
    client.headers.update(AUTH)  # what `embedder adapt --api-key` sets on its client
    try:
        code = adapt_cli.run(client, args)
        out, err = capsys.readouterr()
        assert out, err
        job = json.loads(out)
        assert job["state"] == "succeeded" and job["student"]["recipe"] == "sct-tiny"
        assert code == (0 if job["model"]["promoted"] else 3)  # 3: succeeded, but the gate kept the model back
        assert f"queued {job['id']}" in err and "distilling" in err and "adapting student" in err and "gate:" in err
        if job["model"]["promoted"]:  # the CLI waits until the server serves what it promoted, and says on what
            assert f"served: news-cli version {job['model']['version']} on " in err, err
        assert adapt_cli.run(client, adapt_cli.parse_args(["--job", "adaptjob-" + "0" * 24])) == 1
        assert "404" in capsys.readouterr().err
    finally:
        del client.headers["Authorization"]


def test_the_cli_waits_for_the_served_version_and_gives_up_after_its_timeout(
    service: tuple[TestClient, ServiceSettings],
) -> None:
    client, _ = service
    served = client.get("/v1/models/tiny-base").json()
    card = adapt_cli.wait_served(client, {"name": "tiny-base", "version": served["version"]}, timeout_s=5)
    assert card is not None and card["engine"] == served["engine"]
    started = time.monotonic()
    assert adapt_cli.wait_served(client, {"name": "tiny-base", "version": "999"}, timeout_s=1) is None
    assert adapt_cli.wait_served(client, {"name": "never-published", "version": "1"}, timeout_s=1) is None
    assert 2 <= time.monotonic() - started < 10


def test_unknown_students_and_reserved_names_are_refused(
    service: tuple[TestClient, ServiceSettings], corpus: list[str]
) -> None:
    client, _ = service
    body = {"base_model": "tiny6", "name": "news-x", "texts": corpus}
    r = client.post("/adapt", json={**body, "student": "bert-huge"}, headers=AUTH)
    assert r.status_code == 422 and "sct-tiny" in r.text
    r = client.post("/adapt", json={**body, "name": "mine--distil-tiny"}, headers=AUTH)
    assert r.status_code == 422 and "base students" in r.text
