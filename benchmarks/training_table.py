"""Tables of training runs for docs/RESULTS.md `## Training`, read from their `runs/NAME/result.json`:
the held-out crop-pair score (nDCG@10, points) at every validation step, and the held-out crops' effective rank.

    .venv/bin/python benchmarks/training_table.py runs/exp-crop runs/exp-dropout runs/exp-crop-last2
    .venv/bin/python benchmarks/training_table.py --every 100 runs/sct-tiny runs/student-mse runs/tmft
    .venv/bin/python benchmarks/training_table.py --seeds runs/rr-g0-s0 runs/rr-g0-s1 runs/rr-g0-s2 \\
        --seeds runs/rr-g0.1-s0 runs/rr-g0.1-s1 runs/rr-g0.1-s2

The first form prints one row per run (a curve over steps); ``--seeds`` prints one row per group of runs
that differ only in their seed: mean ± std of the final score, effective rank, alignment and uniformity.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(run: Path) -> dict[str, Any]:
    result = json.loads((run / "result.json").read_text())
    recipe = json.loads((run / "recipe.json").read_text())
    return {"name": run.name, "recipe": recipe, "result": result}


def describe(recipe: dict[str, Any]) -> str:
    what = f"{recipe['objective']} on {recipe['views']} views"
    if recipe.get("train_last_layers"):
        what += f", last {recipe['train_last_layers']} layers"
    if recipe.get("rank_reduction"):
        what += f", RR γ={recipe['rank_reduction']}"
    return what


def curves(runs: list[dict[str, Any]], every: int | None = None) -> None:
    steps = sorted({e["step"] for run in runs for e in run["result"]["evaluations"]})
    if every:
        steps = [s for s in steps if s % every == 0]
    header = ["run", "what", *[f"step {s}" for s in steps], "best (step)", "eff. rank (last)", "train s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for run in runs:
        by_step = {e["step"]: e for e in run["result"]["evaluations"]}
        last = run["result"]["evaluations"][-1]
        cells = [f"`{run['name']}`", describe(run["recipe"])]
        cells += [f"{by_step[s]['score']:.2f}" if s in by_step else "" for s in steps]
        best = max(run["result"]["evaluations"], key=lambda e: e["score"])
        cells.append(f"{best['score']:.2f} ({best['step']})")
        cells += [f"{last.get('effective_rank', float('nan')):.1f}", f"{run['result']['elapsed']:.0f}"]
        print("| " + " | ".join(cells) + " |")


def seed_groups(groups: list[list[dict[str, Any]]]) -> None:
    keys = [("score", "held-out nDCG@10"), ("effective_rank", "eff. rank"), ("alignment", "alignment")]
    keys.append(("uniformity", "uniformity"))
    header = ["runs", "what", "seeds", *[label for _, label in keys]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for runs in groups:
        finals = [run["result"]["evaluations"][-1] for run in runs]
        cells = [", ".join(f"`{r['name']}`" for r in runs), describe(runs[0]["recipe"]), str(len(runs))]
        for key, _ in keys:
            values = [f[key] for f in finals]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.3f} ± {spread:.3f}")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (runs/NAME) to print as curves")
    parser.add_argument("--every", type=int, help="print only the steps that are multiples of this (long runs)")
    parser.add_argument("--seeds", nargs="+", type=Path, action="append", default=[], help="one group of seeds")
    args = parser.parse_args(argv)
    if not args.runs and not args.seeds:
        parser.error("give run folders, or --seeds groups")
    missing = [p for p in [*args.runs, *(p for g in args.seeds for p in g)] if not (p / "result.json").is_file()]
    if missing:
        parser.error(f"no result.json in {', '.join(map(str, missing))} (has the run finished?)")
    if args.runs:
        curves([load(p) for p in args.runs], args.every)
    if args.seeds:
        seed_groups([[load(p) for p in group] for group in args.seeds])
    return 0


if __name__ == "__main__":
    sys.exit(main())
