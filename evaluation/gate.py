"""The rollout gate: a candidate may replace a baseline only if no task drops too far and it is fast enough.

Used by ``embedder validate --baseline`` (exit code), export (before publishing a bundle) and, through
`adapt_gate`, the ``/adapt`` worker (base vs adapted, with ``must_improve`` on the in-domain crop task).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GateResult:
    """Outcome of `check`: ``passed``, one line per failure, and the comparison as rows.

    ``table`` rows: ``{"task", "candidate", "baseline", "delta", "status"}`` with scores in points and
    status one of ``ok``, ``FAIL``, ``new``, ``skipped``, ``headline``; the row of a task either model skipped also
    has ``reason`` (why its data is missing and how to install it); a final ``speedup`` row when speed was compared.
    ``headline``: `out_of_domain_headline`, None when the candidate report does not split its tasks by domain.
    ``unchecked``: ``{task: reason}`` for the tasks neither model scored (their data is missing), listed whether
    or not they were allowed. ``could_not_check``: the gate failed only because of such tasks — no score it
    compared was found wanting — so "not checked" and "failed" can be told apart (exit 2 vs 1 in the CLI).
    """

    passed: bool
    failures: list[str]
    table: list[dict[str, Any]] = field(default_factory=list)
    headline: dict[str, Any] | None = None
    unchecked: dict[str, str] = field(default_factory=dict)
    could_not_check: bool = False

    def __bool__(self) -> bool:
        return self.passed

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failures": list(self.failures),
            "table": list(self.table),
            "headline": self.headline,
            "unchecked": dict(self.unchecked),
            "could_not_check": self.could_not_check,
        }

    def format_table(self) -> str:
        """The comparison as aligned plain text (for the terminal)."""
        lines = [f"{'task':<34} {'candidate':>9} {'baseline':>9} {'delta':>8}  status"]
        for row in self.table:
            status = f"{row['status']}: {row['reason']}" if row.get("reason") else row["status"]
            lines.append(
                f"{row['task']:<34} {_fmt(row['candidate']):>9} {_fmt(row['baseline']):>9} "
                f"{_fmt(row['delta'], signed=True):>8}  {status}"
            )
        if not self.passed:
            lines.append("FAILED: " + "; ".join(self.failures))
        elif self.unchecked:
            lines.append(f"PASSED, leaving out {len(self.unchecked)} task(s) neither model scored (allowed)")
        else:
            lines.append("PASSED")
        return "\n".join(lines)


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _scores(report: Mapping[str, Any], which: str) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """Task scores, skip reasons and no-score reasons of a `run_suite`/validate report, or of a plain
    ``{task: points}`` mapping. A NaN or infinite score is no score: it joins the no-score reasons (``failed``),
    since NaN compares false with every bound and would pass any check."""
    if "scores" in report:
        scores, skipped, failed = report["scores"], report.get("skipped", {}), dict(report.get("failed", {}))
    else:
        scores, skipped, failed = report, {}, {}
    bad = {k: v for k, v in scores.items() if not isinstance(v, int | float) or isinstance(v, bool)}
    if bad:
        raise ValueError(
            f"{which} report: scores must be numbers in points (0-100), got {bad}; pass run_suite()'s result"
        )
    failed.update({k: f"its score is {v}, not a number" for k, v in scores.items() if not math.isfinite(v)})
    return {k: float(v) for k, v in scores.items() if k not in failed}, dict(skipped), failed


def throughput_speedup(report: Mapping[str, Any], baseline: Mapping[str, Any]) -> float | None:
    """Geometric mean over the speed settings both reports measured of candidate / baseline texts/s."""
    ours = {row["setting"]: row["texts_per_s"] for row in (report.get("speed") or {}).get("settings", [])}
    theirs = {row["setting"]: row["texts_per_s"] for row in (baseline.get("speed") or {}).get("settings", [])}
    shared = [k for k in ours if k in theirs and ours[k] > 0 and theirs[k] > 0]
    if not shared:
        return None
    return math.exp(sum(math.log(ours[k] / theirs[k]) for k in shared) / len(shared))


def out_of_domain_headline(report: Mapping[str, Any], baseline_report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The headline comparison: candidate and baseline averaged over the *candidate's* out-of-domain tasks that
    both scored (`evaluation.suite.domain_split`), ``{"tasks", "candidate", "baseline", "delta"}`` in points.

    None when the candidate report has no domain split (a plain ``{task: points}`` mapping) or no such task.
    """
    domains = report.get("domains") if "scores" in report else None
    if not domains:
        return None
    ours, _, _ = _scores(report, "candidate")
    theirs, _, _ = _scores(baseline_report, "baseline")
    tasks = [t for t in domains["out_of_domain"]["tasks"] if t in ours and t in theirs]
    if not tasks:
        return None
    cand = sum(ours[t] for t in tasks) / len(tasks)
    base = sum(theirs[t] for t in tasks) / len(tasks)
    return {"tasks": tasks, "candidate": round(cand, 4), "baseline": round(base, 4), "delta": round(cand - base, 4)}


def check_thresholds(
    max_drop: float, min_speedup: float | None, *, names: tuple[str, str] = ("max_drop", "min_speedup")
) -> None:
    """Raise ValueError unless ``max_drop`` is a finite number of points >= 0 and ``min_speedup`` (when set) a
    finite ratio > 0. NaN compares false with everything, so a NaN bound would let every drop (or speed) through;
    an infinite one would too. ``names``: how the message calls them (the CLI passes its flags)."""
    if not math.isfinite(max_drop) or max_drop < 0:
        raise ValueError(f"{names[0]} must be a finite number of points >= 0, got {max_drop}")
    if min_speedup is not None and (not math.isfinite(min_speedup) or min_speedup <= 0):
        raise ValueError(f"{names[1]} must be a finite positive ratio such as 1.5, got {min_speedup}")


def check(
    report: Mapping[str, Any],
    baseline_report: Mapping[str, Any],
    *,
    max_drop: float = 1.0,
    min_speedup: float | None = None,
    must_improve: Sequence[str] = (),
    allow_skipped: bool = False,
) -> GateResult:
    """Compare a candidate report with a baseline report.

    Args:
        report, baseline_report: results of `evaluation.suite.run_suite` (or validate reports that add
            ``speed``), or plain ``{task: points}`` mappings.
        max_drop: largest allowed drop in points (baseline − candidate) on any task both ran.
        min_speedup: when set, the candidate's throughput must be at least this multiple of the
            baseline's (geometric mean over the shared speed settings; both reports need ``speed``).
        must_improve: tasks on which the candidate must score strictly higher (e.g. the in-domain
            crop-pair task of an ``/adapt`` job).
        allow_skipped: accept tasks that neither model scored (both reports skipped them, or one skipped a task
            the other never ran) instead of failing on them, as long as some task was compared; they stay in
            ``table`` and ``unchecked`` either way.

    A task the baseline ran but the candidate did not (or skipped) fails: the gate cannot vouch for it. A task
    neither model scored fails too unless ``allow_skipped``: a gate that passes on tasks it never compared would
    read as a check that was made (``could_not_check`` then tells such a failure from a drop).

    The first row is the headline when the candidate report splits its tasks by domain: the out-of-domain
    average (`out_of_domain_headline`). It is reported, not gated — every task in it is already held to
    ``max_drop``, so its average cannot drop further.
    """
    check_thresholds(max_drop, min_speedup)
    ours, our_skips, our_failed = _scores(report, "candidate")
    theirs, their_skips, their_failed = _scores(baseline_report, "baseline")
    failures: list[str] = []
    unchecked_failures: list[str] = []  # tasks that could not be compared, apart from scores found wanting
    table: list[dict[str, Any]] = []
    unchecked = {
        task: our_skips.get(task) or their_skips.get(task) or their_failed[task]
        for task in [*their_skips, *their_failed, *our_skips]
        if task not in ours and task not in theirs and task not in our_failed
    }
    headline = out_of_domain_headline(report, baseline_report)
    if headline is not None:
        label = f"out-of-domain average ({len(headline['tasks'])} tasks)"
        scores = {k: headline[k] for k in ("candidate", "baseline", "delta")}
        table.append({"task": label, **scores, "status": "headline"})
    candidate_only = [t for t in [*ours, *our_failed] if t not in theirs and t not in unchecked]
    for task in list(theirs) + list(dict.fromkeys(candidate_only)):
        cand, base = ours.get(task), theirs.get(task)
        row: dict[str, Any] = {"task": task, "candidate": cand, "baseline": base, "delta": None, "status": "ok"}
        if task in our_failed:  # the candidate ran it and got no score: its failure, whatever the baseline has
            row["status"], row["reason"] = "FAIL", f"the candidate has no score: {our_failed[task]}"
            failures.append(f"{task}: the candidate has no score ({our_failed[task]})")
        elif base is None:
            row["status"] = "skipped" if task in their_skips or task in their_failed else "new"
            if task in their_skips:
                row["reason"] = f"the baseline skipped it: {their_skips[task]}"
            elif task in their_failed:
                row["reason"] = f"the baseline has no score: {their_failed[task]}"
        elif cand is None:
            reason = our_skips.get(task, "not run")
            row["status"] = "FAIL"
            if task in our_skips:
                row["reason"] = f"the candidate skipped it: {reason}"
            failures.append(f"{task}: baseline scored {base:.2f} but the candidate has no score ({reason})")
        else:
            row["delta"] = round(cand - base, 4)
            if base - cand > max_drop:
                row["status"] = "FAIL"
                failures.append(f"{task}: {cand:.2f} vs {base:.2f} ({cand - base:+.2f} points, allowed -{max_drop:g})")
        table.append(row)
    for task, reason in unchecked.items():
        table.append({"task": task, "candidate": None, "baseline": None, "delta": None, "status": "skipped",
                      "reason": reason})  # fmt: skip
        if not allow_skipped:
            unchecked_failures.append(f"{task}: scored by neither model, so not compared ({reason})")
    if unchecked and allow_skipped and not any(row["delta"] is not None for row in table):
        unchecked_failures.append("no task was compared: every task was scored by neither model")
    for task in must_improve:
        cand, base = ours.get(task), theirs.get(task)
        if cand is None or base is None or cand <= base:
            line = f"{task}: must improve on the baseline ({_fmt(cand)} vs {_fmt(base)})"
            (unchecked_failures if task in unchecked else failures).append(line)
            for row in table:
                if row["task"] == task:
                    row["status"] = "FAIL"
    if min_speedup is not None:
        speedup = throughput_speedup(report, baseline_report)
        row = {"task": "speedup (x)", "candidate": speedup, "baseline": min_speedup, "delta": None, "status": "ok"}
        if speedup is None:
            row["status"] = "FAIL"
            failures.append("speed: a speed floor was set but the reports have no shared speed measurements")
        elif speedup < min_speedup:
            row["status"] = "FAIL"
            failures.append(f"speed: {speedup:.2f}x the baseline's throughput, required {min_speedup:g}x")
        table.append(row)
    return GateResult(
        passed=not failures and not unchecked_failures,
        failures=failures + unchecked_failures,
        table=table,
        headline=headline,
        unchecked=unchecked,
        could_not_check=bool(unchecked_failures) and not failures,
    )


IN_DOMAIN_TASK = "CropPairRetrieval-heldout"
PIECES_TASK = "ShortPieceRetrieval-heldout"  # the mean of `evaluation.domain_checks`' checks on the held-out documents
KNN_TASK = "kNN-accuracy-labels"
AGREEMENT_TASK = "RetrievalAgreement-teacher"  # a student's retrieval of short pieces against its teacher's


def adapt_gate(
    in_domain: Mapping[str, float],
    general_tasks: Mapping[str, Mapping[str, float]] | None,
    knn: Mapping[str, float] | None,
    *,
    margin: float,
    pieces: Mapping[str, float] | None = None,
    agreement: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """/adapt's two-sided gate on base vs adapted scores, in points: the held-out in-domain check must improve
    strictly; every other score (each general task, and kNN accuracy when labels were given) may drop at most
    ``margin`` points (adapting trades a little general quality for in-domain gains).

    ``in_domain`` (crop pairs), ``pieces`` and ``knn`` hold ``{"base": x, "adapted": y}``; ``general_tasks`` holds
    ``{"base": {task: x}, "adapted": {task: y}}``. With ``pieces`` (short pieces of held-out documents retrieving the
    rest of them: `evaluation.domain_checks`), they are the in-domain check that must improve, and crop pairs — a
    proxy a model can win by matching style, which adapting rewards — are held to ``margin`` like the general tasks.
    ``agreement`` (a student's: how closely its retrieval of short pieces follows its teacher's,
    `evaluation.domain_checks.retrieval_agreement`) must improve too when given: a student whose pieces rise while
    it retrieves less like its better teacher learned the corpus's phrasing, not the customer's search.
    Returns ``{"passed", "margin", "reasons", "table", "decided_on"}``.
    """
    decided_on = PIECES_TASK if pieces is not None else IN_DOMAIN_TASK
    candidate = {IN_DOMAIN_TASK: in_domain["adapted"]}
    baseline = {IN_DOMAIN_TASK: in_domain["base"]}
    if pieces is not None:
        candidate[PIECES_TASK] = pieces["adapted"]
        baseline[PIECES_TASK] = pieces["base"]
    if general_tasks is not None:
        candidate.update(general_tasks["adapted"])
        baseline.update(general_tasks["base"])
    if knn is not None:
        candidate[KNN_TASK] = knn["adapted"]
        baseline[KNN_TASK] = knn["base"]
    must_improve = [decided_on]
    if agreement is not None:
        candidate[AGREEMENT_TASK] = agreement["adapted"]
        baseline[AGREEMENT_TASK] = agreement["base"]
        must_improve.append(AGREEMENT_TASK)
    result = check(candidate, baseline, max_drop=margin, must_improve=must_improve)
    return {"passed": result.passed, "margin": margin, "reasons": result.failures, "table": result.table,
            "decided_on": decided_on}  # fmt: skip
