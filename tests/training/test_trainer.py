"""The trainer: resume equivalence, best-checkpoint selection, early stopping, time budget, freezing,
schedule, progress events, corpora."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from core.model_folder import RECIPE_FILE
from core.text import CorpusError, CropRule, split_sentences
from evaluation.domain_checks import PIECES, short_piece
from training.config import ConfigError, TrainConfig
from training.data import (
    MIN_SENTENCE_CHARS,
    SPAN_WORDS,
    load_corpus,
    load_scored_pairs,
    name_phrases,
    query_units,
    shared_pieces,
    split_documents,
    text_units,
)
from training.encoder import Encoder
from training.inputs import load_training_data, recipe_training_texts
from training.students import layer_subset_student, tiny_bert_student
from training.targets import text_key, write_vectors
from training.trainer import lr_factor, train
from training.validation import CropPairValidation, TeacherFidelityValidation


def tiny_corpus(n: int = 24) -> list[str]:
    """Documents of four ~150-character sentences: three 2-sentence crops each."""
    topics = ["river ecology", "jazz history", "compiler design", "volcanic soils", "chess openings", "tax law"]
    return [
        " ".join(
            f"Document {i} discusses {topics[i % 6]} in some depth, sentence {j}, adding detail about measurements, "
            f"methods and the people who studied {topics[i % 6]} for many years."
            for j in range(4)
        )
        for i in range(n)
    ]


def tiny_config(tmp_path: Path, model: Path, name: str = "run", **changes: object) -> TrainConfig:
    values: dict[str, object] = {
        "name": name,
        "model": str(model),
        "corpus": tuple(tiny_corpus()),
        "max_seq_length": 32,
        "batch_size": 4,
        "max_steps": 4,
        "validation_fraction": 0.25,
        "eval_every": 0,
        "output_dir": str(tmp_path / name),
        "progress_bar": False,
        "lr": 1e-3,
        "seed": 3,
        **changes,
    }
    return TrainConfig(**values)  # type: ignore[arg-type]


def stop_after(steps: int) -> Callable[[], bool]:
    """A ``should_stop`` that lets ``steps`` steps run, then asks the run to stop (as Ctrl-C or a cancel does)."""
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > steps

    return stop


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Backbone weights; the pooler head is unused by the encoder and re-initialised on every load."""
    state = Encoder.from_pretrained(folder).backbone.state_dict()
    return {k: v for k, v in state.items() if not k.startswith("pooler.")}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=f"{key} differs")


@pytest.mark.parametrize("views", ["dropout", "crop+tokens"])
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path: Path, tiny_bert_path: Path, views: str) -> None:
    objective = "simcse" if views == "dropout" else "infonce"
    straight = train(tiny_config(tmp_path, tiny_bert_path, "straight", views=views, objective=objective, max_steps=6))

    config = tiny_config(tmp_path, tiny_bert_path, "resumed", views=views, objective=objective, max_steps=6)
    first = train(config, should_stop=stop_after(3))
    assert first.stopped_by == "cancelled" and first.steps == 3
    resumed = train(config.replace(resume=True))
    assert resumed.steps == 6 and resumed.stopped_by == "max_steps"
    # the first session's last step is logged too
    assert [r["step"] for r in resumed.history] == [1, 3, 6] and [r["step"] for r in straight.history] == [1, 6]
    for a, b in zip([resumed.history[0], resumed.history[2]], straight.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    assert_same_weights(weights(resumed.final_dir), weights(straight.final_dir))


@pytest.mark.parametrize(
    "objective,views,params",
    [
        ("barlow_twins", "crop", {"projector_dim": 16}),
        ("vicreg", "crop", {"projector_dim": 16}),
        ("sct", "tokens", {"queue_size": 8}),
    ],
)
def test_every_objective_trains_with_its_metrics_logged(
    tmp_path: Path, tiny_bert_path: Path, objective: str, views: str, params: dict
) -> None:
    config = tiny_config(
        tmp_path,
        tiny_bert_path,
        objective=objective,
        views=views,
        objective_params=params,
        rank_reduction=1e-3,
        validation=None,
        max_steps=2,
        log_every=1,
    )
    result = train(config)
    assert result.steps == 2
    for record in result.history:
        assert record["loss"] == record["loss"]  # finite, not NaN
        assert "rr_effective_rank" in record and "std" in record


def test_mse_distillation_trains_a_layer_subset_student_towards_its_teacher(
    tmp_path: Path, tiny_bert_path: Path, tiny_electra_path: Path
) -> None:
    config = tiny_config(
        tmp_path, tiny_bert_path, objective="mse_distillation", student="layer_subset", student_layers=[0, 3],
        teacher=str(tiny_electra_path), validation=None, max_steps=8, log_every=1, lr=1e-3,
    )  # fmt: skip
    result = train(config)
    assert result.layers == 2 and all(-1.0 <= record["cosine"] <= 1.0 for record in result.history)
    texts = [doc[:120] for doc in tiny_corpus(8)]
    teacher = Encoder.from_pretrained(tiny_electra_path, max_seq_length=32).encode(texts)

    def distance(encoder: Encoder) -> float:  # the objective on fixed texts: mean squared distance to the teacher
        return float(((encoder.encode(texts) - teacher) ** 2).sum(-1).mean())

    before = layer_subset_student(Encoder.from_pretrained(tiny_bert_path, max_seq_length=32), [0, 3])
    assert distance(Encoder.from_pretrained(result.final_dir)) < 0.8 * distance(before)


def test_without_resume_an_old_run_is_replaced(tmp_path: Path, tiny_bert_path: Path) -> None:
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=2)
    train(config)
    again = train(config)  # resume defaults to False: a fresh run, not a continuation
    assert again.steps == 2
    lines = (again.output_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines if json.loads(line)["kind"] == "train"] == [1, 2]


def test_best_checkpoint_is_the_best_validated_model_and_early_stopping_ends_the_run(
    tmp_path: Path, tiny_bert_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = iter([0.2, 0.6, 0.5, 0.4, 0.9])  # validations at steps 0, 1, 2, 3 (then patience runs out)

    def fake_evaluate(self: CropPairValidation, encoder: Encoder) -> dict[str, float]:
        return {CropPairValidation.metric: next(scripted)}

    monkeypatch.setattr(CropPairValidation, "evaluate", fake_evaluate)
    events: list[dict] = []
    result = train(
        tiny_config(tmp_path, tiny_bert_path, "best", max_steps=10, eval_every=1, early_stopping_patience=2),
        progress=events.append,
    )
    assert result.stopped_by == "early_stopping" and result.steps == 3
    assert (result.best_step, result.best_score) == (1, 0.6)
    assert [e["step"] for e in result.evaluations] == [0, 1, 2, 3]
    assert [e["best"] for e in result.evaluations] == [True, True, False, False]
    # DIR/best holds the step-1 model: identical to a one-step run with the same seed.
    one = tiny_config(tmp_path, tiny_bert_path, "one", max_steps=10, eval_every=0)
    one_step = train(one, should_stop=stop_after(1))
    assert_same_weights(weights(result.best_dir), weights(one_step.final_dir))
    assert not torch.equal(
        weights(result.best_dir)["encoder.layer.3.output.dense.weight"],
        weights(result.final_dir)["encoder.layer.3.output.dense.weight"],
    )
    kinds = {e["kind"] for e in events}
    assert kinds == {"train", "eval"}
    train_event = next(e for e in events if e["kind"] == "train")
    assert {"step", "total", "loss", "elapsed", "eta", "texts_per_s", "lr"} <= train_event.keys()


def test_validation_reports_the_rank_diagnostics_of_the_held_out_crops(tiny_bert_path: Path) -> None:
    validation = CropPairValidation(tiny_corpus(12), seed=0)
    encoder = Encoder.from_pretrained(tiny_bert_path)
    scores = validation.evaluate(encoder)
    pairs = validation.task.crop_pairs()
    assert 0.0 <= scores[CropPairValidation.metric] <= 100.0
    assert 1.0 <= scores["effective_rank"] <= min(2 * len(pairs), encoder.dim)
    assert 0.0 <= scores["alignment"] <= 4.0 and scores["uniformity"] <= 0.0


def test_held_out_crops_are_cut_by_the_rule_the_run_trains_with(tmp_path: Path, tiny_bert_path: Path) -> None:
    # best/ is chosen on held-out crops: cut by another rule than training's, they score another task than the
    # one trained for and than the /adapt gate, which evaluates with the rule its training used
    config = tiny_config(tmp_path, tiny_bert_path, crop_sentences=1)
    data = load_training_data(config)
    assert data.validation is not None
    pairs = data.validation.task.crop_pairs()
    assert pairs and all(len(split_sentences(crop)) == 1 for pair in pairs for crop in pair)
    given = CropRule(sentences=3, min_chars=40)  # a caller's rule (/adapt's) wins over the recipe's
    data = load_training_data(tiny_config(tmp_path, tiny_bert_path), crop_rule=given)
    assert data.rule == given and data.validation is not None
    pairs = data.validation.task.crop_pairs()
    assert pairs and all(len(split_sentences(crop)) == 3 for pair in pairs for crop in pair)


def test_time_budget_stops_the_run(tmp_path: Path, tiny_bert_path: Path) -> None:
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=None, epochs=None, time_budget_s=1.5, log_every=1)
    result = train(config)
    assert result.stopped_by == "time_budget"
    assert result.steps == len(result.history) >= 1
    # every step started inside the budget (each later step was allowed by a check made after the previous step's
    # record), and the run stopped because the clock passed it (the last record may fall just short: the budget is
    # checked after the step is recorded)
    assert all(r["elapsed"] < 1.5 for r in result.history[:-1])
    assert result.elapsed >= 1.5
    assert all(r["total"] is None for r in result.history)


def test_epochs_set_the_step_count(tmp_path: Path, tiny_bert_path: Path) -> None:
    result = train(tiny_config(tmp_path, tiny_bert_path, max_steps=None, epochs=1.0))
    # 24 documents, a quarter held out → 18 training pairs → 4 batches of 4
    assert result.steps == 4 and result.stopped_by == "epochs"


def test_training_the_last_layer_leaves_the_rest_untouched(tmp_path: Path, tiny_bert_path: Path) -> None:
    result = train(tiny_config(tmp_path, tiny_bert_path, train_last_layers=1, max_steps=2, weight_decay=0.1))
    before, after = weights(tiny_bert_path), weights(result.final_dir)
    for key in before:
        changed = not torch.equal(before[key], after[key])
        assert changed == key.startswith("encoder.layer.3."), key


def test_nothing_to_train_is_an_error(tmp_path: Path, tiny_bert_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to train"):
        train(tiny_config(tmp_path, tiny_bert_path, train_last_layers=0))


def test_too_small_a_corpus_says_what_to_change(tmp_path: Path, tiny_bert_path: Path) -> None:
    with pytest.raises(ValueError, match="fewer than batch_size=64"):
        train(tiny_config(tmp_path, tiny_bert_path, batch_size=64))


def test_a_corpus_too_small_to_hold_out_from_says_what_to_change(tmp_path: Path, tiny_bert_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"2 documents are too few .*: give more documents, .*validation = 'none'"):
        load_training_data(tiny_config(tmp_path, tiny_bert_path, corpus=tuple(tiny_corpus(2))))


def test_documents_too_short_to_crop_are_not_told_to_set_the_rule_they_run(
    tmp_path: Path, tiny_bert_path: Path
) -> None:
    short = tuple(f"note {i}" for i in range(12))  # no two crops under any rule
    with pytest.raises(ValueError, match="0 training examples") as refused:
        train(tiny_config(tmp_path, tiny_bert_path, corpus=short, validation=None))
    assert "crop_rule = 'auto'" not in str(refused.value)  # the run already has it
    assert "longer documents" in str(refused.value)
    with pytest.raises(ValueError, match="crop_rule = 'auto'"):  # what relaxes the paper's rule
        train(tiny_config(tmp_path, tiny_bert_path, corpus=short, validation=None, crop_rule="paper"))


def test_validation_none_saves_the_final_model_as_best(tmp_path: Path, tiny_bert_path: Path) -> None:
    result = train(tiny_config(tmp_path, tiny_bert_path, validation=None, max_steps=1))
    assert result.evaluations == [] and result.best_step == 1
    assert_same_weights(weights(result.best_dir), weights(result.final_dir))


def test_saved_models_keep_the_source_limit_not_the_training_length(tmp_path: Path, tiny_bert_path: Path) -> None:
    # crops are cut to 32 tokens for speed; the shipped model must still read inputs as long as its source did
    own_limit = Encoder.from_pretrained(tiny_bert_path).max_seq_length
    assert own_limit > 32
    result = train(
        tiny_config(tmp_path, tiny_bert_path, max_steps=2, eval_every=1, student="layer_subset", student_layers=[0, 1])
    )
    for folder in (result.best_dir, result.final_dir):
        assert Encoder.from_pretrained(folder).max_seq_length == own_limit


def test_lr_schedule_warms_up_then_decays_to_zero() -> None:
    factors = [lr_factor(step, step / 10, 0.2, 10) for step in range(10)]
    assert factors[0] == pytest.approx(0.5) and factors[1] == pytest.approx(1.0)
    assert factors[1:] == sorted(factors[1:], reverse=True)
    assert factors[-1] == pytest.approx(0.1 / 0.8)
    assert lr_factor(0, 0.0, 3, 10) == pytest.approx(1 / 3)  # warm-up given in steps
    assert lr_factor(5, 1.0, 0.1, None) == 0.0  # time budget used up
    # a time budget that runs ahead of max_steps ends the warm-up too
    assert lr_factor(10, 0.1, 0.1, 3000) == pytest.approx(1.0)


# --- corpora ------------------------------------------------------------------------------------


def test_local_files_load_through_the_one_corpus_reader(tmp_path: Path) -> None:
    import datasets

    texts = ["first document text.", "second document text.", "third one."]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n\n")  # no blank line between texts: one per line
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)))
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(tmp_path / "c.parquet"))
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, t in enumerate(texts):
        (folder / f"{i}.txt").write_text(t)
    for name in ("c.txt", "c.jsonl", "c.parquet", "docs"):
        assert load_corpus(tmp_path / name) == texts, name
    assert len(load_corpus(texts, max_documents=2, seed=1)) == 2


def test_builtin_corpora_hold_no_evaluated_text() -> None:
    lee = load_corpus("lee_background")
    assert len(lee) == 300
    acl = load_corpus("aclsum", max_documents=50)
    assert all(len(p) >= 200 for p in acl)


def test_corpus_errors_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="neither a built-in corpus"):
        load_corpus("no-such-corpus")
    (tmp_path / "c.csv").write_text("text\nx\n")
    with pytest.raises(CorpusError, match=r"unsupported corpus file type '\.csv'"):
        load_corpus(tmp_path / "c.csv")
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "x"}))
    with pytest.raises(CorpusError, match=r'line 1 of .*c.jsonl must be a string or an object with a "text" string'):
        load_corpus(tmp_path / "c.jsonl")
    (tmp_path / "p.jsonl").write_text(json.dumps({"text1": "a", "score": 1}))
    with pytest.raises(CorpusError, match=r"p.jsonl:1: expected"):
        load_scored_pairs(tmp_path / "p.jsonl")


def test_scored_pairs_are_read_as_corpus_files_are(tmp_path: Path) -> None:
    lines = [json.dumps({"text1": f"first {i}", "text2": f"second {i}", "score": i / 2}) for i in range(3)]
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())  # a byte-order mark and CRLF, as Windows saves
    assert [p.score for p in load_scored_pairs(path)] == [0.0, 0.5, 1.0]
    path.write_bytes("\n".join(lines).encode() + b'\n{"text1": "caf\xe9", "text2": "x", "score": 1}\n')
    with pytest.raises(CorpusError, match=r"pairs.jsonl is not UTF-8 text .*re-encode it as UTF-8"):
        load_scored_pairs(path)
    for bad in ("NaN", "Infinity", '"high"', "true"):
        path.write_text("\n".join([*lines, f'{{"text1": "a", "text2": "b", "score": {bad}}}']))
        with pytest.raises(CorpusError, match=r"pairs.jsonl:4: .*score must be a finite number"):
            load_scored_pairs(path)


# --- whole-text distillation, selected by fidelity to the teacher -----------------------------------


def test_text_units_mix_documents_and_their_sentences() -> None:
    documents = tiny_corpus(3)
    units = text_units(documents, 2, seed=0)
    assert units[0] == documents[0] and len(units) == 3 * 3  # each document, then two of its sentences
    sentences = [u for u in units if u not in documents]
    assert all(any(s in d for d in documents) and len(s) >= MIN_SENTENCE_CHARS for s in sentences)
    assert text_units(documents, 2, seed=0) == units and text_units(documents, 0, seed=0) == documents
    assert text_units(["Too short. Also short.", "Too short. Also short."], 1, seed=0) == ["Too short. Also short."]


def test_name_phrases_are_capitalised_runs_inside_sentences() -> None:
    text = (
        "Hydrogen was first isolated by Henry Cavendish in 1776. Lavoisier named it after the Greek words. "
        "The Principality of Andorra and the National Institute for Nuclear Physics of Italy met Henry Cavendish."
    )
    assert name_phrases(text) == ["Henry Cavendish", "Greek", "Principality of Andorra",
                                  "National Institute for Nuclear Physics of Italy"]  # fmt: skip
    assert name_phrases("Nothing here is named. Only lower case words follow it.") == []


def test_text_units_add_names_of_each_document_only_when_asked() -> None:
    documents = [
        "Hydrogen was first isolated by Henry Cavendish in 1776 in his laboratory. It was named by Antoine Lavoisier "
        "in Paris after the Greek words for water and maker, and Jacques Charles filled a balloon with it.",
        "A plain document without names in it, long enough to hold a sentence. And a second sentence follows here.",
    ]
    plain = text_units(documents, 1, seed=0)
    named = text_units(documents, 1, seed=0, names=2)
    extra = [u for u in named if u not in plain]
    assert [u for u in named if u in plain] == plain and len(extra) == 2  # the second document has no name
    assert set(extra) <= set(name_phrases(documents[0])) and text_units(documents, 1, seed=0, names=2) == named
    with pytest.raises(ConfigError, match="text_names must be >= 0"):
        TrainConfig(model="minilm-l6", views="texts", text_names=-1)


def test_query_units_are_each_documents_pieces_sentences_and_word_runs() -> None:
    long = ("Buffer overflow in the parser of the image library lets a crafted file overwrite the heap. "
            "An attacker who sends such a file can run code as the service user. "
            "Bounds checks on every read fix it.")  # fmt: skip
    short = "Two words here. Then the rest of it, nine words in all."  # 12 words: no run cut from it
    units = query_units([long, short], 4, seed=0)
    pieces = [found[0] for doc in (long, short) for kind in PIECES if (found := short_piece(doc, kind))]
    sentences = split_sentences(long)
    assert units[: len(pieces)] == pieces and long.startswith(pieces[1])  # its lead, then its first words
    assert units[len(pieces) : len(pieces) + len(sentences)] == sentences
    runs = units[len(pieces) + len(sentences) : len(pieces) + len(sentences) + 4]
    assert all(r in long and SPAN_WORDS[0] <= len(r.split()) <= SPAN_WORDS[1] for r in runs)
    assert units[len(pieces) + len(sentences) + 4 :] == split_sentences(short)
    assert query_units([long, short], 4, seed=0) == units and query_units([long, short], 4, seed=1) != units
    assert query_units([long, short], 0, seed=0) == [u for u in units if u not in runs]


def test_shared_pieces_are_those_whose_words_another_document_holds() -> None:
    mit = "Permission is hereby granted, free of charge, to any person. The MIT licence asks for the notice."
    isc = "Permission to use, copy, modify this software is granted. THE SOFTWARE IS PROVIDED AS IS."
    bsd = "Redistribution in source form is permitted.  The software is provided   AS IS.  There is no warranty."
    documents = [mit, isc, bsd]
    pieces = [
        ("Permission is hereby granted", 0),  # only in its own document
        ("THE SOFTWARE IS PROVIDED AS IS.", 1),  # in the BSD text too, case and spacing aside
        ("There is no warranty", 2),  # only in its own document
        ("permission", 0),  # one word the ISC text holds as well
        ("The MIT licence asks", 0),
        ("is granted. THE", 1),  # runs across a sentence end of its own document only
        ("copy, modify", 2),  # a piece said to come from a document that lacks it: another holds it
    ]
    assert shared_pieces(documents, pieces) == {"THE SOFTWARE IS PROVIDED AS IS.", "permission", "copy, modify"}
    assert shared_pieces(documents, []) == set()


def test_teacher_fidelity_is_one_for_the_teacher_and_lower_for_another_model(
    tiny_bert_path: Path, tiny_electra_path: Path
) -> None:
    teacher = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    texts = text_units(tiny_corpus(6), 1, seed=0)
    validation = TeacherFidelityValidation(texts, teacher)
    same = validation.evaluate(teacher)
    assert same["teacher_cosine"] == pytest.approx(1.0, abs=1e-5) and same["similarity_spearman"] == pytest.approx(1.0)
    scores = validation.evaluate(Encoder.from_pretrained(tiny_electra_path, max_seq_length=32))  # another model
    assert scores["teacher_cosine"] < 0.9 and scores["similarity_spearman"] < 0.9
    assert validation.layer_scores(teacher)[-1] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="give the student an output layer"):
        validation.evaluate(tiny_bert_student(teacher, num_layers=1, hidden_size=16, num_heads=2))  # 16 vs 32 dims


def test_whole_text_distillation_selects_best_by_fidelity_and_approaches_the_teacher(
    tmp_path: Path, tiny_bert_path: Path, tiny_electra_path: Path
) -> None:
    config = tiny_config(
        tmp_path, tiny_bert_path, objective="mse_distillation", views="texts", student="layer_subset",
        student_layers=[0, 3], teacher=str(tiny_electra_path), validation_metric="teacher_fidelity", eval_every=3,
        max_steps=9, lr=1e-3, log_every=1,
    )  # fmt: skip
    result = train(config)
    assert result.extra["training_texts"] > len(tiny_corpus())
    assert 0 < result.extra["teacher_embedded_texts"] <= result.extra["training_texts"]
    scores = [e["teacher_cosine"] for e in result.evaluations]
    assert [e["step"] for e in result.evaluations] == [0, 3, 6, 9]
    best = scores.index(max(scores))
    assert result.best_score == max(scores) and result.best_step == result.evaluations[best]["step"]
    assert max(scores[1:]) > scores[0]  # training brings the student closer to the teacher on held-out texts
    assert all(r["texts_per_s"] > 0 and "cosine" in r for r in result.history)

    # the run's recipe.json rebuilds exactly the texts it trained on (/adapt samples a base student's general texts)
    texts = recipe_training_texts(result.output_dir / RECIPE_FILE)
    assert len(texts) == result.extra["training_texts"] and texts == load_training_data(config).documents
    # with every text's target given, the teacher embeds none of them
    write_vectors(tmp_path / "given.npz", {text_key(t): torch.zeros(32) for t in texts})
    given = train(config.replace(teacher_vectors=str(tmp_path / "given.npz"), max_steps=2, eval_every=0,
                                 output_dir=str(tmp_path / "given")))  # fmt: skip
    assert given.extra["teacher_embedded_texts"] == 0


def test_teacher_vectors_need_whole_texts_and_a_teacher() -> None:
    with pytest.raises(ConfigError, match="teacher_vectors are the targets of whole texts"):
        TrainConfig(objective="infonce", views="crop", teacher_vectors="given.npz")


def test_teacher_fidelity_needs_a_teacher_objective() -> None:
    with pytest.raises(ConfigError, match="teacher_fidelity' compares the student with its teacher"):
        TrainConfig(objective="infonce", validation_metric="teacher_fidelity")
    with pytest.raises(ConfigError, match="validation_metric must be one of"):
        TrainConfig(validation_metric="crops")


def test_anchor_keeps_the_model_near_where_it_started(tmp_path: Path, tiny_bert_path: Path) -> None:
    """anchor_weight adds the MSE to the frozen starting model's embeddings (logged as anchor_*), and a heavy
    anchor ends closer to the start, on texts it never trained on, than no anchor."""
    texts = ["an unrelated held-out sentence about tides", "another about baking bread at home", "and one on chess"]
    start = Encoder.from_pretrained(tiny_bert_path).encode(texts)

    def drift(**changes: object) -> tuple[float, list[dict]]:
        config = tiny_config(tmp_path, tiny_bert_path, validation=None, max_steps=6, log_every=1, lr=3e-3, **changes)
        result = train(config)
        moved = Encoder.from_pretrained(result.final_dir).encode(texts)
        return float((1 - (moved * start).sum(-1)).mean()), result.history

    free, _ = drift(name="free")
    anchored, history = drift(name="anchored", anchor_weight=100.0)
    assert all(record["anchor_loss"] >= 0 and "anchor_cosine" in record for record in history)
    assert anchored < free
    with pytest.raises(ConfigError, match="anchor_weight must be >= 0"):
        tiny_config(tmp_path, tiny_bert_path, anchor_weight=-1.0)


def test_self_supervised_sct_references_are_the_trained_model_without_gradient(
    tmp_path: Path, tiny_bert_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paper 001 §3.1: f_ref has f_θ's weights under stop-gradient, so at every step the references are what the
    model being trained computes for the views now (here without dropout, so exactly the online embeddings), not
    what the starting model computed."""
    import shutil

    from training.objectives.sct import SCT

    folder = tmp_path / "no-dropout"
    shutil.copytree(tiny_bert_path, folder)
    settings = json.loads((folder / "config.json").read_text())
    settings.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(settings))
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    forward = SCT.forward

    def recording(self, view1, view2, reference1=None, reference2=None):  # type: ignore[no-untyped-def]
        seen.append((view1.detach().clone(), reference1, reference2))
        return forward(self, view1, view2, reference1=reference1, reference2=reference2)

    monkeypatch.setattr(SCT, "forward", recording)
    config = tiny_config(tmp_path, folder, objective="sct", views="crop", objective_params={"queue_size": 8},
                         validation=None, max_steps=4)  # fmt: skip
    assert config.online_reference
    start = Encoder.from_pretrained(folder)
    result = train(config)
    assert result.steps == 4 and len(seen) == 4
    for view1, reference1, reference2 in seen:
        assert not reference1.requires_grad and not reference2.requires_grad
        torch.testing.assert_close(reference1, view1, atol=1e-5, rtol=0)
    with torch.no_grad():  # the run trained, so a frozen copy of the start would have given other references
        start_vectors = start(**start.tokenize(["probe text about tides"]))
        trained = Encoder.from_pretrained(result.final_dir)
        assert not torch.allclose(trained(**trained.tokenize(["probe text about tides"])), start_vectors, atol=1e-4)


def test_self_supervised_sct_has_no_teacher_to_be_faithful_to() -> None:
    with pytest.raises(ConfigError, match="self-supervised SCT has none"):
        TrainConfig(objective="sct", views="crop", validation_metric="teacher_fidelity")
    assert not TrainConfig(objective="sct", views="texts", teacher="minilm-l6").online_reference
    assert not TrainConfig(objective="mse_distillation", views="texts").online_reference


def test_a_diverged_run_says_to_lower_the_learning_rate(tmp_path: Path, tiny_bert_path: Path) -> None:
    """Weights blown up by a far too large step give non-finite embeddings: the run stops with the advice, not
    with what a diagnostic makes of NaN vectors."""
    config = tiny_config(tmp_path, tiny_bert_path, lr=1e12, max_steps=6, validation=None, warmup=0)
    with pytest.raises(FloatingPointError, match=r"non-finite at step \d: lower lr \(now 1000000000000.0\)"):
        train(config)


def test_validation_never_holds_a_document_the_run_trains_on() -> None:
    documents = [f"Document {i} opens here. It goes on." for i in range(100)]
    plain = split_documents(documents, 0.1, seed=0, max_validation=50)
    repeated = documents + plain.validation[:3]  # three held documents repeated: all copies stay trained on
    split = split_documents(repeated, 0.1, seed=0, max_validation=50)
    assert not set(split.validation) & set(split.train) and len(set(split.validation)) == len(split.validation)
    with pytest.raises(CorpusError, match="no document can be held out for validation: each one drawn is also"):
        split_documents(["The same page. Again."] * 20, 0.1, seed=0, max_validation=50)
