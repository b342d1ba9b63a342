"""The encoder: any Hugging Face backbone + pooling + optional L2 normalisation.

`Encoder.forward(input_ids, attention_mask, token_type_ids=None)` returns pooled (and normalised)
embeddings, so the module itself is what export traces to ONNX. Truncation keeps the embedding
layer and the first *l* transformer layers (TMFT, paper 003 §3), giving a real smaller model;
`freeze(k)` trains only the last *k* layers (cropping paper 000 §4, Fig. 4a: the last 2 of 12 come close to the
full fine-tune).

An optional output layer (`OutputLayer`, sentence-transformers' ``Dense``) maps the pooled vector to another
width before normalisation — a 128-wide student's map into its teacher's 384-d space — and is part of
the model: saved, reloaded, exported.

Checkpoints are saved as a Hugging Face folder plus sentence-transformers' module files
(`modules.json`, `1_Pooling/`, `2_Dense/` when there is an output layer, `N_Normalize/`,
`sentence_bert_config.json`), so ``SentenceTransformer(path)`` loads them too.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers import logging as hf_logging

from core.catalog import resolve_model
from core.model_folder import (
    DENSE_ACTIVATIONS,
    DENSE_WEIGHTS,
    DenseLayer,
    Prompts,
    read_sentence_transformers_config,
    set_tokenizer_limit,
    transformer_folder,
    write_sentence_transformers_config,
)
from training.hf_folder import (
    backbone_class,
    custom_code_error,
    default_max_length,
    load_config,
    lowercase_inputs,
    st_lower_case,
    usable_positions,
)
from training.pooling import check_pooling, pool

log = logging.getLogger(__name__)

# Where architectures keep their stack of transformer layers (T5's encoder: ``encoder.block``).
_LAYER_PATHS = ("encoder.layer", "encoder.layers", "encoder.block", "transformer.layer", "layers", "h", "layer")
def find_layers(backbone: nn.Module) -> tuple[nn.Module, str]:
    """Return (owner, attribute) of the backbone's ``nn.ModuleList`` of transformer layers."""
    for path in _LAYER_PATHS:
        owner: Any = backbone
        parts = path.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
        if owner is not None and isinstance(getattr(owner, parts[-1], None), nn.ModuleList):
            return owner, parts[-1]
    raise ValueError(f"cannot find the transformer layers of {type(backbone).__name__}: looked for {_LAYER_PATHS}")


class OutputLayer(nn.Module):
    """sentence-transformers' ``Dense`` after pooling: ``activation(linear(x))`` (identity or tanh)."""

    def __init__(self, spec: DenseLayer) -> None:
        super().__init__()
        self.spec = spec
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = nn.Identity() if spec.activation_function == DENSE_ACTIVATIONS[0] else nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))

    def save(self, folder: Path) -> None:
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, folder / DENSE_WEIGHTS)

    @classmethod
    def load(cls, folder: Path, spec: DenseLayer) -> OutputLayer:
        layer = cls(spec)
        weights, legacy = folder / spec.path / DENSE_WEIGHTS, folder / spec.path / "pytorch_model.bin"
        state = load_file(weights) if weights.exists() else torch.load(legacy, weights_only=True)
        layer.load_state_dict(state, strict=True)
        return layer


class Encoder(nn.Module):
    """A Hugging Face backbone with pooling, an optional output layer and optional L2 normalisation.

    Args:
        backbone: any ``AutoModel`` (BERT, MPNet, ELECTRA discriminator or generator, RoBERTa…).
        tokenizer: its fast tokenizer; padding is forced to the right (``last`` pooling needs it).
        pooling: ``mean`` (masked), ``cls`` or ``last`` (the final real token, [SEP] for BERT).
        normalize: L2-normalise the pooled vector.
        max_seq_length: longer inputs are truncated to this many tokens.
        output: an `OutputLayer` applied to the pooled vector before normalisation (None: none).
        prompts: sentence-transformers' named prompts, saved with the model and served from its bundle.
        lower_case: lower-case every text before tokenising it, as sentence-transformers does for a model whose
            ``sentence_bert_config.json`` says ``do_lower_case`` (`lowercase_inputs`: the tokenizer itself does it,
            so its saved ``tokenizer.json`` — the one a bundle serves — does it too).

    Example::

        enc = Encoder.from_pretrained("minilm-l6")
        vectors = enc.encode(["a sentence", "another"])  # (2, 384), unit norm
        enc.truncate(3)                                   # keep embeddings + first 3 layers
    """

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        pooling: str = "mean",
        normalize: bool = True,
        max_seq_length: int = 256,
        output: OutputLayer | None = None,
        prompts: Prompts | None = None,
        lower_case: bool = False,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        if output is not None and output.spec.in_features != int(backbone.config.hidden_size):
            raise ValueError(
                f"the output layer takes {output.spec.in_features} features but the backbone's hidden size is "
                f"{backbone.config.hidden_size}"
            )
        self.output = output
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        if tokenizer.pad_token is None:  # decoders (GPT-2, Llama) ship none; padding is masked out, any token serves
            filler = tokenizer.eos_token or tokenizer.unk_token or tokenizer.sep_token
            if filler is None:
                raise ValueError("the tokenizer has no pad, end-of-sequence, unknown or separator token to pad with")
            tokenizer.pad_token = filler
        if lower_case:
            lowercase_inputs(tokenizer)
        self.pooling = check_pooling(pooling)
        self.normalize = normalize
        if max_seq_length < 2:
            raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
        self.max_seq_length = max_seq_length
        self.source: str | None = None  # the folder this encoder was loaded from, if any
        # kept with the weights and put in the bundle, where the server applies them (`encode` does not)
        self.prompts = prompts or Prompts()
        self.uses_token_type_ids = (
            "token_type_ids" in tokenizer.model_input_names
            and (getattr(backbone.config, "type_vocab_size", 0) or 0) > 0
        )

    # --- construction and persistence ----------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        device: str | torch.device | None = None,
        cache_dir: Path | None = None,
    ) -> Encoder:
        """Load a built-in model name or any Hugging Face folder.

        Pooling, normalisation, max length and lower-casing default to the folder's sentence-transformers files; a
        plain Hugging Face folder gets mean pooling, L2 normalisation and its tokenizer's length limit (the position
        table's when the tokenizer states none), as sentence-transformers gives it. A max length past what the position
        table can take is cut to it, with a warning. T5's (and mT5's, UMT5's) encoder is loaded alone, as
        sentence-transformers does.

        Raises:
            ValueError: in one line, for a model that needs its own code (``auto_map``) or an encoder-decoder model
                other than T5's family.
        """
        folder = resolve_model(name_or_path, cache_dir)
        found = read_sentence_transformers_config(folder)
        weights = transformer_folder(folder)
        config = load_config(weights)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # an unused pooler head "newly initialised" is expected
        try:
            backbone = backbone_class(weights, config).from_pretrained(weights, config=config, trust_remote_code=False)
        except ValueError as err:
            raise custom_code_error(weights, err) from None
        finally:
            hf_logging.set_verbosity(verbosity)
        try:
            tokenizer = AutoTokenizer.from_pretrained(weights, use_fast=True, trust_remote_code=False)
        except ValueError as err:
            raise custom_code_error(weights, err) from None
        if max_seq_length is None:
            max_seq_length = found.get("max_seq_length") or default_max_length(tokenizer, backbone)
        limit = usable_positions(backbone)
        if limit is not None and max_seq_length > limit:
            log.warning(
                "%s: max_seq_length %d is more than the model's position table takes; inputs are cut at %d tokens",
                folder, max_seq_length, limit,
            )  # fmt: skip
            max_seq_length = limit
        encoder = cls(
            backbone,
            tokenizer,
            pooling=pooling or found.get("pooling", "mean"),
            normalize=found.get("normalize", True) if normalize is None else normalize,
            max_seq_length=max_seq_length,
            output=OutputLayer.load(folder, found["dense"]) if "dense" in found else None,
            prompts=found.get("prompts"),
            lower_case=st_lower_case(weights),
        )
        encoder.source = str(folder)
        return encoder.to(device or "cpu")

    def save(self, folder: str | os.PathLike[str], *, max_seq_length: int | None = None) -> Path:
        """Save as a Hugging Face folder that sentence-transformers can also load.

        ``max_seq_length`` overrides the input limit recorded in the folder (default: this encoder's own); the
        folder's ``tokenizer.json`` cuts there too and pads nothing (`core.model_folder.set_tokenizer_limit`).
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        max_seq_length = max_seq_length or self.max_seq_length
        self.backbone.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)
        # the tokenizer keeps the last call's truncation (a training batch's length) and padding: the saved file
        # says the model's own limit instead, for whatever reads tokenizer.json without sentence-transformers
        set_tokenizer_limit(folder, max_seq_length)
        write_sentence_transformers_config(
            folder,
            dim=self.hidden_size,
            pooling=self.pooling,
            normalize=self.normalize,
            max_seq_length=max_seq_length,
            dense=self.output.spec if self.output is not None else None,
            prompts=self.prompts,
        )
        if self.output is not None:
            self.output.save(folder / self.output.spec.path)
        return folder

    # --- shape of the model -------------------------------------------------------------------

    @property
    def config(self) -> Any:
        return self.backbone.config

    @property
    def hidden_size(self) -> int:
        """The backbone's width: what pooling (and `layer_embeddings`) returns."""
        return int(self.backbone.config.hidden_size)

    @property
    def dim(self) -> int:
        """The embedding's width: the output layer's, when there is one."""
        return self.output.spec.out_features if self.output is not None else self.hidden_size

    @property
    def num_layers(self) -> int:
        try:
            owner, attr = find_layers(self.backbone)
        except ValueError:  # layers that share weights (ALBERT runs one layer group N times): the config's count
            count = getattr(self.backbone.config, "num_hidden_layers", None)
            if count is None:
                raise
            return int(count)
        return len(getattr(owner, attr))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def truncate(self, layers: int) -> Encoder:
        """Keep the embedding layer and the first ``layers`` transformer layers, in place.

        The output then equals the pooled ``hidden_states[layers]`` of the full model (TMFT,
        paper 003 §3: pool at layer *l* and drop everything above it). The config is updated, so
        the saved model reloads with ``layers`` layers.
        """
        total = self.num_layers
        if not isinstance(layers, int) or not 1 <= layers <= total:
            raise ValueError(f"layers must be an integer between 1 and {total} (this model's depth), got {layers!r}")
        owner, attr = find_layers(self.backbone)
        setattr(owner, attr, nn.ModuleList(list(getattr(owner, attr))[:layers]))
        self.backbone.config.num_hidden_layers = layers
        return self

    def select_layers(self, keep: Sequence[int]) -> Encoder:
        """Keep only the listed transformer layers (in the given order), in place."""
        total = self.num_layers
        keep = list(keep)
        if not keep or any(not 0 <= i < total for i in keep) or len(set(keep)) != len(keep):
            raise ValueError(f"layers to keep must be distinct indices in [0, {total - 1}], got {keep}")
        owner, attr = find_layers(self.backbone)
        current = list(getattr(owner, attr))
        setattr(owner, attr, nn.ModuleList([current[i] for i in keep]))
        self.backbone.config.num_hidden_layers = len(keep)
        return self

    def freeze(self, trainable_last_layers: int | None) -> Encoder:
        """Train only the last ``trainable_last_layers`` transformer layers (None: train everything).

        Embeddings, lower layers and parameters shared across layers stay frozen; with ``0`` the
        whole backbone is frozen (useful when only a projector head trains).
        """
        if trainable_last_layers is None:
            for param in self.backbone.parameters():
                param.requires_grad_(True)
            return self
        total = self.num_layers
        if not isinstance(trainable_last_layers, int) or not 0 <= trainable_last_layers <= total:
            raise ValueError(
                f"trainable_last_layers must be between 0 and {total} (this model's depth), "
                f"got {trainable_last_layers!r}"
            )
        for param in self.backbone.parameters():
            param.requires_grad_(False)
        owner, attr = find_layers(self.backbone)
        for layer in list(getattr(owner, attr))[total - trainable_last_layers :]:
            for param in layer.parameters():
                param.requires_grad_(True)
        return self

    # --- computation --------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        features = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if self.uses_token_type_ids else [])
        return {name: features[name].to(self.device) for name in names}

    def _backbone_kwargs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self.uses_token_type_ids:
            kwargs["token_type_ids"] = token_type_ids
        return kwargs

    def _finish(self, pooled: torch.Tensor) -> torch.Tensor:
        return F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``(B, T)`` token ids and mask → ``(B, dim)`` pooled (and normalised) embeddings."""
        out = self.backbone(**self._backbone_kwargs(input_ids, attention_mask, token_type_ids))
        pooled = pool(out.last_hidden_state, attention_mask, self.pooling)
        return self._finish(self.output(pooled) if self.output is not None else pooled)

    def layer_embeddings(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled embeddings of every layer in one pass: ``(L + 1, B, hidden_size)``, index 0 = embeddings (the
        output layer, fitted to the last layer only, is not applied)."""
        out = self.backbone(
            **self._backbone_kwargs(input_ids, attention_mask, token_type_ids), output_hidden_states=True
        )
        return torch.stack([self._finish(pool(h, attention_mask, self.pooling)) for h in out.hidden_states])

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        show_progress_bar: bool = False,
        all_layers: bool = False,
    ) -> np.ndarray:
        """Embed texts in inference mode: ``(N, dim)`` float32, or ``(L + 1, N, dim)`` with ``all_layers``.

        Texts are sorted by length so batches carry little padding; results come back in input order.
        """
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list")
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks = []
        try:
            for start in tqdm(
                range(0, len(texts), batch_size), desc="encode", disable=not show_progress_bar, leave=False
            ):
                batch = [texts[i] for i in order[start : start + batch_size]]
                features = self.tokenize(batch)
                out = self.layer_embeddings(**features) if all_layers else self(**features)
                chunks.append(out.float().cpu())
        finally:
            self.train(was_training)
        if not chunks:
            shape = (self.num_layers + 1, 0, self.hidden_size) if all_layers else (0, self.dim)
            return np.zeros(shape, dtype=np.float32)
        stacked = torch.cat(chunks, dim=-2).numpy()
        result = np.empty_like(stacked)
        result[..., order, :] = stacked
        return result

    def clone(self) -> Encoder:
        """An independent deep copy (e.g. a frozen reference encoder)."""
        return copy.deepcopy(self)
