"""Write a layer-subset student whose feed-forward blocks (and, with ``--heads``, attention) keep only their most
active neurons (heads).

A 2 × 384 student of minilm-l6 costs about 2 × (4 + 8) d² multiply-adds per token (attention projections, then the
1,536-wide feed-forward block); three layers with a 768-wide block cost 3 × (4 + 4) d², the same. This script
keeps ``--layers`` of the teacher and, in each, the ``--intermediate`` neurons with the largest mean
|activation| × ‖output weights‖ over ``--texts`` paragraphs of the recipe's corpus (with ``--heads N``, also the N
heads of largest mean context-vector norm × output-projection slice norm, through transformers' head pruning), and
saves a model folder that `embedder train sct-tiny --set model=FOLDER --set teacher=minilm-l6 ...` then distils.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/pruned_student.py --layers 0 3 5 --intermediate 768 \
        --out runs/pruned-l3-768
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from training.assembly import cut_texts
from training.data import load_corpus
from training.encoder import Encoder, find_layers


def importance(
    encoder: Encoder, texts: list[str], batch_size: int = 32
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, each feed-forward neuron's mean |activation| over real tokens times its output weights' norm, and
    each attention head's mean context-vector norm times its slice of the output projection's norm."""
    owner, attr = find_layers(encoder.backbone)
    layers = list(getattr(owner, attr))
    sums = [torch.zeros(layer.intermediate.dense.out_features) for layer in layers]
    heads = [torch.zeros(layer.attention.self.num_attention_heads) for layer in layers]
    count = torch.zeros(())
    masks: list[torch.Tensor] = []
    hooks = []
    for i, layer in enumerate(layers):

        def record(_module: nn.Module, _inputs: object, output: torch.Tensor, i: int = i) -> None:
            mask = masks[-1].unsqueeze(-1)  # (B, T, 1)
            sums[i] += (output.abs() * mask).sum(dim=(0, 1))

        def record_heads(module: nn.Module, _inputs: object, output: object, i: int = i) -> None:
            context = output[0] if isinstance(output, tuple) else output  # (B, T, heads * size)
            b, t, _ = context.shape
            per_head = context.reshape(b, t, module.num_attention_heads, -1).norm(dim=-1)  # (B, T, heads)
            heads[i] += (per_head * masks[-1].unsqueeze(-1)).sum(dim=(0, 1))

        hooks.append(layer.intermediate.register_forward_hook(record))
        hooks.append(layer.attention.self.register_forward_hook(record_heads))
    encoder.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                batch = encoder.tokenize(texts[start : start + batch_size])
                masks.append(batch["attention_mask"].float())
                count += masks[-1].sum()
                encoder.backbone(**batch)  # tokenize gives the backbone's own inputs
    finally:
        for hook in hooks:
            hook.remove()
    neurons = [
        (total / count) * layer.output.dense.weight.detach().norm(dim=0)
        for total, layer in zip(sums, layers, strict=True)
    ]
    head_scores = []
    for total, layer in zip(heads, layers, strict=True):
        out = layer.attention.output.dense.weight.detach()  # (H, heads * size)
        slices = out.reshape(out.shape[0], len(total), -1).norm(dim=(0, 2))
        head_scores.append((total / count) * slices)
    return neurons, head_scores


def prune_heads(encoder: Encoder, scores: list[torch.Tensor], keep: int) -> Encoder:
    """Keep the ``keep`` most important attention heads of every layer (transformers' own head pruning)."""
    plan = {i: torch.argsort(s)[: len(s) - keep].tolist() for i, s in enumerate(scores)}
    encoder.backbone.prune_heads(plan)
    return encoder


def prune_feed_forward(encoder: Encoder, scores: list[torch.Tensor], keep: int) -> Encoder:
    """Keep the ``keep`` most important neurons of every layer's feed-forward block, in place."""
    owner, attr = find_layers(encoder.backbone)
    for layer, score in zip(getattr(owner, attr), scores, strict=True):
        chosen = torch.argsort(score, descending=True)[:keep].sort().values
        inner, outer = layer.intermediate.dense, layer.output.dense
        new_inner = nn.Linear(inner.in_features, keep)
        new_outer = nn.Linear(keep, outer.out_features)
        with torch.no_grad():
            new_inner.weight.copy_(inner.weight[chosen])
            new_inner.bias.copy_(inner.bias[chosen])
            new_outer.weight.copy_(outer.weight[:, chosen])
            new_outer.bias.copy_(outer.bias)
        layer.intermediate.dense, layer.output.dense = new_inner, new_outer
    encoder.backbone.config.intermediate_size = keep
    return encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 3, 5])
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--heads", type=int, default=None, help="attention heads kept per layer (default: all)")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--corpus", default="enwiki+aclsum+lee_background")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    encoder = Encoder.from_pretrained(args.teacher)
    limit = encoder.max_seq_length
    student = encoder.clone().select_layers(args.layers)
    cut_texts(student, 128)  # the recipe's training length
    texts = load_corpus(args.corpus, max_documents=args.texts, seed=0)
    neurons, heads = importance(student, texts)
    prune_feed_forward(student, neurons, args.intermediate)
    if args.heads is not None:
        prune_heads(student, heads, args.heads)
    student.save(args.out, max_seq_length=limit)
    kept = sum(p.numel() for p in student.backbone.encoder.parameters())
    print(f"wrote {args.out}: layers {args.layers}, feed-forward {args.intermediate}, encoder parameters {kept:,}")


if __name__ == "__main__":
    main()
