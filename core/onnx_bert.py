"""A torch ``BertModel`` state dict recovered from a sentence-transformers ONNX export (the `minilm-l3` rebuild).

Torch-free: numpy arrays, saved by the catalog as safetensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def onnx_bert_state_dict(onnx_path: Path, prefix: str = "model.0.auto_model.") -> dict[str, np.ndarray]:
    """Recover a torch ``BertModel`` state dict from a sentence-transformers ONNX export.

    Embeddings, biases and LayerNorms keep their torch names in the file; the six weight matrices
    of each layer are anonymous ``onnx::MatMul_*`` initializers. Each such MatMul feeds an Add
    whose bias is named, so the weight is named after that bias (and transposed: ONNX stores
    ``x @ W`` while ``nn.Linear`` stores ``W.T``).
    """
    graph = onnx.load(str(onnx_path)).graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    state: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        if name.startswith(prefix):
            state[name[len(prefix) :]] = np.ascontiguousarray(array)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in arrays or node.input[1].startswith(prefix):
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [i for n in adds for i in n.input if i.startswith(prefix) and i.endswith(".bias")]
        if len(biases) != 1:
            raise ValueError(f"cannot name the weight {node.input[1]} of MatMul {node.name}: biases {biases}")
        weight_name = biases[0][len(prefix) : -len(".bias")] + ".weight"
        state[weight_name] = np.ascontiguousarray(arrays[node.input[1]].T)
    return state
