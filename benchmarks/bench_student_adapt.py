"""How an /adapt job's student gets its in-domain gain: distillation of the adapted teacher, then the crop recipe on
the student — the ablation behind the defaults of ``student_time_budget_s``, ``student_adapt_steps`` and
``student_adapt_lr`` (docs/BENCHMARKS.md, "Adapt: a compact student").

It rebuilds what a job does on bench_adapt's corpus sample (same documents, split, crop rule and held-out crops), in
process, without the service: adapt minilm-l6 with the job's defaults, distil it into the base student (the
``student_build`` of a bench_adapt run: ``<workdir>/registry/minilm-l6--sct-tiny/current/checkpoint``) with the
job's distillation settings, then run each crop variant on the distilled student; prints the held-out
CropPairRetrieval nDCG@10 of every model.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_student_adapt.py \\
        --student runs/bench-student/registry/minilm-l6--sct-tiny/current/checkpoint \\
        --variant last=2,lr=2e-5 --variant last=0,lr=1e-4 --variant last=0,lr=2e-4 \\
        --variant last=0,lr=5e-5,anchor=1,steps=100
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench_adapt import load_corpus, parse_variant

from adapt.pipeline import split_corpus
from adapt.settings import AdaptSettings
from adapt.spec import JobSpec
from adapt.stages import adapt_config
from core.catalog import resolve_model
from core.text import choose_crop_rule
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.suite import run_suite
from evaluation.tasks import CropPairRetrieval
from training.config import TrainConfig, load_config
from training.data import load_corpus as general_corpus
from training.encoder import Encoder
from training.torch_model import TorchModel
from training.trainer import train


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--student", type=Path, required=True, help="the base student's checkpoint folder")
    p.add_argument("--corpus", default="imdb")
    p.add_argument("--documents", type=int, default=1000)
    p.add_argument("--recipe", default="sct-tiny")
    p.add_argument("--variant", action="append", default=[], help="crop step: last=K (0 = all),lr=,anchor=,steps=")
    p.add_argument("--out", type=Path, default=Path("runs/bench-student-adapt"))
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    settings = AdaptSettings()
    texts, _labels = load_corpus(args.corpus, args.documents, 0, 20_000)
    split = split_corpus(texts, seed=0)
    rule = choose_crop_rule(split.train)
    held = CropPairRetrieval.from_corpus(split.held_out, seed=0, name=IN_DOMAIN_TASK, rule=rule)
    spec = JobSpec.build(settings, base_model="minilm-l6", name="bench", student=args.recipe)
    plan = spec.student
    assert plan is not None

    def score(path: Path) -> float:
        report = run_suite(TorchModel(Encoder.from_pretrained(path)), [held], progress=False)
        return round(report["scores"][IN_DOMAIN_TASK], 3)

    results: dict[str, Any] = {"base_student": score(args.student)}
    teacher = resolve_model("minilm-l6")
    results["base_teacher"] = score(teacher)
    tick = time.perf_counter()
    adapted = train(adapt_config(spec, teacher, split.train, args.out / "teacher", threads=args.threads),
                    crop_rule=rule).best_dir  # fmt: skip
    results["adapted_teacher"] = {"in_domain": score(adapted), "s": round(time.perf_counter() - tick, 1)}
    print(json.dumps(results), flush=True)

    recipe = load_config(args.recipe)
    general = general_corpus(recipe.corpus, max_documents=plan.general_documents, seed=0)
    distil = TrainConfig(
        name="distil", model=str(args.student), teacher=str(adapted), max_seq_length=recipe.max_seq_length,
        objective=recipe.objective, objective_params=recipe.objective_params, views=recipe.views,
        text_sentences=recipe.text_sentences, corpus=tuple(split.train) + tuple(general), validation=None,
        max_steps=plan.max_steps, epochs=None, time_budget_s=plan.time_budget_s, batch_size=recipe.batch_size,
        lr=recipe.lr, warmup=recipe.warmup, grad_clip=recipe.grad_clip, seed=0, num_threads=args.threads,
        output_dir=str(args.out / "distil"), progress_bar=False,
    )  # fmt: skip
    done = train(distil)
    results["distilled"] = {"in_domain": score(done.best_dir), "steps": done.steps, "s": round(done.elapsed, 1)}
    print(json.dumps({"distilled": results["distilled"]}), flush=True)

    results["crop_variants"] = []
    for i, text in enumerate(args.variant):
        v = parse_variant(text)
        config = adapt_config(
            spec, done.best_dir, split.train, args.out / f"crop-{i}", threads=args.threads,
            lr=float(v.get("lr", plan.adapt_lr)), train_last_layers=int(v.get("last", 0)) or None,
            max_steps=int(v.get("steps", plan.adapt_steps)), time_budget_s=None,
        )  # fmt: skip
        config = dataclasses.replace(config, anchor_weight=float(v.get("anchor", config.anchor_weight)))
        tick = time.perf_counter()
        best = train(config, crop_rule=rule).best_dir
        row = {"variant": v, "in_domain": score(best), "s": round(time.perf_counter() - tick, 1)}
        results["crop_variants"].append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
