#!/usr/bin/env bash
# The peer of benchmarks/bench_peers.py in its best CPU configuration: infinity-emb in its own venv
# (tools/infinity-venv; torch 2.13.0 CPU first so pip does not pull a CUDA build) and an all-MiniLM-L6-v2
# folder (tools/infinity-model/all-MiniLM-L6-v2) with
#   model.onnx            optimum's ONNX export (feature-extraction), the fp32 graph;
#   model_quantized.onnx  that graph after onnxruntime's transformer optimisation (optimum's ORTOptimizer, O2 fusions
#                         for CPU) and dynamic int8 with the fields of optimum's avx512_vnni preset, per-channel — infinity prefers
#                         a file named *quantize* on CPU (get_onnx_files(prefer_quantized=True)); per-tensor scales,
#                         as in the hub's model_qint8_avx512_vnni.onnx, lose more precision (docs/BENCHMARKS.md);
#   the model's sentence-transformers files, so infinity pools by mean.
# bench_peers.py runs infinity on a copy of the folder without model_quantized.onnx for its fp32 arm.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=tools/infinity-venv
MODEL=tools/infinity-model/all-MiniLM-L6-v2
if [ ! -x "$VENV/bin/infinity_emb" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" -q install torch==2.13.0
  "$VENV/bin/pip" -q install "infinity-emb[optimum,server]"
fi
SOURCE=$(HF_HUB_OFFLINE=1 .venv/bin/embedder models path minilm-l6)
if [ ! -f "$MODEL/model_quantized.onnx" ]; then
  rm -rf "$MODEL" "$MODEL-fp32"
  HF_HUB_OFFLINE=1 "$VENV/bin/optimum-cli" export onnx --model "$SOURCE" --task feature-extraction "$MODEL"
  cp -r "$SOURCE/1_Pooling" "$SOURCE"/modules.json "$SOURCE"/sentence_bert_config.json \
    "$SOURCE"/config_sentence_transformers.json "$MODEL/"
  HF_HUB_OFFLINE=1 "$VENV/bin/python" - "$MODEL" <<'PY'
import sys
import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import quantize_dynamic
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig

folder = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    model = ORTModelForFeatureExtraction.from_pretrained(folder, file_name="model.onnx")
    ORTOptimizer.from_pretrained(model).optimize(AutoOptimizationConfig.O2(), save_dir=tmp)
    config = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True)
    # optimum's ORTQuantizer.quantize makes this call but cannot pass DefaultTensorType, which the fused
    # graph's contrib ops need (export/quantize.py does the same for our graph).
    quantize_dynamic(
        str(Path(tmp) / "model_optimized.onnx"),
        str(folder / "model_quantized.onnx"),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=config.weights_dtype,
        op_types_to_quantize=[getattr(op, "value", op) for op in config.operators_to_quantize],
        extra_options={
            "WeightSymmetric": config.weights_symmetric,
            "ActivationSymmetric": config.activations_symmetric,
            "DefaultTensorType": onnx.TensorProto.FLOAT,
        },
    )
PY
  mkdir -p "$MODEL-fp32"
  cp -r "$MODEL"/. "$MODEL-fp32/"
  rm "$MODEL-fp32/model_quantized.onnx"
fi
echo "$MODEL"
