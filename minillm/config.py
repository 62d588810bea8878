"""Model shapes: one frozen dataclass, named presets, and Hugging Face configs.

A ModelConfig says everything the engine and the accounting need to know about
a Llama-family decoder: sizes, attention layout (GQA), RoPE, optional q/k-norm
(Qwen3), biases (Qwen2) and the special tokens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .validation import check_instance, check_int, check_int_sequence, check_real

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None          # None: hidden_size // num_heads
    max_position: int = 4096             # longest sequence the model accepts
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    rms_norm_eps: float = 1e-5
    qk_norm: bool = False                # Qwen3: RMSNorm on each head's q and k
    attention_bias: bool = False         # Qwen2: biases on q, k and v
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    architecture: str = "llama"

    def __post_init__(self):
        for arg in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                    "num_heads", "num_kv_heads", "max_position"):
            object.__setattr__(self, arg, check_int(arg, getattr(self, arg), 1))
        if self.head_dim is not None:
            object.__setattr__(self, "head_dim", check_int("head_dim", self.head_dim, 2))
        for arg in ("rope_theta", "rms_norm_eps"):
            object.__setattr__(self, arg, check_real(arg, getattr(self, arg), 0, exclusive_minimum=True))
        check_rope_scaling(self.rope_scaling)
        for arg in ("bos_token_id", "eos_token_id"):
            value = getattr(self, arg)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, arg, check_int_sequence(arg, value, 0))
            else:
                object.__setattr__(self, arg, check_int(arg, value, 0, allow_none=True))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                                 f"num_heads={self.num_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if not isinstance(self.head_dim, int) or self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim!r}: must be a positive even integer "
                             "(RoPE rotates pairs of dimensions)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads}: must divide "
                             f"num_heads={self.num_heads} (grouped-query attention)")

    # ---- derived sizes -------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    @property
    def attention_break_even_len(self) -> int:
        """The cached length at which a new token's attention FLOPs equal its
        matmul FLOPs, per layer: the matmuls do 2 FLOPs per weight, attention
        4 per query head dimension and key (Q.K and P.V). Past it, attention
        is most of a token's work (chunk_sizing weighs chunks with it)."""
        return round(2 * self.matmul_weights_per_layer / (4 * self.q_size))

    @property
    def matmul_weights_per_layer(self) -> int:
        """The weights one token multiplies in a layer: q, k, v, o and the three MLP matrices."""
        d = self.hidden_size
        return d * self.q_size + 2 * d * self.kv_size + self.q_size * d + 3 * d * self.intermediate_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V, every layer, every KV head: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_parameters(self) -> int:
        d, h = self.hidden_size, self.head_dim
        per_layer = self.matmul_weights_per_layer + 2 * d                   # + the two norms
        if self.attention_bias:
            per_layer += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            per_layer += 2 * h
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * per_layer + embed + head + d

    def replace(self, **changes) -> "ModelConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- constructors --------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"preset={name!r}: unknown; choose one of {sorted(PRESETS)}")
        return PRESETS[name]

    @classmethod
    def from_hf_config(cls, hf: dict) -> "ModelConfig":
        """Read a Hugging Face config.json (as a dict) of a Llama-family model."""
        if not isinstance(hf, dict):
            raise TypeError(f"hf config must be a dict, got {type(hf).__name__}")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        missing = [key for key in required if hf.get(key) is None]
        if missing:
            raise ValueError(f"hf config lacks {missing}: not a decoder config.json "
                             f"(need {list(required)})")
        # Under Hugging Face's names, so that an error names the key in config.json.
        for key in required:
            check_int(key, hf[key], 1)
        for key in ("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window"):
            check_int(key, hf.get(key), 1, allow_none=True)
        for key in ("rope_theta", "rms_norm_eps"):
            check_real(key, hf.get(key), 0, exclusive_minimum=True, allow_none=True)
        eos = hf.get("eos_token_id")
        if eos is not None and not isinstance(eos, list):
            check_int("eos_token_id", eos, 0)
        if hf.get("rope_scaling") is not None:
            check_instance("rope_scaling", hf["rope_scaling"], dict, "a dict or null")
        archs = hf.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            model_type = hf.get("model_type")
            if model_type in SUPPORTED_ARCHITECTURES.values():
                arch = model_type
            else:
                raise ValueError(
                    f"architectures={archs!r} (model_type={model_type!r}): unsupported; "
                    f"minillm loads {sorted(SUPPORTED_ARCHITECTURES)}")
        # transformers >= 5 writes rope_theta and the scaling recipe into one
        # "rope_parameters" dict; older config.json files keep them top level.
        rope_parameters = hf.get("rope_parameters") or {}
        rope_theta = rope_parameters.get("rope_theta", hf.get("rope_theta")) or 10000.0
        rope_scaling = hf.get("rope_scaling")
        if rope_scaling is None and rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
        check_rope_scaling(rope_scaling)
        # Mistral-style sliding windows only matter past the window: we cap the
        # length there so every sequence the engine accepts is attended exactly.
        max_position = hf.get("max_position_embeddings", 4096)
        window = hf.get("sliding_window")
        if window and (arch == "mistral" or hf.get("use_sliding_window")):
            max_position = min(max_position, window)
        num_heads = hf["num_attention_heads"]
        return cls(
            name=hf.get("_name_or_path") or arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            max_position=max_position,
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qk_norm=arch == "qwen3",
            # Qwen2 always has q/k/v biases; its config may say attention_bias=None.
            attention_bias=bool(hf.get("attention_bias") or arch == "qwen2"),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=tuple(hf["eos_token_id"]) if isinstance(hf.get("eos_token_id"), list)
            else hf.get("eos_token_id"),
            architecture=arch,
        )


# The keys each RoPE scaling recipe needs (the model reads them at its first forward).
ROPE_SCALING_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def check_rope_scaling(rope_scaling) -> None:
    """A supported recipe with every number it needs, checked now rather than
    as a KeyError in the first forward pass."""
    if rope_scaling is None:
        return
    check_instance("rope_scaling", rope_scaling, dict, "a dict or None")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"rope_scaling={rope_scaling!r}: only 'llama3' and 'linear' "
                         "RoPE scaling are supported")
    for key in ROPE_SCALING_KEYS[kind]:
        if key not in rope_scaling:
            raise ValueError(f"rope_scaling={rope_scaling!r}: the {kind!r} recipe needs {key!r}")
        check_real(f"rope_scaling[{key!r}]", rope_scaling[key], 0, exclusive_minimum=True)


# The built-in model: big enough that a 2048-token prefill visibly stalls a
# CPU for about a second, small enough that every chapter runs in seconds.
# Four query heads share each KV head, as in Llama-3-8B (32 and 8).
# Vocabulary: 256 bytes + BOS + EOS (see tokenizer.py), rounded up to 512.
TINY = ModelConfig(
    name="tiny", vocab_size=512, hidden_size=512, intermediate_size=1536,
    num_layers=4, num_heads=8, num_kv_heads=2, max_position=4096,
    bos_token_id=256, eos_token_id=257,
)

# Shapes of real models (from their published config.json files), for the
# accounting and the simulator. Their weights are never needed.
PRESETS: dict[str, ModelConfig] = {
    "tiny": TINY,
    "llama-3-8b": ModelConfig(
        name="llama-3-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position=8192,
        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001),
    "llama-2-7b": ModelConfig(
        name="llama-2-7b", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
        num_layers=32, num_heads=32, num_kv_heads=32, max_position=4096,
        bos_token_id=1, eos_token_id=2),
    "mistral-7b": ModelConfig(
        name="mistral-7b", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, max_position=4096,
        bos_token_id=1, eos_token_id=2, architecture="mistral"),
    "qwen3-0.6b": ModelConfig(
        name="qwen3-0.6b", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, max_position=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, qk_norm=True, tie_word_embeddings=True,
        eos_token_id=151645, architecture="qwen3"),
}
