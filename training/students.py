"""Small students for distillation (SCT, paper 001 §3.4): built from what exists offline.

- `layer_subset_student`: a copy of the teacher keeping only some layers (e.g. [0, 5] of
  MiniLM-L6), so the student starts with the teacher's own weights.
- `tiny_bert_student`: a genuinely small BERT (e.g. 2 layers × 128 hidden) whose embedding
  tables start from a PCA projection of the teacher's, and whose transformer layers are random; optionally with
  an output layer (sentence-transformers' Dense) back into the teacher's width, initialised with the same PCA
  basis, which stays in the saved model (a 128-d student mapped to 384-d scored 86 % out-of-domain where the same
  student without the map scored 80 %; docs/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import BertConfig, BertModel

from core.model_folder import DenseLayer
from training.encoder import Encoder, OutputLayer


def layer_subset_student(teacher: Encoder, layers: Sequence[int]) -> Encoder:
    """A deep copy of ``teacher`` that keeps only ``layers`` (indices into the teacher's layers)."""
    return teacher.clone().select_layers(layers)


def pca_projection(weights: torch.Tensor, dim: int) -> torch.Tensor:
    """The ``(H, dim)`` matrix of the top-``dim`` principal directions of ``(N, H)`` weights."""
    if not 0 < dim <= weights.shape[1]:
        raise ValueError(f"PCA dimension must be between 1 and {weights.shape[1]}, got {dim}")
    centred = weights.double() - weights.double().mean(dim=0, keepdim=True)  # (N, H)
    covariance = centred.T @ centred / weights.shape[0]  # (H, H)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
    top = eigenvectors[:, torch.argsort(eigenvalues, descending=True)[:dim]]  # (H, dim)
    # eigh's sign is arbitrary: fix it so the projection (and the student) is deterministic.
    signs = torch.sign(top[top.abs().argmax(dim=0), torch.arange(dim)])
    return (top * signs).to(weights.dtype)


def tiny_bert_student(
    teacher: Encoder,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    seed: int = 0,
    output_dim: int | None = None,
) -> Encoder:
    """A small random BERT with the teacher's tokenizer and PCA-initialised embeddings.

    Word, position and token-type tables are all projected with the same PCA basis of the
    teacher's word embeddings, so their sum (what the embedding LayerNorm sees) is the projection
    of the teacher's sum. Works for any teacher whose backbone has BERT-style embedding tables.

    ``output_dim`` adds a linear output layer ``hidden_size → output_dim`` (no activation, bias 0). When it is the
    teacher's width it starts as the PCA basis itself (``W = P``, so the output is the PCA reconstruction of the
    pooled vector); otherwise it is randomly initialised.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    embeddings = teacher.backbone.embeddings
    word = embeddings.word_embeddings.weight.detach()
    if hidden_size > word.shape[1]:
        raise ValueError(f"hidden_size {hidden_size} exceeds the teacher's embedding width {word.shape[1]}")
    positions = getattr(embeddings, "position_embeddings", None)
    types = getattr(embeddings, "token_type_embeddings", None)
    config = BertConfig(
        vocab_size=word.shape[0],
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=positions.weight.shape[0] if positions is not None else 512,
        type_vocab_size=types.weight.shape[0] if types is not None else 2,
        pad_token_id=teacher.tokenizer.pad_token_id or 0,
        architectures=["BertModel"],
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        backbone = BertModel(config, add_pooling_layer=False)
    finally:
        torch.random.set_rng_state(generator_state)
    projection = pca_projection(word, hidden_size)  # (H_teacher, hidden_size)
    with torch.no_grad():
        backbone.embeddings.word_embeddings.weight.copy_(word @ projection)
        if positions is not None:
            backbone.embeddings.position_embeddings.weight.copy_(positions.weight.detach() @ projection)
        if types is not None:
            backbone.embeddings.token_type_embeddings.weight.copy_(types.weight.detach() @ projection)
    output = None
    if output_dim is not None:
        if output_dim < 1:
            raise ValueError(f"output_dim must be a positive width, got {output_dim}")
        output = OutputLayer(DenseLayer(in_features=hidden_size, out_features=output_dim, bias=True))
        with torch.no_grad():
            output.linear.bias.zero_()
            if output_dim == word.shape[1]:
                output.linear.weight.copy_(projection)  # (H_teacher, hidden_size): back along the PCA basis
    student = Encoder(
        backbone,
        teacher.tokenizer,
        pooling=teacher.pooling,
        normalize=teacher.normalize,
        max_seq_length=teacher.max_seq_length,
        output=output,
        prompts=teacher.prompts,  # same tokenizer, same inputs: the teacher's prompts
    )
    return student.to(teacher.device)
