"""How far apart must two models' scores be before a task tells them apart?

Scores a torch model and copies of it moved a small way in weight space — each weight tensor plus Gaussian noise of
``--noise`` times its own standard deviation (``--draws`` seeds), and, with ``--toward``, the weights interpolated a
fraction ``--alphas`` of the way to a second model of the same shape — on the given offline tasks, and measures how
far each copy moved in function space (mean cosine between its embeddings and the model's of 500 Wikipedia
paragraphs, text no offline task uses). A task whose score swings by points while the embeddings barely move cannot
resolve differences of that size: read a comparison on it (e.g. /adapt's out-of-domain check) with that in mind.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/score_resolution.py \\
        runs/bench-student/registry/minilm-l6--sct-tiny/1/checkpoint --noise 0.01 --draws 3 \\
        --tasks BBCNewsClustering BBCNewsKNN BBCNewsClassification BibleParaphraseRetrieval \\
        PyDocSummaryRetrieval PyDocModuleClustering
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from report_file import write_report

from core.runtime import cpu_features, cpu_text
from evaluation.suite import run_suite
from training.data import enwiki_paragraphs
from training.encoder import Encoder
from training.torch_model import TorchModel

PROBE_TEXTS = 500


def with_noise(model: Path, scale: float, seed: int) -> Encoder:
    """``model`` with each floating tensor moved by ``scale`` × its std × N(0, 1) (seeded)."""
    encoder = Encoder.from_pretrained(model)
    generator = torch.Generator().manual_seed(seed)
    state = encoder.state_dict()
    for key, value in state.items():
        if value.is_floating_point() and value.numel() > 1:
            noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
            state[key] = value + scale * value.std() * noise
    encoder.load_state_dict(state)
    return encoder


def interpolated(model: Path, toward: Path, alpha: float) -> Encoder:
    """``(1 − alpha) · model + alpha · toward``, tensor by tensor (both of one architecture)."""
    encoder = Encoder.from_pretrained(model)
    other = Encoder.from_pretrained(toward).state_dict()
    state = encoder.state_dict()
    encoder.load_state_dict(
        {k: (1 - alpha) * v + alpha * other[k] if v.is_floating_point() else v for k, v in state.items()}
    )
    return encoder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a torch model folder (e.g. a base student's checkpoint/)")
    parser.add_argument("--tasks", nargs="+", required=True, help="offline task names")
    parser.add_argument("--noise", type=float, default=0.01, help="noise per tensor, in units of its std")
    parser.add_argument("--draws", type=int, default=3, help="noisy copies (seeds 0..draws-1)")
    parser.add_argument("--toward", type=Path, default=None, help="a second model to interpolate toward")
    parser.add_argument("--alphas", type=float, nargs="*", default=[0.02, 0.05], help="with --toward")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    copies: dict[str, Encoder] = {"model": Encoder.from_pretrained(args.model)}
    copies.update({f"noise {args.noise} seed {s}": with_noise(args.model, args.noise, s) for s in range(args.draws)})
    if args.toward is not None:
        copies.update({f"alpha {a}": interpolated(args.model, args.toward, a) for a in args.alphas})
    probe = enwiki_paragraphs()[:PROBE_TEXTS]
    rows: dict[str, dict[str, float]] = {}
    reference = None
    for name, encoder in copies.items():
        model = TorchModel(encoder.eval())
        vectors = model.encode(probe)
        reference = vectors if reference is None else reference
        cosine = float(np.mean(np.sum(vectors * reference, axis=1)))
        scores = run_suite(model, args.tasks, progress=False)["scores"]
        average = float(np.mean([scores[t] for t in args.tasks]))
        rows[name] = {"probe_cosine": round(cosine, 5), **{t: round(v, 2) for t, v in scores.items()},
                      "average": round(average, 2)}  # fmt: skip
        print(name, json.dumps(rows[name]), flush=True)

    base = rows["model"]
    swing = {t: round(max(abs(r[t] - base[t]) for r in rows.values()), 2) for t in [*args.tasks, "average"]}
    cpu = cpu_features()
    print(f"\nCPU: {cpu_text(cpu)}")
    print(f"{'task':32s} {'model':>8s} {'largest |change| of a copy':>28s}")
    for task in swing:
        print(f"{task:32s} {base[task]:8.2f} {swing[task]:28.2f}")
    print("lowest probe cosine of a copy:", min(r["probe_cosine"] for r in rows.values()))
    report = {"cpu": cpu, "model": str(args.model), "rows": rows, "largest_change": swing}
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
