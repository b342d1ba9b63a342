"""No built-in recipe trains on what a task it is judged out-of-domain on draws from: by declared corpus and domain,
and by the texts themselves (a task text most of whose word 8-grams occur in the training corpora was drawn from
them, whatever the names say)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from core.corpora import CORPUS_DOMAINS, CUSTOM_CORPUS, corpus_domain
from evaluation.data import is_in_domain
from evaluation.suite import task_texts
from evaluation.tasks import TASKS, resolve_task
from training.config import RECIPES_DIR, TrainConfig, load_config
from training.data import BUILTIN_CORPORA
from training.run_folder import trained_on

RECIPES = sorted(RECIPES_DIR.glob("*.toml"))
SHINGLE_WORDS = 8
DRAWN_FRACTION = 0.5  # of a text's 8-grams found in the training corpora: that text was trained on


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


@functools.cache
def _corpus_shingles(name: str) -> frozenset[tuple[str, ...]]:
    return frozenset(s for document in BUILTIN_CORPORA[name]() for s in _shingles(document))


@functools.cache
def _task_texts(name: str) -> tuple[str, ...]:
    task = resolve_task(name)
    task.load_data()
    return tuple(dict.fromkeys(task_texts(task)))


def test_every_built_in_corpus_has_a_domain() -> None:
    assert not set(BUILTIN_CORPORA) - set(CORPUS_DOMAINS), "add the corpus to core.corpora.CORPUS_DOMAINS"
    assert CUSTOM_CORPUS not in BUILTIN_CORPORA and CUSTOM_CORPUS not in CORPUS_DOMAINS


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_never_trains_on_an_out_of_domain_tasks_corpus(recipe: Path) -> None:
    corpora = trained_on(load_config(recipe))
    unknown = [c for c in corpora if c != CUSTOM_CORPUS and c not in CORPUS_DOMAINS]
    assert not unknown, f"{recipe.name} trains on corpora without a domain: {unknown}"
    domains = {corpus_domain(c) for c in corpora}
    out_of_domain = [name for name, task in TASKS.items() if not is_in_domain(task.source_corpus, corpora)]
    assert out_of_domain, f"{recipe.name}: no task is out-of-domain, so there is no headline"
    for name in out_of_domain:
        source = TASKS[name].source_corpus
        assert source not in corpora and corpus_domain(source) not in domains, (recipe.name, name)
    training = frozenset().union(*(_corpus_shingles(c) for c in corpora if c in BUILTIN_CORPORA))
    for name in out_of_domain:
        drawn = []
        for text in _task_texts(name):
            shingles = _shingles(text)
            if shingles and len(shingles & training) >= DRAWN_FRACTION * len(shingles):
                drawn.append(text[:80])
        assert not drawn, f"{recipe.name} trains on text of {name}, judged out-of-domain for it: {drawn[:3]}"


def test_trained_on_names_built_in_corpora_custom_text_and_what_the_start_model_saw(tmp_path: Path) -> None:
    assert trained_on(TrainConfig(corpus="enwiki+aclsum")) == ["enwiki", "aclsum"]
    assert trained_on(TrainConfig(corpus=str(tmp_path / "docs.jsonl"))) == [CUSTOM_CORPUS]
    assert trained_on(TrainConfig(corpus=("one text", "another"))) == [CUSTOM_CORPUS]
    run = tmp_path / "runs" / "news"
    (run / "best").mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps({"trained_on": ["lee_background"]}))
    assert trained_on(TrainConfig(model=str(run / "best"), corpus="aclsum")) == ["lee_background", "aclsum"]
