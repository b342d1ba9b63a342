"""The contract of the worker's pipelines, read from the code: every job kind has one; every stage takes the attempt
and at most two values of declared types that an earlier stage of its pipeline returns, and returns one typed value —
no free-form dicts (``dict[str, Any]``, ``Mapping[str, Any]``), no ``Any``, no bare tuples; the last stage publishes."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping

import pytest

from adapt_jobs import jobs
from adapt_jobs.results import Published
from adapt_worker.attempt import ADAPT_STUDENT, Attempt, BuildAttempt
from adapt_worker.pipeline import PIPELINES, Stage, stage_inputs

STAGES = [(kind, stage) for kind, pipeline in PIPELINES.items() for stage in pipeline.stages]
ATTEMPTS = {Attempt, BuildAttempt}


def _members(hint: object) -> tuple[object, ...]:
    """The types a hint allows (the members of a union, or the hint itself)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _loose(hint: object) -> bool:
    """Whether a hint lets untyped data through: Any, a dict or mapping of anything, or a bare tuple."""
    if hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_loose(member) for member in typing.get_args(hint))
    if origin in (dict, Mapping, typing.Mapping, tuple) or hint in (dict, tuple):
        return True
    return any(_loose(arg) for arg in typing.get_args(hint))


@pytest.mark.parametrize(("kind", "stage"), STAGES, ids=[f"{k}:{s.__name__}" for k, s in STAGES])
def test_a_stage_takes_the_attempt_and_at_most_two_typed_values_and_returns_one(kind: str, stage: Stage) -> None:
    parameters = inspect.signature(stage).parameters
    assert 1 <= len(parameters) <= 3, f"{stage.__name__} takes {len(parameters)} parameters"
    hints = typing.get_type_hints(stage)
    assert set(hints) == {*parameters, "return"}, f"{stage.__name__}: every parameter and the return annotated"
    first = next(iter(parameters))
    assert set(_members(hints[first])) <= ATTEMPTS, f"{stage.__name__}: the first parameter is the attempt"
    for name, hint in hints.items():
        assert not _loose(hint), f"{stage.__name__}: {name} is {hint}"


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_each_stage_gets_what_an_earlier_stage_returned_and_the_last_publishes(kind: str) -> None:
    made: set[object] = set()
    for stage in PIPELINES[kind].stages:
        missing = set(stage_inputs(stage)) - made
        assert not missing, f"{kind}: {stage.__name__} asks for {missing}, which no earlier stage returns"
        made.update(_members(typing.get_type_hints(stage)["return"]))
    assert typing.get_type_hints(PIPELINES[kind].stages[-1])["return"] is Published


def test_every_job_kind_has_a_pipeline() -> None:
    kinds = {value for name, value in vars(jobs).items() if name.startswith("JOB_KIND_")}
    assert kinds and kinds | {ADAPT_STUDENT} == set(PIPELINES)


def test_the_check_sees_loose_types() -> None:
    assert _loose(dict[str, typing.Any]) and _loose(Mapping[str, typing.Any]) and _loose(typing.Any)
    assert _loose(tuple[list[str], list[str] | None, int]) and _loose(Published | dict[str, int])
    assert not _loose(Published) and not _loose(Attempt | BuildAttempt)
