"""The torch-free floor every other package builds on: the bundle contract (registry layout, manifest,
onnxruntime runtime with its int8 check), the built-in model catalog (names, packages, checksums, the
Hugging Face / sentence-transformers folder format), text handling (sentence split, crop rules) and the
command-line settings. numpy, tokenizers, onnxruntime and the standard library only; imports no other
package of the project, so the API process can use it without torch."""
