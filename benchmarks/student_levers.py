"""The levers of a compact student adapted to an unseen domain, measured on its real task.

Runs the student stage of a `bench_adapt.py --variant student=sct-tiny` job outside the service — the same 1,000
documents, the job's seeded split and crop rule, its spec with the service's defaults (`JobSpec.build`) —
for each variant, then scores the base student, each adapted student and (with ``--teacher``) the teacher on the
job's checks and the domain's real task (`domain_checks.py`):

- ``default``: the job's crop step on the base student with its rehearsal (what the job's student stage runs);
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
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench_adapt import unseen_documents
from domain_checks import score
from report_file import write_report

from adapt_jobs.settings import AdaptSettings
from adapt_jobs.spec import JobSpec
from adapt_worker.attempt import split_corpus
from adapt_worker.stages import crop_train_config
from core.catalog import resolve_model
from core.model_folder import RECIPE_FILE
from core.runtime import cpu_features
from core.text import choose_crop_rule, split_sentences
from evaluation.domain_checks import PIECES, short_piece
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.tasks import CropPairRetrieval
from training.config import TrainConfig, load_config
from training.data import text_units
from training.inputs import recipe_training_texts
from training.trainer import train

UNBOUNDED_S = 86_400.0
VARIANTS = ("default", "distil", "distil-only", "adapted-distil", "adapted-distil-only", "adapted-teacher")


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
    short pieces (`evaluation.domain_checks.PIECES`: its first sentence, its first words, its most central sentence)
    — the shape of a customer's queries; with ``spans`` also every sentence of each document and ``spans`` seeded
    runs of 3–12 of its words (name-like phrases)."""
    recipe = load_config("sct-tiny")
    customer = text_units(documents, recipe.text_sentences, seed=seed)
    if pieces:
        customer += [found[0] for doc in documents for kind in PIECES if (found := short_piece(doc, kind))]
    if spans:
        rng = random.Random(seed)
        for doc in documents:
            customer += split_sentences(doc)
            words = doc.split()
            for _ in range(spans if len(words) > 12 else 0):
                n = rng.randint(3, 12)
                at = rng.randrange(len(words) - n)
                customer.append(" ".join(words[at : at + n]))
    config = TrainConfig(
        name="lever-distil", model=str(base), teacher=str(teacher), max_seq_length=recipe.max_seq_length,
        objective=recipe.objective, objective_params=recipe.objective_params, views=recipe.views, text_sentences=0,
        corpus=tuple(customer) + tuple(general[: len(customer)]), validation=None, max_steps=steps, epochs=None,
        time_budget_s=budget, batch_size=recipe.batch_size, lr=recipe.lr, warmup=recipe.warmup,
        grad_clip=recipe.grad_clip, seed=seed, num_threads=2, output_dir=str(out), progress_bar=False, log_every=10,
    )  # fmt: skip
    return train(config, cache_dir=cache)


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
    parser.add_argument("--crop-steps", type=int, default=None, help="default: the service's student_adapt_steps")
    parser.add_argument("--steps-only", action="store_true", help="no time budgets (a busy machine): steps decide")
    parser.add_argument("--workdir", type=Path, default=Path("runs/levers"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {} if args.crop_steps is None else {"student_adapt_steps": args.crop_steps}
    if args.steps_only:
        overrides |= {"time_budget_s": UNBOUNDED_S, "student_adapt_time_budget_s": UNBOUNDED_S}
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
        if not variant.endswith(("-only", "-teacher")):  # adapted-distil ends with the crop step too
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
              + f" | real {row['real']:.2f} ({row['real_task']})", flush=True)  # fmt: skip
    write_report(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
