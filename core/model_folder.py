"""The on-disk model folder: a Hugging Face folder plus sentence-transformers' module files.

``modules.json``, ``1_Pooling/config.json``, an optional ``2_Dense/`` output layer, ``N_Normalize/`` and
``sentence_bert_config.json`` next to the weights make ``SentenceTransformer(path)`` load a checkpoint with the
right pooling, output layer, normalisation and length; `training.encoder.Encoder` reads the same files back.
Plain JSON: no torch (the Dense layer's weights are written and read by the encoder).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

POOLING_MODES = ("mean", "cls", "last", "max", "mean_sqrt_len")

# sentence-transformers' Dense activations this project writes and reads (both trace to ONNX).
DENSE_ACTIVATIONS = ("torch.nn.modules.linear.Identity", "torch.nn.modules.activation.Tanh")
DENSE_FOLDER = "2_Dense"
DENSE_WEIGHTS = "model.safetensors"  # keys linear.weight (out, in) and linear.bias (out,), as Dense saves them


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers ``Dense`` module after pooling: ``activation(W x + b)``, ``W`` is (out, in)."""

    in_features: int
    out_features: int
    bias: bool = True
    activation_function: str = DENSE_ACTIVATIONS[0]
    path: str = DENSE_FOLDER  # relative to the model folder

    def __post_init__(self) -> None:
        if self.activation_function not in DENSE_ACTIVATIONS:
            raise ValueError(
                f"Dense activation {self.activation_function!r} is not supported; use one of {DENSE_ACTIVATIONS}"
            )

    def config(self) -> dict[str, Any]:
        """Dense's ``config.json``: every field but the folder."""
        return {key: value for key, value in asdict(self).items() if key != "path"}


ST_MODEL_CONFIG = "config_sentence_transformers.json"  # where sentence-transformers keeps prompts
_ROLE_PROMPTS = {"query": ("query",), "document": ("document", "passage")}  # a text's role -> prompt names


@dataclass(frozen=True)
class Prompts:
    """sentence-transformers' prompts: a text put before each input, by name (e5's ``{"query": "query: ",
    "passage": "passage: "}``), and the one used when a caller names none (``default``, usually None)."""

    texts: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None

    def __post_init__(self) -> None:
        if self.default is not None and self.default not in self.texts:
            raise ValueError(f"default prompt {self.default!r} is not one of the prompts {sorted(self.texts)}")

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Prompts:
        """The prompts a bundle manifest records (none for bundles exported before manifests carried them)."""
        return cls(dict(manifest.get("prompts") or {}), manifest.get("default_prompt_name"))

    def for_role(self, role: str) -> str:
        """The prompt for texts of ``role`` in a retrieval task (``query`` or ``document``): the prompt of that
        name (``passage`` too for a document, as e5 names it), else the default one, as mteb picks a prompt by
        its prompt type for a sentence-transformers model."""
        named = [self.texts[name] for name in _ROLE_PROMPTS.get(role, ()) if name in self.texts]
        if named:  # a non-empty one first: sentence-transformers 3+ writes an empty "document" beside e5's "passage"
            return next((text for text in named if text), "")
        return self.text_for(None)

    @property
    def nonempty(self) -> bool:
        """Whether any prompt adds text (sentence-transformers 3+ writes ``{"query": "", "document": ""}`` into every
        model it saves: names a client may send, which add nothing)."""
        return any(self.texts.values())

    def text_for(self, name: str | None) -> str:
        """The text to put before each input for prompt ``name`` (the default prompt, or none, for None), as
        sentence-transformers' ``encode(prompt_name=...)`` does. ValueError names the prompts there are."""
        if name is None:
            return self.texts[self.default] if self.default is not None else ""
        if name in self.texts:
            return self.texts[name]
        if not self.texts:
            raise ValueError(f"prompt_name {name!r} was given, but the model has no prompts")
        raise ValueError(f"prompt_name {name!r} is not one of the model's prompts ({', '.join(sorted(self.texts))})")


# Our names <-> sentence-transformers' Pooling config keys.
ST_POOLING_KEYS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
}


def write_sentence_transformers_config(
    folder: Path,
    *,
    dim: int,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    dense: DenseLayer | None = None,
    prompts: Prompts | None = None,
) -> None:
    """Write the module files sentence-transformers reads next to a Hugging Face model.

    ``dim`` is the transformer's hidden size (what pooling sees); ``dense`` adds the output layer's config (its
    weights, ``dense.path/model.safetensors``, are the caller's to write); ``prompts``, when there are any, go to
    ``config_sentence_transformers.json``."""
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if dense is not None:
        modules.append({"idx": 2, "name": "2", "path": dense.path, "type": "sentence_transformers.models.Dense"})
        (folder / dense.path).mkdir(parents=True, exist_ok=True)
        (folder / dense.path / "config.json").write_text(json.dumps(dense.config(), indent=2))
    if normalize:
        idx = len(modules)
        path = f"{idx}_Normalize"
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": "sentence_transformers.models.Normalize"})
        (folder / path).mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    pooling_config: dict[str, Any] = {"word_embedding_dimension": dim}
    pooling_config.update({key: mode == pooling for mode, key in ST_POOLING_KEYS.items()})
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2)
    )
    if prompts is not None and prompts.texts:
        st_model = {"prompts": dict(prompts.texts), "default_prompt_name": prompts.default}
        (folder / ST_MODEL_CONFIG).write_text(json.dumps(st_model, indent=2))


def transformer_folder(folder: Path) -> Path:
    """Where the Hugging Face model of ``folder`` lives: the folder itself, or the Transformer module's subfolder
    of a sentence-transformers folder saved in the older nested layout (``0_Transformer/config.json``)."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not (folder / "config.json").is_file() and modules_file.is_file():
        for module in json.loads(modules_file.read_text()):
            if module["type"].endswith("Transformer") and module.get("path"):
                return folder / module["path"]
    return folder


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # a Hugging Face model's weights, in order of preference


def weights_file(folder: Path) -> Path | None:
    """The weights file of the Hugging Face model in ``folder`` (`transformer_folder`), or None."""
    inner = transformer_folder(folder)
    return next((inner / name for name in WEIGHT_FILES if (inner / name).is_file()), None)


TOKENIZER_FILE = "tokenizer.json"  # a fast tokenizer's whole definition, readable without transformers
TOKENIZER_CONFIG = "tokenizer_config.json"


def set_tokenizer_limit(folder: Path, max_length: int) -> bool:
    """Make the tokenizer files saved in ``folder`` cut as the model does when read on their own: truncation at
    ``max_length`` tokens from the right, no padding, and ``model_max_length`` the same. Returns whether the folder
    has a ``tokenizer.json`` (a slow tokenizer saves none).

    A fast tokenizer saves whatever truncation and padding its last call set (a training batch's length, padding
    to a batch's longest text) or it was loaded with (all-MiniLM-L6-v2's file cuts at 128 and pads to 128 where the
    model takes 256): sentence-transformers and transformers set both on every call, but the ``tokenizers``
    library and other runtimes read the file as it is, and would cut a longer text short. The export's bundle and
    every model folder a run saves go through here, so each says what ``sentence_bert_config.json`` says."""
    from tokenizers import Tokenizer  # the tokenizers package alone: no transformers, no torch

    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        return False
    fast = Tokenizer.from_file(str(path))
    fast.no_padding()
    fast.enable_truncation(max_length=max_length)  # from the right, as the service cuts by default
    fast.save(str(path))
    config_path = Path(folder) / TOKENIZER_CONFIG
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["model_max_length"] = max_length
        if "max_length" in config:  # a saved call argument transformers keeps: the same limit, not an older one
            config["max_length"] = max_length
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return True


# Every file a tokenizer of transformers' AutoTokenizer may read, whichever kind the model has.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)  # fmt: skip
# Sharded weights: each index names its shards.
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
ST_FILES = ("modules.json", "sentence_bert_config.json", ST_MODEL_CONFIG)


def embedding_files(folder: Path) -> dict[str, Path]:
    """Every file of a model folder that decides its embeddings, by its path relative to ``folder``: the Hugging
    Face model's config, weights (sharded ones too) and tokenizer files (in `transformer_folder`), sentence-
    transformers' files (modules, max length, prompts) and each module folder's config and weights (the pooling,
    a Dense layer). A change to any of them changes what the model computes, so a bundle exported from the folder
    records their digests (`embedding_file_digests`) and is exported again when they differ."""
    folder = Path(folder)
    candidates: list[str] = []
    inner = transformer_folder(folder).relative_to(folder).as_posix()
    for base in [""] if inner == "." else ["", inner]:
        names = ["config.json", *WEIGHT_FILES, *SHARD_INDEXES, *TOKENIZER_FILES, *ST_FILES]
        for index in SHARD_INDEXES:
            names += _shards(folder / base / index)
        candidates += [f"{base}/{name}" if base else name for name in names]
    for module_path in _module_paths(folder / "modules.json"):
        candidates += [f"{module_path}/{name}" for name in ("config.json", *WEIGHT_FILES)]
    return {name: folder / name for name in sorted(set(candidates)) if (folder / name).is_file()}


def _shards(index: Path) -> list[str]:
    """The weight files a sharded model's index names (none when there is no index or it cannot be read: the
    index's own digest still counts)."""
    if not index.is_file():
        return []
    try:
        return sorted({str(name) for name in json.loads(index.read_text()).get("weight_map", {}).values()})
    except (ValueError, AttributeError):
        return []


def _module_paths(modules_file: Path) -> list[str]:
    """The folders of sentence-transformers' modules other than the model's own (none when modules.json is absent
    or unreadable: its own digest still counts, and loading the folder reports what is wrong with it)."""
    if not modules_file.is_file():
        return []
    try:
        modules = json.loads(modules_file.read_text())
        paths = [str(module.get("path") or "").strip("/") for module in modules]
    except (ValueError, AttributeError, TypeError):
        return []
    return [path for path in paths if path and ".." not in path.split("/")]


def embedding_file_digests(folder: Path) -> dict[str, str]:
    """The sha256 of each of `embedding_files`, by its path relative to ``folder``: what a bundle exported from the
    folder records, and what `embedder serve --models ./folder` compares to decide whether to export it again."""
    digests = {}
    for name, path in embedding_files(folder).items():
        with open(path, "rb") as handle:
            digests[name] = hashlib.file_digest(handle, "sha256").hexdigest()
    return digests


# The module chain this project reproduces (training.encoder.Encoder and the exported bundle): the transformer,
# its pooling, at most one Dense output layer, then L2 normalisation if the folder asks for it.
SUPPORTED_MODULES = "Transformer, then Pooling, then at most one Dense, then an optional Normalize last"


def _module_kind(module: Mapping[str, Any]) -> str:
    """A modules.json entry's class name (``Pooling`` for ``sentence_transformers.models.Pooling``)."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _check_module_chain(folder: Path, modules: list[Mapping[str, Any]]) -> None:
    """Refuse a modules.json this project cannot reproduce: any module other than the supported chain, or the
    supported ones in another order, would otherwise be dropped or reordered and the exported vectors would differ
    from ``SentenceTransformer(folder).encode``. ValueError names the first offending module and what is supported."""
    kinds = [_module_kind(module) for module in modules]
    allowed_next = ("Transformer",)  # the kinds that may come at each position, given the ones before it
    for module, kind in zip(modules, kinds, strict=True):
        if kind not in allowed_next:
            raise ValueError(
                f"{folder}: modules.json module {module.get('type')!r} (path {module.get('path', '')!r}) cannot be "
                f"reproduced here; supported: {SUPPORTED_MODULES}"
            )
        allowed_next = {
            "Transformer": ("Pooling",),
            "Pooling": ("Dense", "Normalize"),
            "Dense": ("Normalize",),
            "Normalize": (),
        }[kind]
    if "Pooling" not in kinds:
        raise ValueError(f"{folder}: modules.json has no Pooling module; supported: {SUPPORTED_MODULES}")


def read_sentence_transformers_config(folder: Path) -> dict[str, Any]:
    """Pooling, normalisation, the Dense output layer (``dense``: a `DenseLayer`), max length and ``prompts`` (a
    `Prompts`) from sentence-transformers' files, where present. Modules this project cannot reproduce (anything
    but `SUPPORTED_MODULES`, in that order) raise ValueError.

    Prompts with empty text stay valid names (``prompt_name="query"`` adds nothing, as in sentence-transformers) but
    do not count as prompts pooling could leave out: sentence-transformers 3 and later write ``{"query": "",
    "document": ""}`` into every model it saves."""
    folder = Path(folder)
    found: dict[str, Any] = {}
    st_model = folder / ST_MODEL_CONFIG
    if st_model.exists():
        cfg = json.loads(st_model.read_text())
        if cfg.get("prompts"):
            found["prompts"] = Prompts(dict(cfg["prompts"]), cfg.get("default_prompt_name"))
    modules_file = folder / "modules.json"
    if modules_file.exists():
        modules = json.loads(modules_file.read_text())
        _check_module_chain(folder, modules)
        found["normalize"] = _module_kind(modules[-1]) == "Normalize"
        for module in modules:
            if _module_kind(module) == "Pooling":
                cfg = json.loads((folder / module["path"] / "config.json").read_text())
                modes = [mode for mode, key in ST_POOLING_KEYS.items() if cfg.get(key)]
                if len(modes) != 1:
                    raise ValueError(
                        f"{folder}: pooling config {cfg} is not one of {list(ST_POOLING_KEYS)}; "
                        "pass pooling= explicitly"
                    )
                found["pooling"] = modes[0]
                if "prompts" in found and found["prompts"].nonempty and cfg.get("include_prompt") is False:
                    raise ValueError(
                        f"{folder}: its pooling leaves the prompt's tokens out (include_prompt: false), which this "
                        f"project's pooling does not do; remove the prompts from {ST_MODEL_CONFIG} to use the model "
                        "without them"
                    )
            elif _module_kind(module) == "Dense":
                cfg = json.loads((folder / module["path"] / "config.json").read_text())
                found["dense"] = DenseLayer(
                    in_features=int(cfg["in_features"]),
                    out_features=int(cfg["out_features"]),
                    bias=bool(cfg.get("bias", True)),
                    activation_function=cfg.get("activation_function", "torch.nn.modules.activation.Tanh"),
                    path=module["path"],
                )
    st_config = transformer_folder(folder) / "sentence_bert_config.json"  # beside the weights in either layout
    if st_config.exists():
        found["max_seq_length"] = int(json.loads(st_config.read_text())["max_seq_length"])
    return found


# What the trainer writes into its run folder (``DIR/recipe.json``, next to ``DIR/best`` and ``DIR/final``): the
# resolved config plus ``trained_on``, the corpus names the weights were trained on (core.corpora.CORPUS_DOMAINS
# names their domains; ``custom`` for text given as a path or in memory).
RECIPE_FILE = "recipe.json"
TRAINED_ON_KEY = "trained_on"
# The model folders a run writes into its output folder: the best-validated model and the last one.
BEST_DIR, FINAL_DIR = "best", "final"


def run_folder_hint(folder: str | Path) -> str | None:
    """What to pass instead when ``folder`` is a training run's output folder rather than a model folder (its
    ``best/`` — what to export — and ``final/``), or None when it is not one. A run's folder is known by its
    ``recipe.json`` or by a model folder in ``best/`` or ``final/``."""
    folder = Path(folder)
    models = [
        folder / name for name in (BEST_DIR, FINAL_DIR) if (transformer_folder(folder / name) / "config.json").is_file()
    ]
    if models:
        named = " or ".join(
            f"{path} ({'the best-validated model, what to export' if path.name == BEST_DIR else 'the last step'})"
            for path in models
        )
        return f"{folder} is a training run's folder, not a model folder: pass {named}"
    if (folder / RECIPE_FILE).is_file():
        return (
            f"{folder} is a training run's folder, and the run has saved no model yet: {folder / BEST_DIR} is written "
            f"at its first validation and {folder / FINAL_DIR} at its end; pass one of those"
        )
    return None


def read_trained_on(folder: str | Path) -> list[str]:
    """The corpora a checkpoint was trained on, from the ``recipe.json`` in ``folder`` or in its run folder
    (``runs/NAME/best`` → ``runs/NAME/recipe.json``). Empty when none is declared: a built-in or downloaded model
    whose training data is unknown, or a checkpoint written before recipes recorded ``trained_on``."""
    folder = Path(folder).expanduser()
    for recipe in (folder / RECIPE_FILE, folder.parent / RECIPE_FILE):
        if folder.is_dir() and recipe.is_file():
            names = json.loads(recipe.read_text()).get(TRAINED_ON_KEY)
            return [str(name) for name in names] if isinstance(names, list) else []
    return []
