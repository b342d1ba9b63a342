"""The command line of the in-process benchmarks of one bundle's engines (`bench_ov_int8.py`, `bench_routes.py`,
`bench_int8_precision.py`, `bench_concurrent_batches.py`), and the bundle's probes they check parity on."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from core.runtime import read_probes

MAX_ROUNDS = 20


def bundle_arguments(doc: str, rounds: int, argv: list[str] | None = None) -> argparse.Namespace:
    """``--bundle``, ``--threads``, ``--rounds`` (default ``rounds``, at most `MAX_ROUNDS`) and ``--out``, parsed."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle folder with int8 and fp32 graphs")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"keep it bounded: 1-{MAX_ROUNDS} rounds")
    return args


def bundle_probes(bundle: Path) -> tuple[list[str], np.ndarray]:
    """The bundle's probe texts and their fp32 (torch) reference embeddings; exits saying what to do without them."""
    probes = read_probes(bundle)
    if probes is None:
        raise SystemExit(f"{bundle} stores no probes: re-export it")
    return probes
