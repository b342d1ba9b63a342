"""Encoder → ONNX graph: trace, optimise for CPU (int8 lives in `export.quantize`).

The traced module is `training.encoder.Encoder` itself, so pooling and L2 normalisation are part
of the graph and the output ``sentence_embedding`` is final. The legacy TorchScript exporter
(``torch.onnx.export(dynamo=False)``) is used: it traces transformers 4.57's BERT, MPNet and
ELECTRA with dynamic batch and sequence axes, and its output is what onnxruntime's transformer
optimizer pattern-matches (the dynamo exporter's graph is not fused by it).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
import torch
from transformers import PreTrainedModel

from core.runtime import OUTPUT_NAME
from training.encoder import Encoder

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# What `export_bundle` uses. Measured by benchmarks/bench_export.py (docs/BENCHMARKS.md, "Export"): onnxruntime's
# transformer optimizer (fused Attention / SkipLayerNorm / BiasGelu) is within the machine's noise of onnxruntime's
# own graph optimisation on fp32 (ahead on paragraphs, behind on short sentences), and its fused graph is the one
# the int8 variant quantises (2.2x torch on short sentences at mean cosine 0.99).
DEFAULT_OPTIMIZER = "transformers"
OPTIMIZERS = ("transformers", "ort", "none")
# onnxruntime.transformers.optimizer model types whose fusions fit these encoder families.
_FUSION_MODEL_TYPES = {"bert": "bert", "electra": "bert", "roberta": "bert", "xlm-roberta": "bert", "mpnet": "bert"}


def input_names(encoder: Encoder) -> list[str]:
    """The graph inputs: ``input_ids``, ``attention_mask`` (+ ``token_type_ids`` if the model uses them)."""
    return ["input_ids", "attention_mask"] + (["token_type_ids"] if encoder.uses_token_type_ids else [])


def eager_backbone(backbone: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a backbone built with eager attention.

    transformers picks the attention class (sdpa or eager) when a model is built, and the SDPA
    path traces into a graph the transformer optimizer does not fuse; a rebuilt eager copy traces
    into the plain MatMul/Softmax pattern it recognises.
    """
    if getattr(backbone.config, "_attn_implementation", "eager") == "eager":
        return backbone
    config = copy.deepcopy(backbone.config)
    kwargs = {}
    if hasattr(backbone, "pooler") and backbone.pooler is None:
        kwargs["add_pooling_layer"] = False
    rebuilt = type(backbone)._from_config(config, attn_implementation="eager", **kwargs)
    rebuilt.load_state_dict(backbone.state_dict(), strict=True)
    return rebuilt.to(backbone.device).eval()


@contextlib.contextmanager
def traceable_masks() -> Iterator[None]:
    """transformers builds decoder models' causal masks with ``torch.vmap`` (GPT-2, Llama, Qwen), which TorchScript
    cannot trace: while tracing, optimum's vectorised mask functions stand in for them, as optimum's own exporter
    does (`optimum.exporters.onnx.model_patcher`). Encoders (BERT and kin) build no such mask."""
    from optimum.exporters.onnx import model_patcher as optimum_patches
    from transformers import masking_utils

    masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS
    originals = (masks["sdpa"], masks["eager"], masking_utils.find_packed_sequence_indices)
    masks.register("sdpa", optimum_patches.sdpa_mask_without_vmap)
    masks.register("eager", optimum_patches.eager_mask_without_vmap)
    masking_utils.find_packed_sequence_indices = optimum_patches.find_packed_sequence_indices_patched
    try:
        yield
    finally:
        masks.register("sdpa", originals[0])
        masks.register("eager", originals[1])
        masking_utils.find_packed_sequence_indices = originals[2]


def export_onnx(encoder: Encoder, path: Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Trace ``encoder`` (pooling + normalisation included) to ``path`` with dynamic batch/sequence axes."""
    names = input_names(encoder)
    traced = copy.copy(encoder)  # shallow: shares weights; only the backbone attribute is swapped
    nn_modules = dict(traced._modules)
    nn_modules["backbone"] = eager_backbone(encoder.backbone)
    traced._modules = nn_modules
    traced = traced.cpu().eval()
    # Two texts of different lengths, so the trace sees real padding in the mask.
    features = encoder.tokenizer(
        ["a short text", "a somewhat longer text used to trace the graph with padding"],
        padding=True,
        return_tensors="pt",
    )
    args = tuple(features[name] for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[OUTPUT_NAME] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad(), traceable_masks():
        warnings.simplefilter("ignore")  # TracerWarnings about constants in HF mask helpers are benign
        torch.onnx.export(
            traced,
            args,
            str(path),
            input_names=names,
            output_names=[OUTPUT_NAME],
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    onnx.checker.check_model(str(path))
    return Path(path)


def optimize_graph(src: Path, dst: Path, encoder: Encoder, *, optimizer: str = DEFAULT_OPTIMIZER) -> Path:
    """Optimise an exported graph for CPU inference.

    - ``transformers``: onnxruntime's transformer optimizer fuses embeddings + LayerNorm, attention,
      bias + GELU and residual + LayerNorm into contrib ops (falls back to ``ort`` for model types it
      has no fusions for);
    - ``ort``: onnxruntime's own offline graph optimisation (constant folding, basic fusions);
    - ``none``: copy the traced graph unchanged.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    model_type = getattr(encoder.config, "model_type", "")
    if optimizer == "transformers" and model_type in _FUSION_MODEL_TYPES:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(
            str(src),
            model_type=_FUSION_MODEL_TYPES[model_type],
            num_heads=int(encoder.config.num_attention_heads),
            hidden_size=int(encoder.config.hidden_size),
            opt_level=0,  # python fusions only; onnxruntime applies its own optimisations at load
        )
        log.info("transformer optimizer fused %s", optimized.get_fused_operator_statistics())
        optimized.save_model_to_file(str(dst))
    elif optimizer in ("transformers", "ort"):
        options = ort.SessionOptions()
        # EXTENDED, not ALL: layout changes from ALL are specific to this machine's CPU.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(dst)
        options.log_severity_level = 3
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    else:
        onnx.save(onnx.load(str(src)), str(dst))
    return Path(dst)
