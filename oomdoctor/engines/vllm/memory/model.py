"""The model as the memory model sees it: ``ModelInfo`` (normalised across architectures) and its parts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from oomdoctor.engines.vllm.defaults import DEFAULT_ENGINE_VERSION, DEFAULTS_BY_VERSION, defaults_for
from oomdoctor.engines.vllm.memory.quantization import Quantization

DENSE_ARCHS = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM",
    "GraniteForCausalLM",
}
MOE_ARCHS = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
MLA_ARCHS = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}
HYBRID_ARCHS = {"NemotronHForCausalLM", "JambaForCausalLM"}
SUPPORTED_ARCHS = DENSE_ARCHS | MOE_ARCHS | MLA_ARCHS | HYBRID_ARCHS
#: vLLM's _PREVIOUSLY_SUPPORTED_MODELS (0.25.1 registry): architecture -> last version that had it.
REMOVED_ARCHS = {"BambaForCausalLM": "0.23.0", "MiniMaxForCausalLM": "0.23.0"}
#: vLLM 0.25.1 DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (MoE models that still get the V2 runner).
V2_RUNNER_MOE_ARCHS = DEFAULTS_BY_VERSION["0.25.1"].v2_runner_moe_archs or frozenset()


class MoEDims(TypedDict):
    num_experts: int
    top_k: int
    moe_intermediate: int
    shared_intermediate: int
    gated: bool                     # 3 matrices per expert (gate, up, down); False: 2 (NemotronH)


class MLADims(TypedDict):
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int                # 0: no q compression


@dataclass(frozen=True)
class MambaDims:
    kind: str                       # "mamba1" | "mamba2"
    d_inner: int                    # mamba heads x head dim (mamba2) or expand x hidden (mamba1)
    state_size: int
    conv_kernel: int
    n_groups: int = 1               # mamba2
    num_heads: int = 0              # mamba2
    head_dim: int = 0               # mamba2
    dt_rank: int = 0                # mamba1
    chunk_size: int = 128
    ssm_dtype_bytes: int = 2        # NemotronH: float32 in vLLM 0.25.1 (NemotronHForCausalLMConfig)
    conv_dtype_bytes: int = 2


@dataclass(frozen=True)
class ModelInfo:
    """What the memory model needs from a config.json, normalised across architectures."""
    path: str
    architecture: str
    model_type: str
    dtype: str
    dtype_bytes: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    layer_kinds: tuple[str, ...]            # per layer: "full" | "sliding" | "mla" | "mamba" | "none"
    sliding_windows: tuple[int, ...]        # per layer: window or 0
    mlp_kinds: tuple[str, ...]              # per layer: "gated" | "plain" | "moe" | "none"
    intermediate_size: int
    derived_max_model_len: int
    max_len_key: str
    rope_caches: tuple[tuple[int, int], ...]   # ((rows, rotary_dim), ...), one per distinct RoPE
    attention_bias: bool = False
    qk_norm: bool = False
    moe: MoEDims | None = None
    mla: MLADims | None = None
    mamba: MambaDims | None = None
    quantization: Quantization | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_hybrid(self) -> bool:
        return "mamba" in self.layer_kinds and any(k in ("full", "sliding", "mla") for k in self.layer_kinds)

    @property
    def is_moe(self) -> bool:
        return "moe" in self.mlp_kinds

    @property
    def moe_dims(self) -> MoEDims:
        if self.moe is None:
            raise ValueError(f"{self.architecture} has no MoE layers")
        return self.moe

    @property
    def mla_dims(self) -> MLADims:
        if self.mla is None:
            raise ValueError(f"{self.architecture} has no MLA layers")
        return self.mla

    @property
    def mamba_dims(self) -> MambaDims:
        if self.mamba is None:
            raise ValueError(f"{self.architecture} has no Mamba layers")
        return self.mamba

    def uses_v2_runner(self, engine_version: str = DEFAULT_ENGINE_VERSION) -> bool:
        """Plain decoders that are not hybrid get the V2 model runner; 0.25.1 also leaves MoE models on V1
        except a few (``VersionDefaults.v2_runner_moe_archs``)."""
        moe_archs = defaults_for(engine_version).v2_runner_moe_archs
        if moe_archs is None:
            return not self.is_hybrid
        return not self.is_hybrid and (not self.is_moe or self.architecture in moe_archs)
