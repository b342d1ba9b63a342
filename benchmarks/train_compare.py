"""Score trained models side by side for docs/RESULTS.md `## Training`: the offline suite, an optional in-domain
held-out crop-pair task (the validation documents of a recipe), and encoding speed.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_compare.py minilm-l6 minilm-l3 runs/sct-tiny/best \\
        --baseline minilm-l6 --speed --out runs/compare-sct.json

    # in-domain: add CropPairRetrieval over the held-out documents of the run's recipe
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_compare.py runs/exp1-crop/final runs/exp1-dropout/final \\
        minilm-l6 --heldout-from runs/exp1-crop/recipe.json --tasks ACLSumRetrieval

Prints a markdown table (task scores in points; per model the average of its out-of-domain tasks — the headline —
and of its in-domain ones, judged by the corpora it declares, `evaluation.suite.domain_split`; the out-of-domain
average relative to the baseline's on the same tasks; and texts/s for 32-text batches of short and long texts,
measured one model after the other in the same process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from report_file import write_report


def heldout_task(recipe_json: Path) -> Any:
    """`CropPairRetrieval` over the validation documents a training run held out (same split, same seed)."""
    from core.model_folder import TRAINED_ON_KEY
    from evaluation.tasks.crops import CropPairRetrieval
    from training.config import from_dict
    from training.data import corpus_names, load_corpus, split_documents

    recipe = json.loads(recipe_json.read_text())
    recipe.pop(TRAINED_ON_KEY, None)  # what the trainer derived from the config, not a config key
    config = from_dict(recipe)
    corpus = list(config.corpus) if isinstance(config.corpus, tuple) else config.corpus
    documents = load_corpus(corpus, max_documents=config.max_documents, seed=config.seed)
    split = split_documents(
        documents, config.validation_fraction, seed=config.seed, max_validation=config.max_validation_documents
    )
    task = CropPairRetrieval.from_corpus(split.validation, seed=config.seed, name="InDomainHeldOutCrops")
    task.source_corpus = corpus_names(corpus)[0]  # the recipe's documents: in-domain for the models trained on it
    return task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="built-in names or model folders (e.g. runs/NAME/best)")
    parser.add_argument("--baseline", help="model the 'vs baseline' column divides by (default: the first)")
    parser.add_argument("--tasks", nargs="*", help="suite task names (default: every task)")
    parser.add_argument("--heldout-from", type=Path, help="a run's recipe.json: add its held-out crop-pair task")
    parser.add_argument("--speed", action="store_true", help="also measure texts/s (batch 32, short and long texts)")
    parser.add_argument("--speed-rounds", type=int, default=3, help="alternating speed rounds (median is reported)")
    parser.add_argument("--out", type=Path, help="write the raw numbers here as JSON")
    args = parser.parse_args(argv)

    from core.settings import get_settings
    from evaluation.diagnostics import effective_rank
    from evaluation.speed import measure_speed
    from evaluation.suite import run_suite
    from evaluation.tasks import DEFAULT_TASKS, resolve_task
    from training.torch_model import load_any

    tasks = [resolve_task(t) for t in (args.tasks or DEFAULT_TASKS)]
    if args.heldout_from:
        tasks.append(heldout_task(args.heldout_from))
    names = [t.metadata.name for t in tasks]
    rows: dict[str, dict[str, Any]] = {}
    settings = get_settings()
    models = {spec: load_any(spec, registry_dir=settings.registry_dir) for spec in args.models}
    rank_texts = [text for pair in tasks[-1].crop_pairs() for text in pair] if args.heldout_from else []
    for spec, model in models.items():
        report = run_suite(model, tasks, progress=False, cache=settings.cache_dir)
        rows[spec] = {
            "scores": report["scores"],
            "domains": report["domains"],
            "layers": getattr(model, "num_layers", None),
            "dim": model.dim,
        }
        if rank_texts:  # paper 002 §2.2.1: effective rank of the in-domain held-out crop embeddings
            rows[spec]["heldout_effective_rank"] = effective_rank(model.encode(rank_texts))
        print(f"scored {spec}: {report['scores']}", file=sys.stderr, flush=True)
    if args.speed:
        # rounds that alternate the models, then the median per model: load from other processes on a shared
        # machine then hits every model alike instead of whichever happened to run during a busy minute
        samples: dict[str, dict[str, list[float]]] = {spec: {} for spec in models}
        for _ in range(args.speed_rounds):
            for spec, model in models.items():
                speed = measure_speed(model, batch_sizes=(32,), calls=8, progress=False)
                for setting in speed["settings"]:
                    samples[spec].setdefault(setting["texts"], []).append(setting["texts_per_s"])
        for spec in models:
            rows[spec]["texts_per_s"] = {k: statistics.median(v) for k, v in samples[spec].items()}
            rows[spec]["texts_per_s_samples"] = samples[spec]
    baseline = args.baseline or args.models[0]
    if baseline not in rows:
        parser.error(f"--baseline {baseline!r} must be one of the models")

    def average(spec: str, part: str) -> str:
        value = rows[spec]["domains"][part]["average"]
        return "-" if value is None else f"{value:.2f}"

    def versus_baseline(spec: str) -> str:
        tasks = rows[spec]["domains"]["out_of_domain"]["tasks"]
        if not tasks:
            return "-"
        ours, theirs = (statistics.fmean(rows[s]["scores"][n] for n in tasks) for s in (spec, baseline))
        return f"{100 * ours / theirs:.1f} %"

    header = ["model", "layers", "dim", *names, "out-of-domain avg", "in-domain avg", f"out-of-domain vs {baseline}"]
    if rank_texts:
        header.append("eff. rank (held-out)")
    if args.speed:
        header += ["texts/s short", "texts/s long", "speed-up"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for spec, row in rows.items():
        cells = [f"`{spec}`", str(row["layers"]), str(row["dim"])]
        cells += [f"{row['scores'][n]:.2f}" for n in names]
        cells += [average(spec, "out_of_domain"), average(spec, "in_domain"), versus_baseline(spec)]
        if rank_texts:
            cells.append(f"{row['heldout_effective_rank']:.1f}")
        if args.speed:
            tps, base = row["texts_per_s"], rows[baseline]["texts_per_s"]
            ratio = statistics.geometric_mean([tps[k] / base[k] for k in tps])
            cells += [f"{tps['short']:.0f}", f"{tps['long']:.1f}", f"{ratio:.2f}×"]
        print("| " + " | ".join(cells) + " |")
    print()
    for spec, row in rows.items():
        domains = row["domains"]
        declared = ", ".join(domains["trained_on"]) or "none declared (every task out-of-domain)"
        print(f"- `{spec}` trained on {declared}; in-domain: {', '.join(domains['in_domain']['tasks']) or '-'}")
    write_report(args.out, {"tasks": names, "baseline": baseline, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
