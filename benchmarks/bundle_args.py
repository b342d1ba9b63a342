"""The command line of the in-process benchmarks of one bundle's engines (`bench_ov_int8.py`, `bench_routes.py`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

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
