"""The training recipe: one frozen dataclass, loadable from TOML and overridable with ``--set key=value``.

A recipe file is a flat TOML table of `TrainConfig` fields plus two optional sub-tables,
``[objective_params]`` (keyword arguments of the objective class, e.g. ``temperature``) and
``[view_params]`` (keyword arguments of the view functions, e.g. token-deletion rates)::

    name = "crop-minilm"
    model = "minilm-l6"
    objective = "infonce"
    corpus = "aclsum"
    batch_size = 64
    lr = 2e-5
    [objective_params]
    temperature = 0.05

``--set`` values are parsed as TOML values (``--set lr=1e-4``, ``--set student_layers=[0,5]``,
``--set objective_params.temperature=0.1``); ``none`` unsets an optional field (``--set time_budget_s=none``);
anything that is not valid TOML is taken as a string (``--set output_dir=runs/x``). Unknown keys and wrong
types fail with the list of valid keys; ``objective_params`` are checked against the objective class's constructor
(its parameter names and annotated types).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import tomllib
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.recipe_values import describe_type, matches_type, parse_value, show_value

OBJECTIVE_NAMES = ("infonce", "simcse", "sct", "barlow_twins", "vicreg", "mse_distillation")
VIEW_NAMES = ("crop", "dropout", "tokens", "crop+tokens", "texts")
VALIDATION_METRICS = ("crop_retrieval", "teacher_fidelity")
# objectives that read a second encoder: a teacher, a frozen copy of the initial model, or (self-supervised SCT) the
# trained model itself without gradient
TEACHER_OBJECTIVES = ("sct", "mse_distillation")
STUDENT_NAMES = ("layer_subset", "tiny_bert")
RECIPES_DIR = Path(__file__).parent / "recipes"


class ConfigError(ValueError):
    """A recipe or override that cannot be turned into a valid `TrainConfig`."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. Defaults follow the cropping paper (000 §4): crop views,
    InfoNCE with τ = 0.05, batch 64, lr 2e-5, one epoch."""

    name: str = "run"

    # --- model --------------------------------------------------------------------------------
    model: str = "minilm-l6"  # built-in name or Hugging Face folder
    pooling: str | None = None  # None: the folder's sentence-transformers setting (else mean)
    # tokens per training text (None: the model's own limit); saved models keep the model's own limit
    max_seq_length: int | None = 128
    student: str | None = None  # None (train `model` itself), "layer_subset" or "tiny_bert" built from `model`
    student_layers: tuple[int, ...] = (0, 5)  # layer_subset: indices of the teacher's layers to keep
    student_num_layers: int = 2  # tiny_bert depth
    student_hidden_size: int = 128  # tiny_bert width (embeddings PCA-initialised from the teacher)
    student_num_heads: int = 2
    # tiny_bert: an output layer (sentence-transformers Dense) to this width, kept in the saved model; "teacher":
    # the width of `model` (the teacher, unless `teacher` names another); None: none
    student_output_dim: int | str | None = None
    # SCT distillation teacher; None with objective "sct" on `model` itself = self-supervised SCT, whose reference
    # network is the trained model under stop-gradient (`online_reference`)
    teacher: str | None = None
    truncate: int | str | None = None  # keep the first l layers; "probe" = TMFT's best layer on validation
    probe_max_layers: int | None = None  # with truncate = "probe": consider only layers 1..this (a speed cap)
    # with truncate = "probe": the deepest layer within this many points of the best wins (near-equal layers
    # differ by noise on a small validation set; the previous rule took the shallower of two near-equal layers)
    probe_tolerance: float = 0.5
    train_last_layers: int | None = None  # None trains every layer (cropping paper Fig. 4a: the last 2 nearly match)

    # --- objective and views ------------------------------------------------------------------
    objective: str = "infonce"
    # crop | dropout | tokens | crop+tokens (crop pairs, then token augmentations) | texts (whole texts: each
    # document and `text_sentences` of its sentences, for distillation; both views are the same text)
    views: str = "crop"
    objective_params: Mapping[str, Any] = field(default_factory=dict)
    view_params: Mapping[str, Any] = field(default_factory=dict)
    rank_reduction: float = 0.0  # γ of the rank-reduction regulariser (paper 002); 0 disables it
    # weight of an MSE anchor to the frozen starting model's embedding of each batch's first view (forgets less
    # off the training domain; /adapt uses 3); 0 disables it
    anchor_weight: float = 0.0
    # weight of a similarity rehearsal (training.objectives.rehearsal): each step, `rehearsal_batch_size` texts of
    # `rehearsal_texts` (a corpus spec as `corpus`, or the texts) keep the similarity structure `rehearsal_model`
    # gives them (None: the frozen starting model; /adapt's students: their base student); 0 disables it
    rehearsal_weight: float = 0.0
    rehearsal_texts: str | tuple[str, ...] | None = None
    rehearsal_model: str | None = None
    rehearsal_batch_size: int = 64
    rehearsal_temperature: float = 0.05
    rehearsal_position_weight: float = 0.0  # also hold each text's position (MSE of normalised embeddings); 0: none
    crop_sentences: int = 2  # t consecutive sentences per crop (paper 000 §3.1)
    crop_rule: str = "auto"  # "paper" (100–250-char sentences only) or "auto" (core.text.choose_crop_rule)
    text_sentences: int = 1  # views = "texts": sentences drawn from each document besides the document itself
    # views = "texts": name-like phrases drawn from each training document besides (training.data.name_phrases: a
    # run of capitalised words inside a sentence, "Henry Cavendish", "United States Armed Forces"), so the student
    # also learns the teacher's view of names, the shortest queries; the held-out texts keep the documents and
    # sentences only
    text_names: int = 0
    # views = "texts": a file of precomputed targets (training.targets.write_vectors: text SHA-256 → vector) used
    # for its texts instead of the teacher's own embedding (/adapt's students: a frozen model's, of general text)
    teacher_vectors: str | None = None

    # --- data ---------------------------------------------------------------------------------
    corpus: str | tuple[str, ...] = "aclsum"  # built-in corpus name, a file/folder path, or the texts
    max_documents: int | None = None
    validation: str | tuple[str, ...] | None = "holdout"  # "holdout", a corpus spec, texts, or None
    validation_fraction: float = 0.1  # of the documents, when validation = "holdout"
    max_validation_documents: int = 200
    pairs: str | None = None  # JSONL of scored pairs {"text1","text2","score"}: supervised CoSENT
    # what selects DIR/best and early-stops: held-out crop-pair retrieval, or (distillation) fidelity to the
    # teacher — the mean cosine of student and teacher embeddings of held-out texts (documents and sentences)
    validation_metric: str = "crop_retrieval"

    # --- optimisation -------------------------------------------------------------------------
    max_steps: int | None = None
    epochs: float | None = 1.0  # used when max_steps is None
    time_budget_s: float | None = None  # stop after this many seconds (the schedule follows the clock)
    batch_size: int = 64
    lr: float = 2e-5
    # AdamW's decoupled weight decay, on matrices only (training.assembly.parameter_groups). Papers 001 (§4.1) and
    # 003 (§4, 1e-2) train with AdamW; paper 000 (§3.1) uses Adam, so the crop recipes, which keep this default,
    # depart from it by this decay
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of the run (< 1) or a number of steps (≥ 1)
    grad_clip: float | None = 1.0
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads; None: the caller's (CLI: EMBED_NUM_THREADS)
    device: str | None = None  # None: the caller's (CLI: EMBED_DEVICE), else cpu

    # --- evaluation, logging, checkpoints -----------------------------------------------------
    eval_every: int = 0  # steps between validations (0: only at the end)
    early_stopping_patience: int | None = None  # validations without improvement before stopping
    checkpoint_every: int = 0  # steps between resumable checkpoints (0: only at the end)
    log_every: int = 10
    output_dir: str = "runs/{name}"
    resume: bool = False  # continue from output_dir/checkpoint when it exists
    progress_bar: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.objective not in OBJECTIVE_NAMES:
            problems.append(f"objective must be one of {OBJECTIVE_NAMES}, got {self.objective!r}")
        if self.views not in VIEW_NAMES:
            problems.append(f"views must be one of {VIEW_NAMES}, got {self.views!r}")
        if self.student is not None and self.student not in STUDENT_NAMES:
            problems.append(f"student must be one of {STUDENT_NAMES} or omitted, got {self.student!r}")
        output_dim = self.student_output_dim
        if output_dim is not None and (
            self.student != "tiny_bert"
            or not (output_dim == "teacher" or (isinstance(output_dim, int) and output_dim >= 1))
        ):
            problems.append(
                "student_output_dim is a positive width or 'teacher', for student = 'tiny_bert'; got "
                f"{output_dim!r} with student = {self.student!r}"
            )
        if isinstance(self.truncate, str) and self.truncate != "probe":
            problems.append(f"truncate must be a layer count or 'probe', got {self.truncate!r}")
        if self.anchor_weight < 0:
            problems.append(f"anchor_weight must be >= 0 (0 = no anchor), got {self.anchor_weight}")
        if self.rehearsal_weight < 0:
            problems.append(f"rehearsal_weight must be >= 0 (0 = no rehearsal), got {self.rehearsal_weight}")
        if self.rehearsal_weight > 0 and not self.rehearsal_texts:
            problems.append("rehearsal_weight > 0 needs rehearsal_texts: the general texts whose structure is kept")
        if self.rehearsal_batch_size < 3:
            problems.append(f"rehearsal_batch_size must be >= 3, got {self.rehearsal_batch_size}")
        if self.rehearsal_temperature <= 0:
            problems.append(f"rehearsal_temperature must be > 0, got {self.rehearsal_temperature}")
        if self.rehearsal_position_weight < 0:
            problems.append(f"rehearsal_position_weight must be >= 0, got {self.rehearsal_position_weight}")
        if self.probe_tolerance < 0:
            problems.append(f"probe_tolerance must be >= 0 points, got {self.probe_tolerance}")
        if self.crop_rule not in ("paper", "auto"):
            problems.append(f"crop_rule must be 'paper' or 'auto', got {self.crop_rule!r}")
        if self.batch_size < 2:
            problems.append(f"batch_size must be at least 2 (in-batch negatives), got {self.batch_size}")
        if self.lr <= 0:
            problems.append(f"lr must be positive, got {self.lr}")
        if self.max_steps is None and self.epochs is None and self.time_budget_s is None:
            problems.append("set one of max_steps, epochs or time_budget_s so the run knows when to stop")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"max_steps must be at least 1, got {self.max_steps}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            problems.append(f"time_budget_s must be positive, got {self.time_budget_s}")
        if not 0 < self.validation_fraction < 1:
            problems.append(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")
        if self.warmup < 0:
            problems.append(f"warmup must be ≥ 0, got {self.warmup}")
        if self.validation_metric not in VALIDATION_METRICS:
            problems.append(f"validation_metric must be one of {VALIDATION_METRICS}, got {self.validation_metric!r}")
        if self.validation_metric == "teacher_fidelity" and self.objective not in TEACHER_OBJECTIVES:
            problems.append(
                f"validation_metric 'teacher_fidelity' compares the student with its teacher: use one of the "
                f"objectives {TEACHER_OBJECTIVES}, or validation_metric = 'crop_retrieval'"
            )
        if self.validation_metric == "teacher_fidelity" and self.truncate == "probe":
            problems.append(
                "truncate = 'probe' scores layers by crop retrieval: set validation_metric = 'crop_retrieval'"
            )
        if self.text_sentences < 0:
            problems.append(f"text_sentences must be >= 0, got {self.text_sentences}")
        if self.text_names < 0:
            problems.append(f"text_names must be >= 0, got {self.text_names}")
        if self.objective == "simcse" and self.views != "dropout":
            problems.append("objective 'simcse' is InfoNCE on dropout views: set views = 'dropout'")
        if self.validation_metric == "teacher_fidelity" and self.online_reference:
            problems.append(
                "validation_metric 'teacher_fidelity' compares the student with its teacher, and self-supervised "
                "SCT has none (its reference is the trained model itself): set teacher, or validation_metric = "
                "'crop_retrieval'"
            )
        if self.teacher_vectors is not None and self.online_reference:
            problems.append("teacher_vectors are a teacher's targets, and self-supervised SCT has no teacher: "
                            "set teacher")  # fmt: skip
        if self.teacher_vectors is not None and (self.views != "texts" or self.objective not in TEACHER_OBJECTIVES):
            problems.append("teacher_vectors are the targets of whole texts: use views = 'texts' with a teacher "
                            f"objective {TEACHER_OBJECTIVES}")  # fmt: skip
        try:
            self.output_dir.format(name=self.name)
        except (KeyError, IndexError, ValueError):
            problems.append(f"output_dir may hold {{name}} and no other braces, got {self.output_dir!r}")
        if self.objective in OBJECTIVE_NAMES and isinstance(self.objective_params, Mapping):
            problems.extend(objective_param_problems(self.objective, self.objective_params))
        if problems:
            raise ConfigError("invalid training config: " + "; ".join(problems))

    @property
    def online_reference(self) -> bool:
        """Self-supervised SCT: objective ``sct`` training ``model`` itself (no teacher, student or truncation).
        Paper 001 §3.1 gives its reference network f_ref "identical" architecture and weights to the online f_θ,
        under stop-gradient, so the references are the trained model's own embeddings of the views, encoded again
        without gradient at every step; a distillation run's reference is instead a frozen teacher (§3.4)."""
        return (
            self.objective == "sct" and self.teacher is None and self.student is None and self.truncate is None
            and not self.pairs
        )  # fmt: skip

    @property
    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.format(name=self.name))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-friendly values (tuples become lists)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    def replace(self, **changes: Any) -> TrainConfig:
        return from_dict({**self.to_dict(), **changes})


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, _FIELDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(sorted(_FIELDS))}")


def objective_param_problems(objective: str, params: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``params`` as keyword arguments of the objective class ``objective`` names: names its
    constructor does not take, and values of another type than the constructor's annotation."""
    from training.objectives import OBJECTIVES  # imports torch

    cls = OBJECTIVES[objective]
    accepted = inspect.signature(cls).parameters
    hints = typing.get_type_hints(cls.__init__)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    names = sorted(n for n, p in accepted.items() if p.kind is not inspect.Parameter.VAR_KEYWORD)
    problems = []
    for key, value in params.items():
        if key not in accepted:
            if not takes_any:
                close = difflib.get_close_matches(key, names, n=1)
                owners = [name for name in OBJECTIVE_NAMES if key in inspect.signature(OBJECTIVES[name]).parameters]
                if close:
                    hint = f" (did you mean {close[0]!r}?)"
                elif owners:  # a recipe's setting for its own objective, left behind by --set objective=...
                    hint = f" but of {', '.join(owners)}: --set 'objective_params={{}}' drops the recipe's"
                else:
                    hint = ""
                problems.append(
                    f"objective_params.{key} is not a parameter of objective {objective!r}{hint}; "
                    f"it takes {', '.join(names)}"
                )
            continue
        expected = hints.get(key, Any)
        if not matches_type(tuple(value) if isinstance(value, list) else value, expected):
            problems.append(f"objective_params.{key} expects {describe_type(expected)}, got {show_value(value)}")
    return problems


def _coerce(key: str, value: Any) -> Any:
    hint = _HINTS[key]
    typed = value
    if isinstance(value, list):
        value = tuple(value)
    if not matches_type(value, hint):
        raise ConfigError(f"config key {key!r} expects {describe_type(hint)}, got {show_value(typed)}")
    if hint in (float, float | None) and isinstance(value, int):
        value = float(value)
    return value


def from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """Build a config from plain values, checking every key and type."""
    kwargs = {}
    for key, value in values.items():
        if key not in _FIELDS:
            raise _unknown_key(key)
        kwargs[key] = _coerce(key, value)
    return TrainConfig(**kwargs)


def apply_overrides(values: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides; ``table.key=value`` sets one entry of objective/view params."""
    values = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in values.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        value = parse_value(raw.strip())
        if "." in key:
            table, _, sub = key.partition(".")
            if table not in ("objective_params", "view_params"):
                raise ConfigError(
                    f"dotted override {key!r}: only objective_params.<name> and view_params.<name> take dots"
                )
            values.setdefault(table, {})[sub] = value
        else:
            if key not in _FIELDS:
                raise _unknown_key(key)
            values[key] = value
    return values


# Built-in recipes that were renamed, old name → new: a recipe is named for what it trains, and a name
# that scripts already use keeps working (with a warning that says what it now is).
RENAMED_RECIPES = {"sct-tiny-pca": "distil-tiny-pca"}


def resolve_recipe(name_or_path: str | Path) -> Path:
    """A recipe file path, or the name of a built-in recipe (``sct-tiny`` → training/recipes/sct-tiny.toml; a renamed
    recipe's old name resolves to its new file, `RENAMED_RECIPES`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if str(name_or_path) in RENAMED_RECIPES:
        new = RENAMED_RECIPES[str(name_or_path)]
        warnings.warn(
            f"recipe {str(name_or_path)!r} is now called {new!r} (named for its objective); running {new!r}",
            stacklevel=3,
        )
        name_or_path = new
    builtin = RECIPES_DIR / f"{name_or_path}.toml"
    if builtin.is_file():
        return builtin
    available = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))
    raise ConfigError(f"recipe {str(name_or_path)!r} is neither a file nor a built-in recipe {available}")


def load_config(name_or_path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a TOML recipe (file or built-in name) and apply ``key=value`` overrides."""
    path = resolve_recipe(name_or_path)
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return from_dict(apply_overrides(values, overrides))
