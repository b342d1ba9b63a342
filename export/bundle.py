"""Checkpoint → published ONNX bundle: `export_bundle` and `ensure_default_bundle`.

Steps (each a stage of the progress bar): load and truncate the encoder (TMFT, paper 003 §3: keep
the embedding layer and the first *l* layers and pool there), trace it with pooling and L2
normalisation inside the graph, optimise the graph for CPU, optionally quantise to int8 (onnxruntime's
graph, and OpenVINO's where it is installed: `export.openvino_int8`), check parity against torch on
the probe set, run the caller's validation, then reserve a version and rename the finished folder
into ``<registry>/<name>/<version>``. Everything up to the rename happens in a private temporary
folder, so a failed export leaves the registry untouched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from core import held
from core import registry as reg
from core.catalog import BUILTIN_MODELS, resolve_model, sha256_file
from core.model_folder import RECIPE_FILE, embedding_file_digests, read_trained_on, weights_file
from core.runtime import PROBES_FILE, write_probes
from export import graph
from export.openvino_int8 import (
    OPENVINO_INT8_FILE,
    OPENVINO_INT8_VARIANT,
    build_openvino_int8,
    openvino_int8_missing,
    remove_openvino_int8,
)
from export.parity import ParityError, check_parity
from export.probes import probe_texts
from export.quantize import choose_int8
from export.tokenizer_files import check_fast_tokenizer, check_is_fast, write_tokenizer
from training.encoder import Encoder
from training.pooling import check_pooling

log = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "int8", "auto")
ONNX_FILES = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
DEFAULT_MODEL = "minilm-l6"
# An export's folder under the temporary folder, held while it runs: the next export deletes those of killed ones.
SCRATCH_PREFIX = "embedder-export-"


def _load(model: str | os.PathLike[str] | Encoder, pooling: str | None) -> tuple[Encoder, dict[str, Any]]:
    """A private float32 CPU copy of the encoder, and where it came from: ``model`` (its name or folder), ``sha256``
    (its weights') and, for a folder, ``files`` — the sha256 of every file that decides its embeddings
    (`core.model_folder.embedding_file_digests`: weights, configs, tokenizer, pooling, prompts, Dense layer), which
    `embedder serve --models ./folder` compares to export the folder again after any of them changed."""
    if isinstance(model, Encoder):
        check_is_fast(model.tokenizer, model.source or "the Encoder")
        encoder = model.clone()
        source: dict[str, Any] = {"model": encoder.source or "in-memory Encoder", "sha256": _state_dict_sha256(encoder)}
        if pooling is not None:
            encoder.pooling = check_pooling(pooling)
    else:
        folder = resolve_model(model)
        files = embedding_file_digests(folder)  # before loading: a file changed meanwhile makes the next start export
        check_fast_tokenizer(folder)
        encoder = Encoder.from_pretrained(folder, pooling=pooling)
        weights = weights_file(folder)
        digest = sha256_file(weights) if weights is not None else _state_dict_sha256(encoder)
        source = {"model": os.fspath(model), "sha256": digest, "files": files}
    encoder.normalize = True  # bundles always serve unit vectors: the normalisation is in the graph
    return encoder.float().cpu().eval(), source


def _state_dict_sha256(encoder: Encoder) -> str:
    """A digest of an in-memory encoder's weights (it may differ from the folder it was loaded from)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(encoder.backbone.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _base_model(model: str | os.PathLike[str] | Encoder, encoder: Encoder, recipe: dict[str, Any]) -> str:
    """A built-in model's name; for a training run's checkpoint, the model its recipe trained from (not ``best``);
    else the folder's name."""
    if isinstance(model, str) and model in BUILTIN_MODELS:
        return model
    trained_from = recipe.get("model")
    if isinstance(trained_from, str) and trained_from:
        return trained_from if trained_from in BUILTIN_MODELS else Path(trained_from).name
    return Path(encoder.source).name if encoder.source else "in-memory Encoder"


def _recipe(model: str | os.PathLike[str] | Encoder) -> dict[str, Any]:
    """The ``recipe.json`` of a model folder that a training run wrote (in the folder, or in its run folder:
    ``runs/NAME/best`` → ``runs/NAME/recipe.json``), as `core.model_folder.read_trained_on` finds it; {} for a
    built-in model, an `Encoder` (its caller says what it is) or a folder without one."""
    if isinstance(model, Encoder) or (isinstance(model, str) and model in BUILTIN_MODELS):
        return {}
    folder = Path(model).expanduser()
    for path in (folder / RECIPE_FILE, folder.parent / RECIPE_FILE):
        if folder.is_dir() and path.is_file():
            try:
                recipe = json.loads(path.read_text())
            except (OSError, ValueError):
                return {}
            return recipe if isinstance(recipe, dict) else {}
    return {}


def _method(recipe: dict[str, Any]) -> dict[str, Any]:
    """How a folder's weights were made when the caller does not say: its training recipe's objective and settings,
    else ``pretrained`` (a downloaded or built-in model)."""
    if recipe.get("objective"):
        return {"name": str(recipe["objective"]), "hyperparameters": recipe}
    return {"name": "pretrained", "hyperparameters": {}}


def _trained_on(model: str | os.PathLike[str] | Encoder) -> list[str]:
    """The corpora a checkpoint's recipe.json declares (its folder or its run folder); none for a built-in model."""
    if isinstance(model, Encoder):
        return read_trained_on(model.source) if model.source else []
    return [] if isinstance(model, str) and model in BUILTIN_MODELS else read_trained_on(model)


def _hash_files(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != reg.MANIFEST
    }


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / reg.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def export_bundle(
    model: str | Path | Encoder,
    registry: Path,
    name: str,
    *,
    layers: int | None = None,
    quantize: str = "none",
    promote: bool = False,
    parent: str | None = None,
    method: dict | None = None,
    validate: Callable[[Path], dict] | None = None,
    pooling: str | None = None,
    trained_on: Sequence[str] | None = None,
) -> Path:
    """Export ``model`` to a new version of bundle ``name`` in the registry; return its folder.

    Args:
        model: a built-in model name, a Hugging Face / training checkpoint folder, or an `Encoder`
            (copied, never modified).
        registry: the registry root (``<registry>/<name>/<version>``).
        name: bundle name (a lower-case slug, see `export.reg.validate_name`).
        layers: keep the embedding layer and the first ``layers`` transformer layers (default: all).
        quantize: ``none`` (serve fp32); ``int8`` (also write ``model_int8.onnx`` with the fastest setting of
            `export.quantize.CANDIDATES` that passes parity on this CPU, and serve it; `ParityError` when none
            does); ``auto`` (the same, but publish fp32 only when no setting passes).
        promote: point ``<name>/current`` at the new version once published.
        parent: the bundle this one derives from, e.g. ``"minilm-l6@3"``.
        method: how the weights were made: ``{"name": ..., "hyperparameters": {...}}``. Default: a training run's
            checkpoint folder's recipe.json (its ``objective`` and the whole recipe), which also names the
            ``base_model`` it was trained from; ``pretrained`` for any other model.
        validate: called with the finished (unpublished) bundle folder; may write report files
            into it; its returned dict becomes ``manifest["validation"]``. If it raises, nothing
            is published and the exception propagates.
        pooling: override the checkpoint's pooling (``mean``, ``cls``, ``last``).
        trained_on: the corpora the weights were trained or adapted on (manifest ``trained_on``; evaluation splits
            in-domain from out-of-domain tasks by them). Default: a checkpoint folder's recipe.json
            (`core.model_folder.read_trained_on`); none for a built-in model, whose training data is unknown.

    Raises:
        ParityError: ONNX disagrees with torch on the probe set (or, with ``quantize="int8"``, no int8
            setting passes); lists every failed check.
        ValueError: bad ``layers``, ``quantize`` or ``pooling``; RegistryError: bad ``name``, or a registry it
            cannot write in (checked before anything is built).
    """
    reg.validate_name(name)  # before the name becomes part of a temporary folder's path
    check_writable(Path(registry) / name)
    held.sweep(Path(tempfile.gettempdir()), f"{SCRATCH_PREFIX}*")  # those of exports killed before they finished
    scratch = held.make_held(f"{SCRATCH_PREFIX}{name}-")
    staging = scratch / "bundle"
    staging.mkdir()
    try:
        manifest = build_bundle(
            model, staging, name, layers=layers, quantize=quantize, parent=parent, method=method, pooling=pooling,
            trained_on=trained_on,
        )  # fmt: skip
        if validate is not None:
            log.info("export %s: validate", name)
            manifest["validation"] = validate(staging)
        return publish_bundle(staging, registry, manifest, promote=promote)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        held.let_go(scratch)


def check_writable(folder: Path) -> None:
    """Raise RegistryError unless a bundle could be published into ``folder``: it, or the nearest folder above it
    that exists (the export makes the rest), must be a folder this process can write in. Checked before an export
    starts, so an unwritable registry fails at once, not after minutes of tracing, quantising and parity."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise reg.RegistryError(f"cannot publish into {folder}: {existing} is not a folder; nothing was exported")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise reg.RegistryError(
            f"cannot publish into {folder}: {existing} is not writable ({err.strerror}); nothing was exported"
        ) from None


def build_bundle(
    model: str | Path | Encoder,
    staging: Path,
    name: str,
    *,
    layers: int | None = None,
    quantize: str = "none",
    parent: str | None = None,
    method: dict | None = None,
    pooling: str | None = None,
    trained_on: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write a complete, parity-checked bundle into the empty folder ``staging``; return its manifest (also
    written there, without a version until `publish_bundle`). Arguments and errors as `export_bundle`."""
    reg.validate_name(name)
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS}, got {quantize!r}")
    stages = ["load", "trace", "optimise"] + (["quantise", "openvino int8"] if quantize != "none" else []) + ["parity"]
    progress = tqdm(total=len(stages), desc=f"export {name}", unit="stage", leave=False)

    def stage(label: str) -> None:
        progress.set_postfix_str(label)
        log.info("export %s: %s", name, label)

    try:
        stage("load")
        encoder, source = _load(model, pooling)
        source_layers = encoder.num_layers
        if layers is not None and layers != source_layers:
            encoder.truncate(layers)
        progress.update()

        stage("trace")
        tokenizer = write_tokenizer(encoder.tokenizer, staging, encoder.max_seq_length)
        traced = staging / "traced.onnx"
        with torch.no_grad():
            graph.export_onnx(encoder, traced)
        progress.update()

        stage("optimise")
        graph.optimize_graph(traced, staging / ONNX_FILES["fp32"], encoder)
        traced.unlink()
        texts = probe_texts()
        reference = encoder.encode(texts, batch_size=16)  # (N, dim): what every graph is held against
        write_probes(staging, texts, reference)  # the serving CPU re-checks int8 against these
        progress.update()

        recipe = _recipe(model)
        manifest: dict[str, Any] = {
            "name": name,
            "version": None,  # allocated at publish time, so a failed export never takes a number
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": source,
            "base_model": _base_model(model, encoder, recipe),
            "parent": parent,
            "method": method or _method(recipe),
            "trained_on": list(trained_on) if trained_on is not None else _trained_on(model),
            "layers": encoder.num_layers,
            "source_layers": source_layers,
            "dim": encoder.dim,
            "pooling": encoder.pooling,
            "normalized": True,
            "max_seq_length": encoder.max_seq_length,
            "prompts": dict(encoder.prompts.texts),  # put before a text by the server, outside the graph
            "default_prompt_name": encoder.prompts.default,
            "pad_token_id": int(encoder.tokenizer.pad_token_id or 0),
            "tokenizer": tokenizer,
            "inputs": graph.input_names(encoder),
            "output": "sentence_embedding",
            "opset": graph.DEFAULT_OPSET,
            "graph_optimizer": graph.DEFAULT_OPTIMIZER,
            "quantization": "none",
            "int8": None,
            "onnx": {"fp32": ONNX_FILES["fp32"]},
            "openvino": {},  # graphs only OpenVINO runs (core.runtime.GRAPH_KEYS)
            "openvino_int8": None,
            "serve_variant": "fp32",
            "probes": {"file": PROBES_FILE, "count": len(texts)},
            "files": {},
            "parity": None,
            "validation": None,
        }
        _write_manifest(staging, manifest)
        int8_missed: list[str] = []  # quantize="int8" and no setting passed: listed with any other parity failure
        if quantize != "none":
            stage("quantise")
            manifest["int8"] = choose_int8(staging, ONNX_FILES["int8"], reference, texts)
            if manifest["int8"]["chosen"] is not None:
                manifest.update(quantization="int8", onnx=dict(ONNX_FILES), serve_variant="int8")
                _write_manifest(staging, manifest)
            elif quantize == "int8":
                int8_missed = [f"{c['name']}: {f}" for c in manifest["int8"]["candidates"] for f in c["failures"]]
            else:
                log.warning("export %s: no int8 setting keeps the parity bars on this CPU; fp32 only", name)
            progress.update()
            stage("openvino int8")
            manifest["openvino_int8"] = _openvino_int8(staging, reference, texts, name)
            if (manifest["openvino_int8"] or {}).get("kept"):
                manifest["openvino"] = {OPENVINO_INT8_VARIANT: OPENVINO_INT8_FILE}
            _write_manifest(staging, manifest)
            progress.update()

        stage("parity")
        try:
            manifest["parity"] = check_parity(encoder, staging, texts, list(manifest["onnx"]), reference=reference)
        except ParityError as err:
            raise ParityError(err.failures + int8_missed, {**err.figures, "int8": manifest["int8"]}) from None
        if int8_missed:
            raise ParityError(int8_missed, {**manifest["parity"], "int8": manifest["int8"]})
        progress.update()
    finally:
        progress.close()
    return manifest


def _openvino_int8(staging: Path, reference: Any, texts: Sequence[str], name: str) -> dict[str, Any] | None:
    """OpenVINO's int8 graph where this machine can build it (`export.openvino_int8`): a candidate engine beside
    onnxruntime's int8 graph, never required — a build that fails or misses the bars leaves the bundle without it."""
    missing = openvino_int8_missing()
    if missing:
        log.info("export %s: no OpenVINO int8 graph (%s)", name, missing)
        return None
    try:
        record = build_openvino_int8(staging, reference, texts)
    except Exception as error:  # NNCF or OpenVINO failing on an architecture they do not know: skip the graph
        log.warning("export %s: OpenVINO int8 graph failed, left out: %s: %s", name, type(error).__name__, error)
        remove_openvino_int8(staging)
        return {"kept": False, "failures": [f"{type(error).__name__}: {str(error)[:300]}"]}
    if not record["kept"]:
        log.warning("export %s: OpenVINO int8 graph misses the parity bars, left out: %s", name, record["failures"])
    return record


def publish_bundle(staging: Path, registry: Path, manifest: dict[str, Any], *, promote: bool = False) -> Path:
    """Reserve the next version of ``manifest["name"]``, hash the files, and rename a copy of ``staging`` into
    ``<registry>/<name>/<version>`` (readers never see half a bundle); promote it if asked. Returns its folder."""
    registry_dir, name = Path(registry), manifest["name"]
    version = reg.reserve_version(registry_dir, name)
    target_staging = reg.staging_path(registry_dir, name, version)
    try:
        manifest["version"] = version
        manifest["files"] = _hash_files(staging)
        _write_manifest(staging, manifest)
        # The temporary folder may be on another filesystem; copy next to the target, then rename.
        shutil.copytree(staging, target_staging)
        os.chmod(target_staging, 0o755)  # a staging folder may be owner-only; the service may run as another user
        path = reg.publish(target_staging, registry_dir, name, version)
    except BaseException:
        shutil.rmtree(target_staging, ignore_errors=True)
        reg.release(registry_dir, name, version)
        raise
    if promote:
        reg.promote(registry_dir, name, version)
    log.info("exported %s", path)
    return path


def ensure_default_bundle(registry: Path) -> Path:
    """Export and promote ``minilm-l6`` unless the registry already serves a ``minilm-l6``; return its folder.

    The bundle carries both graphs (``quantize="auto"``): the service serves int8 where it passes the probe
    check on the serving CPU and fp32 elsewhere."""
    registry_dir = Path(registry)
    if reg.current_version(registry_dir, DEFAULT_MODEL) is None:
        export_bundle(DEFAULT_MODEL, registry_dir, DEFAULT_MODEL, quantize="auto", promote=True)
    return reg.current_bundle(registry_dir, DEFAULT_MODEL)
