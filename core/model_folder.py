"""The on-disk model folder: a Hugging Face folder plus sentence-transformers' module files.

``modules.json``, ``1_Pooling/config.json``, ``2_Normalize/`` and ``sentence_bert_config.json`` next to
the weights make ``SentenceTransformer(path)`` load a checkpoint with the right pooling, normalisation and
length; `training.encoder.Encoder` reads the same files back. Plain JSON: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POOLING_MODES = ("mean", "cls", "last")

# Our names <-> sentence-transformers' Pooling config keys.
ST_POOLING_KEYS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
}


def write_sentence_transformers_config(
    folder: Path, *, dim: int, pooling: str, normalize: bool, max_seq_length: int
) -> None:
    """Write the module files sentence-transformers reads next to a Hugging Face model."""
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    pooling_config: dict[str, Any] = {"word_embedding_dimension": dim}
    pooling_config.update({key: mode == pooling for mode, key in ST_POOLING_KEYS.items()})
    pooling_config.update({"pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2)
    )


def read_sentence_transformers_config(folder: Path) -> dict[str, Any]:
    """Pooling, normalisation and max length from sentence-transformers' files, where present."""
    folder = Path(folder)
    found: dict[str, Any] = {}
    modules_file = folder / "modules.json"
    if modules_file.exists():
        modules = json.loads(modules_file.read_text())
        found["normalize"] = any(m["type"].endswith("Normalize") for m in modules)
        for module in modules:
            if module["type"].endswith("Pooling"):
                cfg = json.loads((folder / module["path"] / "config.json").read_text())
                modes = [mode for mode, key in ST_POOLING_KEYS.items() if cfg.get(key)]
                if len(modes) != 1:
                    raise ValueError(
                        f"{folder}: pooling config {cfg} is not one of {list(ST_POOLING_KEYS)}; "
                        "pass pooling= explicitly"
                    )
                found["pooling"] = modes[0]
    st_config = folder / "sentence_bert_config.json"
    if st_config.exists():
        found["max_seq_length"] = int(json.loads(st_config.read_text())["max_seq_length"])
    return found


# What the trainer writes into its run folder (``DIR/recipe.json``, next to ``DIR/best`` and ``DIR/final``): the
# resolved config plus ``trained_on``, the corpus names the weights were trained on (evaluation.data.CORPUS_DOMAINS
# names their domains; ``custom`` for text given as a path or in memory).
RECIPE_FILE = "recipe.json"
TRAINED_ON_KEY = "trained_on"


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
