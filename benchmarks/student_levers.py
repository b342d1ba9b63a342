"""The levers of a compact student adapted to an unseen domain, measured on its real task.

Runs the student stage of a `bench_adapt.py --variant student=sct-tiny` job outside the service — the same 1,000
documents, the job's seeded split and crop rule, its spec with the service's defaults (`JobSpec.build`) —
for each variant, then scores the base student, each adapted student and (with ``--teacher``) the teacher on the
job's checks and the domain's real task (`domain_checks.py`):

- ``job-distil``: the job's own distillation stage (`adapt_worker.student.distil` on the job's attempt: its spec
  from the service's settings, split and general texts) — what a default student job trains before its export;
- ``default``: the crop step on the base student with its rehearsal (``student_adapt_steps``, or 120 when the
  settings run none), the job's student step when the settings ask for a crop step;
- ``distil``: first distil the *unadapted* teacher into the base student (the recipe's SCT + MSE on whole texts: the
  customer's training documents and a sentence of each, plus as many of the base student's own texts — whose targets
  are the teacher's, as in the build), ``--distil-steps`` steps or ``--distil-budget`` seconds, then the same crop step;
- ``distil-only``: the distillation alone;
- ``adapted-distil``: the job's crop fine-tune of the teacher first, then that *adapted* teacher distilled into the
  base student as in ``distil`` (its targets computed for this run), then the crop step;
- ``adapted-distil-only``: ``adapted-distil`` without the crop step (the adapted teacher distilled, nothing after);
- ``adapted-teacher``: the job's crop fine-tune of the teacher itself (what a job without a student publishes) —
  needs no base student (``--base-student`` may be left out), and is the pair that tests whether a check rewards
  what adapting learns while the real task falls.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/student_levers.py --domain cwe --seed 0 \\
        --base-student runs/sct-tiny-base/best --variants default,distil \\
        --workdir runs/levers --out runs/levers_cwe_0.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench_adapt import unseen_documents
from domain_checks import real_text, score
from report_file import write_report

from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.spec import JobSpec
from adapt_worker.attempt import Attempt, split_corpus
from adapt_worker.stages import crop_train_config
from adapt_worker.student import StudentStart
from adapt_worker.student import distil as job_distil  # the stage, beside this file's own distil
from core.catalog import resolve_model
from core.model_folder import RECIPE_FILE
from core.runtime import cpu_features
from core.text import choose_crop_rule
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.tasks import CropPairRetrieval
from training.config import TrainConfig, load_config
from training.data import document_pieces, query_units, text_units
from training.inputs import recipe_training_texts
from training.trainer import train

UNBOUNDED_S = 86_400.0
VARIANTS = ("job-distil", "default", "distil", "distil-only", "adapted-distil", "adapted-distil-only",
            "adapted-teacher")  # fmt: skip


def crop_step(spec: JobSpec, base: Path, start: Path, documents: list[str], rule: Any, general: list[str], out: Path):
    """The job's crop step on the student (as `adapt_worker.student.crop_step` runs it), from ``start``."""
    plan = spec.student
    assert plan is not None
    rehearsal = {"rehearsal_weight": plan.rehearsal_weight, "rehearsal_texts": tuple(general),
                 "rehearsal_model": str(base), "rehearsal_temperature": plan.rehearsal_temperature,
                 "rehearsal_position_weight": plan.rehearsal_position_weight}  # fmt: skip
    config = crop_train_config(spec, start, documents, out, threads=2).replace(
        lr=plan.adapt_lr, train_last_layers=None, max_steps=plan.adapt_steps, time_budget_s=plan.adapt_time_budget_s,
        **rehearsal,
    )  # fmt: skip
    return train(config, crop_rule=rule)


def distil(base: Path, teacher: Path, documents: list[str], general: list[str], seed: int, steps: int, budget: float,
           out: Path, cache: Path, pieces: bool = False, spans: int = 0):  # fmt: skip
    """The recipe's objective on whole texts toward the teacher's embeddings (computed when drawn, kept in ``cache``
    for the next run of the same texts); with ``pieces`` the customer's texts also include each training document's
    short pieces (`training.data.document_pieces`) — the shape of a customer's queries; with ``spans`` those, every
    sentence of each document and ``spans`` seeded runs of 3–12 of its words (`training.data.query_units`, as the
    job's distillation cuts them)."""
    recipe = load_config("sct-tiny")
    customer = text_units(documents, recipe.text_sentences, seed=seed)
    if spans:
        customer += query_units(documents, spans, seed=seed)
    elif pieces:
        customer += document_pieces(documents)
    config = TrainConfig(
        name="lever-distil", model=str(base), teacher=str(teacher), max_seq_length=recipe.max_seq_length,
        objective=recipe.objective, objective_params=recipe.objective_params, views=recipe.views, text_sentences=0,
        corpus=tuple(customer) + tuple(general[: len(customer)]), validation=None, max_steps=steps, epochs=None,
        time_budget_s=budget, batch_size=recipe.batch_size, lr=recipe.lr, warmup=recipe.warmup,
        grad_clip=recipe.grad_clip, seed=seed, num_threads=2, output_dir=str(out), progress_bar=False, log_every=10,
    )  # fmt: skip
    return train(config, cache_dir=cache)


class _Unreported:
    """The context of a stage run outside a worker: nothing to report to, never stopped."""

    def stage(self, name: str, **data: Any) -> None:
        pass

    def progress(self, data: dict[str, Any], *, force: bool = False) -> None:
        pass

    def result(self, data: Any, *, event: str | None = None) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def check(self) -> None:
        pass


def job_distillation(spec: JobSpec, settings: AdaptSettings, base: Path, split: Any, rule: Any, general: list[str],
                     out: Path, max_length: int | None = None) -> Path:  # fmt: skip
    """The job's distillation stage on this split, as a worker runs it (`adapt_worker.student.distil`); its best
    checkpoint. ``max_length`` replaces the recipe's token limit for the distillation's texts."""
    config = AdaptConfig(registry_dir=out / "registry", cache_dir=out / "cache", settings=settings)
    attempt = Attempt(job=None, ctx=_Unreported(), config=config, work=out, spec=spec,  # type: ignore[arg-type]
                      base_path=resolve_model(spec.base_model), split=split, rule=rule, checks=None,
                      labelled=None)  # fmt: skip
    models = {"base_student": base, "base_teacher": attempt.base_path}
    recipe = load_config(spec.student.recipe)
    if max_length is not None:
        recipe = recipe.replace(max_seq_length=max_length)
    start = StudentStart("minilm-l6--sct-tiny", base, (), general, models, recipe)
    return job_distil(attempt, start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", required=True, help="drug, cwe, hpo or spdx")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-student", type=Path, default=None, help="the base student's torch checkpoint")
    parser.add_argument("--teacher", default=None, help="also score this model (e.g. minilm-l6)")
    parser.add_argument("--variants", default="default,distil")
    parser.add_argument("--distil-steps", type=int, default=60)
    parser.add_argument("--distil-pieces", action="store_true", help="distil the short pieces of the documents too")
    parser.add_argument("--distil-spans", type=int, default=0, help="every sentence, N word runs per document")
    parser.add_argument("--distil-budget", type=float, default=120.0)
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--distil-max-length", type=int, default=None,
                        help="job-distil: the distillation's token limit (default: the student recipe's)")  # fmt: skip
    parser.add_argument("--crop-steps", type=int, default=None,
                        help="default: the service's student_adapt_steps, or 120 when it is 0")  # fmt: skip
    parser.add_argument("--steps-only", action="store_true", help="no time budgets (a busy machine): steps decide")
    parser.add_argument("--workdir", type=Path, default=Path("runs/levers"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    crop_steps = 120 if args.crop_steps is None and not AdaptSettings().student_adapt_steps else args.crop_steps
    overrides: dict[str, Any] = {} if crop_steps is None else {"student_adapt_steps": crop_steps}
    if args.steps_only:
        overrides |= {"time_budget_s": UNBOUNDED_S, "student_adapt_time_budget_s": UNBOUNDED_S,
                      "student_time_budget_s": UNBOUNDED_S}  # fmt: skip
        args.distil_budget = UNBOUNDED_S
    settings = AdaptSettings(**overrides)
    spec = JobSpec.build(settings, base_model="minilm-l6", name="lever", seed=args.seed, student="sct-tiny")
    plan = spec.student
    assert plan is not None
    docs = unseen_documents(args.domain, args.documents, 0, max_chars=20_000)  # bench_adapt's draw (its --seed 0)
    split = split_corpus([d.text for d in docs], seed=args.seed)
    rule = choose_crop_rule(split.train)
    crops = CropPairRetrieval.from_corpus(split.held_out, seed=args.seed, name=IN_DOMAIN_TASK, rule=rule).crop_pairs()
    base = args.base_student
    recipe = None if base is None else next(p for p in (base / RECIPE_FILE, base.parent / RECIPE_FILE) if p.is_file())
    own = recipe_training_texts(recipe) if recipe is not None else []  # a bundle's checkpoint/ or a run's best/
    general = random.Random(args.seed).sample(own, min(plan.general_texts, len(own)))
    cache = args.workdir / "cache"
    teacher = resolve_model("minilm-l6")
    work = args.workdir / f"{args.domain}-{args.seed}"
    results: dict[str, Any] = {"domain": args.domain, "seed": args.seed, "cpu": cpu_features(), "variants": {}}
    models = {**({"base_student": str(base)} if base else {}), **({"teacher": args.teacher} if args.teacher else {})}
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}: use {', '.join(VARIANTS)}")
        if base is None and variant != "adapted-teacher":
            parser.error(f"the variant {variant!r} needs --base-student")
        tick, stages = time.perf_counter(), {}
        start = base
        if variant == "job-distil":
            tick_stage = time.perf_counter()
            start = job_distillation(spec, settings, base, split, rule, general, work / variant,
                                     args.distil_max_length)  # fmt: skip
            run_result = json.loads((start.parent / "result.json").read_text())  # the steps a time budget allowed
            stages["distil"] = {"steps": run_result["steps"], "stopped_by": run_result["stopped_by"],
                                "seconds": round(time.perf_counter() - tick_stage, 1)}  # fmt: skip
        if variant in ("adapted-teacher", "adapted-distil", "adapted-distil-only"):
            run = train(crop_train_config(spec, teacher, split.train, work / variant, threads=2), crop_rule=rule)
            steps_taken = {"steps": run.steps, "seconds": round(run.elapsed, 1)}
            stages["teacher_crops" if variant != "adapted-teacher" else "crops"] = steps_taken
            start = run.best_dir
        if variant.startswith("adapted-distil"):
            run = distil(base, start, split.train, general, args.seed, args.distil_steps, args.distil_budget,
                         work / f"{variant}-distil", work / f"{variant}-cache", args.distil_pieces,
                         args.distil_spans)  # fmt: skip
            stages["distil"] = {"steps": run.steps, "seconds": round(run.elapsed, 1)}
            start = run.best_dir
        elif variant.startswith("distil"):
            run = distil(base, teacher, split.train, general, args.seed, args.distil_steps, args.distil_budget,
                         work / f"{variant}-distil", cache, args.distil_pieces, args.distil_spans)  # fmt: skip
            stages["distil"] = {"steps": run.steps, "seconds": round(run.elapsed, 1)}
            start = run.best_dir
        if not variant.endswith(("-only", "-teacher", "job-distil")):  # adapted-distil ends with the crop step too
            run = crop_step(spec, base, start, split.train, rule, general, work / f"{variant}-crops")
            stages["crops"] = {"steps": run.steps, "seconds": round(run.elapsed, 1)}
            start = run.best_dir
        results["variants"][variant] = {"stages": stages, "seconds": round(time.perf_counter() - tick, 1)}
        models[variant] = str(start)
        print(f"{variant}: {stages}", flush=True)
    for role, model in models.items():
        results.setdefault("scores", {})[role] = score(model, args.domain, docs, split, crops, args.seed)
        row = results["scores"][role]
        print(f"{args.domain} s{args.seed} {role:>12s}: " + " ".join(f"{k} {v:.2f}" for k, v in row["checks"].items())
              + f" | {real_text(row)}", flush=True)  # fmt: skip
    write_report(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
