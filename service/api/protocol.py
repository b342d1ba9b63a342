"""Request and response schemas: OpenAI embeddings, TEI ``/embed`` and ``/similarity``, model listings.

Request models ignore unknown fields (clients send extras such as ``user``). Limits that need the
server's settings (input count, characters, tokens) are checked in `service.engine.engine` so the
error messages can name the offending index and the configured limit.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

# What the server accepts, declared in the OpenAPI schema so generated clients and validators agree with it: no empty
# text, no empty list. Enforced by `service.engine.engine.Engine.check_texts`, not by pydantic, so the 422
# names the offending index ("input[3] is an empty string") instead of listing every branch of the union.
_TEXT_SCHEMA = {"type": "string", "minLength": 1}
Text = Annotated[str, WithJsonSchema(_TEXT_SCHEMA)]
Texts = Annotated[list[str], WithJsonSchema({"type": "array", "items": _TEXT_SCHEMA, "minItems": 1})]
PromptName = Annotated[
    str | None,
    Field(
        description="One of the model's prompts (`/v1/models` lists them): its text goes before every input, as "
        "sentence-transformers' `prompt_name`. None: the model's default prompt, if it has one."
    ),
]


TruncationDirection = Annotated[
    Literal["Right", "Left", "right", "left"],
    Field(
        description="With truncate: which end of an over-long text is cut — Right its end, Left its start (the "
        "special tokens stay), as TEI's truncation_direction."
    ),
]


class _Request(BaseModel):
    # strict: a field is what the schema says (``truncate: 0`` or ``dimensions: "8"`` is a 422, as validators and
    # generated clients expect); unknown fields are ignored (clients send extras such as ``user``)
    model_config = ConfigDict(extra="ignore", strict=True)


class OpenAIEmbeddingRequest(_Request):
    """``POST /v1/embeddings`` (OpenAI). Token-id inputs are not accepted: send text."""

    input: Text | Texts = Field(description="One text or a list of texts.")
    model: str | None = Field(default=None, description="Served model name; the server's default when omitted.")
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64 = the raw little-endian float32 bytes of each vector, base64-encoded."
    )
    dimensions: int | None = Field(
        default=None, ge=1, description="Keep the first N dimensions and re-normalise (Matryoshka-style)."
    )
    user: str | None = Field(default=None, description="Accepted for compatibility; ignored.")
    prompt_name: PromptName = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class TEIEmbedRequest(_Request):
    """``POST /embed`` (text-embeddings-inference)."""

    inputs: Text | Texts = Field(description="One text or a list of texts.")
    normalize: bool = Field(
        default=True,
        description="L2-normalise the vectors. Bundles exported with normalisation in the graph always return "
        "unit vectors; false then changes nothing.",
    )
    truncate: bool = Field(
        default=False, description="Cut texts longer than the model's max_seq_length; false answers 422 instead."
    )
    truncation_direction: TruncationDirection = "Right"
    dimensions: int | None = Field(default=None, ge=1, description="Keep the first N dimensions (Matryoshka).")
    prompt_name: PromptName = None
    model: str | None = Field(default=None, description="Served model name; the server's default when omitted.")


class SimilarityInputs(_Request):
    source_sentence: Text
    sentences: Texts


class TEISimilarityRequest(_Request):
    """``POST /similarity`` (Hugging Face sentence-similarity / TEI): cosine of each sentence with the source."""

    inputs: SimilarityInputs
    truncate: bool = Field(default=True, description="Cut over-long texts (false answers 422 instead).")
    truncation_direction: TruncationDirection = "Right"
    prompt_name: PromptName = None
    model: str | None = None


class TEITokenizeRequest(_Request):
    """``POST /tokenize`` (text-embeddings-inference): every token of each text, none cut."""

    inputs: Text | Texts = Field(description="One text or a list of texts.")
    add_special_tokens: bool = Field(default=True, description="Include the model's special tokens ([CLS], [SEP]).")
    prompt_name: PromptName = None
    model: str | None = Field(default=None, description="Served model name; the server's default when omitted.")


class SimpleToken(BaseModel):
    """One token: its id, its piece of the text (a special token's own string), its character span in the text
    with its prompt (null for a special token)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models`` (OpenAI fields plus what a client needs to size requests)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "embedder"
    version: str
    dim: int
    max_seq_length: int
    pooling: str | None = Field(
        default=None,
        description="How the model makes one vector of a text's token vectors (sentence-transformers' pooling): "
        "mean, cls, last, max or mean_sqrt_len; null for a bundle whose manifest does not record it.",
    )
    normalized: bool = Field(
        description="Whether the vectors have unit length (L2-normalised), so that a dot product is their cosine."
    )
    quantization: str = Field(description="The precision the served engine computes in: int8, bf16, or none (fp32).")
    engine: str | None = Field(
        default=None,
        description="The engine serving the model (onnxruntime-int8, openvino-bf16, openvino-int8, openvino-f32, "
        "onnxruntime-fp32): "
        "the fastest that kept the parity bars on this CPU at load, or the one EMBED_ENGINE pins.",
    )
    engine_choice: dict[str, Any] | None = Field(
        default=None,
        description="Why that engine: the setting, the reason, every candidate's trial (status passed / failed / "
        "unavailable / disabled / no-int8 / no-references / not-tried, probe cosines to fp32, best seconds per "
        "timing batch), the CPU and how long the choice took.",
    )
    int8_check: dict[str, Any] | None = Field(
        default=None,
        description="The int8 graph's trial on this CPU (status, reason, probe cosines to fp32) and the CPU.",
    )
    prompts: dict[str, str] = Field(
        default_factory=dict, description="The model's prompts by name (`prompt_name`), from sentence-transformers."
    )
    default_prompt_name: str | None = Field(
        default=None, description="The prompt put before every text a request sends without `prompt_name`."
    )
    base_model: str | None = None
    method: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Limits(BaseModel):
    max_client_batch_size: int
    max_input_chars: int
    max_body_bytes: int
    max_batch_tokens: int
    max_batch_size: int
    max_queue_size: int
    max_queue_wait_seconds: float
    queue_wait_min_requests: int
    overload_hold_seconds: float
    max_concurrent_requests: int


class Info(BaseModel):
    """``GET /info`` (TEI-like): the service version, the default model, every served model and the limits."""

    version: str
    default_model: str
    models: list[ModelCard]
    limits: Limits
    auth: bool


class ErrorDetail(BaseModel):
    """OpenAI's error object (``details`` beside it when a failure has structured facts, such as /adapt's)."""

    message: str
    type: str
    param: str | None = Field(default=None, description="the request field at fault (a validation error), or null")
    code: str
    details: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
