"""Backends: turn tokenised texts into embeddings (onnxruntime over an exported bundle)."""
