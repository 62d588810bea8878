"""FLOPs and bytes of one engine step, per operation: the numbers a roofline needs.

A step is a list of requests, each `(num_new_tokens, num_cached_tokens)` or
`(num_new_tokens, num_cached_tokens, samples)`: a prefill chunk has many new
tokens, a decode has one. For every decoder layer we count

    qkv_proj     one GEMM [T, d] x [d, q + 2 kv]          (T = new tokens in the step)
    attn_scores  Q K^T over each request's causal pairs   (reads the cached K)
    attn_values  P V over the same pairs                  (reads the cached V)
    o_proj       one GEMM [T, q] x [q, d]
    mlp          gate_up GEMM, SiLU * up, down GEMM
    lm_head      [S, d] x [d, vocab] once per step, S = requests that sample

FLOPs: a matmul [M, K] x [K, N] costs 2*M*N*K (one multiply and one add per
term). A chunk of n new tokens over c cached ones has n*c + n(n+1)/2 causal
(query, key) pairs, so summed over the chunks of one prompt the pairs are
L(L+1)/2 whatever the chunk size: chunking never changes the FLOPs.

Bytes (the traffic to and from GPU memory, the quantity a memory-bound kernel
waits on): every weight is read once per step, each request's cached K and V
are read once per step (flash-style kernels stream them without storing the
score matrix), the new tokens' K and V are written once, and each operation
reads its input activations and writes its output. Norms, RoPE, residual adds
and the embedding gather are left out: they are a few bytes per token next to
the GEMMs (chapter 7 measures them in the GPU profiles).

All counts are Python ints, so equalities such as "same FLOPs for every chunk
size" hold exactly, not to a tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..chunk_sizing import causal_pairs        # the core's count, shared with the scheduler
from ..config import ModelConfig
from ..validation import check_bool, check_choice, check_int, is_int

__all__ = [
    "OPS", "DTYPE_BYTES", "dtype_bytes_on", "StepCost", "step_cost", "prefill_flops", "prefill_cost",
    "causal_pairs", "kv_write_bytes", "activation_peak_bytes", "normalize_step",
]

OPS = ("qkv_proj", "attn_scores", "attn_values", "o_proj", "mlp", "lm_head")
DTYPE_BYTES = (1, 2, 4, 8)          # fp8/int8, bf16/fp16, fp32, fp64


@dataclass(frozen=True)
class StepCost:
    """Work and memory traffic of one step (or a sum of steps: use `+`)."""
    flops: int
    bytes_weights: int
    bytes_kv_read: int
    bytes_kv_write: int
    bytes_activations: int
    by_op: dict = field(default_factory=dict, hash=False)  # op -> (flops, bytes), summed over layers
    bytes_total: int = field(init=False)
    intensity: float = field(init=False)                    # FLOPs per byte of memory traffic

    def __post_init__(self):
        total = self.bytes_weights + self.bytes_kv_read + self.bytes_kv_write + self.bytes_activations
        object.__setattr__(self, "bytes_total", total)
        object.__setattr__(self, "intensity", self.flops / total if total else 0.0)

    def __add__(self, other: "StepCost") -> "StepCost":
        if not isinstance(other, StepCost):
            return NotImplemented
        by_op = {op: (self.by_op.get(op, (0, 0))[0] + other.by_op.get(op, (0, 0))[0],
                      self.by_op.get(op, (0, 0))[1] + other.by_op.get(op, (0, 0))[1])
                 for op in OPS}
        return StepCost(self.flops + other.flops, self.bytes_weights + other.bytes_weights,
                        self.bytes_kv_read + other.bytes_kv_read,
                        self.bytes_kv_write + other.bytes_kv_write,
                        self.bytes_activations + other.bytes_activations, by_op)

    @property
    def linear_flops(self) -> int:
        """FLOPs of the weight GEMMs only (what FlopCounterMode sees as mm/addmm)."""
        return sum(self.by_op[op][0] for op in ("qkv_proj", "o_proj", "mlp", "lm_head"))


# ---- argument checks (errors name the argument, its value, what is allowed) ----

def _check_cfg(cfg) -> ModelConfig:
    if isinstance(cfg, str):
        return ModelConfig.preset(cfg)        # raises ValueError naming the preset
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg={cfg!r}: must be a ModelConfig or a preset name "
                        f"such as 'llama-3-8b'")
    return cfg


def check_dtype_bytes(dtype_bytes) -> int:
    hint = "1 fp8, 2 bf16/fp16, 4 fp32, 8 fp64"
    return check_choice("dtype_bytes", check_int("dtype_bytes", dtype_bytes, hint=hint), DTYPE_BYTES, hint=hint)


_check_dtype_bytes = check_dtype_bytes     # the name cost_model imports


def dtype_bytes_on(hardware, dtype_bytes=None) -> int:
    """The element width to count: dtype_bytes if given, else the hardware profile's
    own dtype (2 for the GPUs' bfloat16, 4 for a CPU calibrated in float32)."""
    return check_dtype_bytes(hardware.dtype_bytes if dtype_bytes is None else dtype_bytes)


def _check_int(name: str, value, minimum: int) -> int:
    return check_int(name, value, minimum, hint=f"a number of tokens >= {minimum}")


def normalize_step(requests) -> list[tuple[int, int, bool]]:
    """Check a step's shape and return [(num_new_tokens, num_cached_tokens, samples)]."""
    # Fast path (the simulator calls this every step with shapes it built itself):
    # a list of (int >= 1, int >= 0, bool) triples is already normal.
    if type(requests) is list and all(
            type(r) is tuple and len(r) == 3 and type(r[0]) is int and r[0] >= 1
            and type(r[1]) is int and r[1] >= 0 and type(r[2]) is bool for r in requests):
        return list(requests)
    if isinstance(requests, tuple) and len(requests) in (2, 3) and all(
            is_int(x) for x in requests[:2]):
        raise TypeError(f"requests={requests!r}: pass a list of requests, "
                        f"e.g. [{requests!r}]")
    out = []
    for i, req in enumerate(requests):
        if not isinstance(req, (tuple, list)) or len(req) not in (2, 3):
            raise ValueError(f"requests[{i}]={req!r}: must be (num_new_tokens, num_cached_tokens) "
                             "or (num_new_tokens, num_cached_tokens, samples)")
        num_new = _check_int(f"requests[{i}] num_new_tokens", req[0], 1)
        num_cached = _check_int(f"requests[{i}] num_cached_tokens", req[1], 0)
        samples = check_bool(f"requests[{i}] samples", req[2]) if len(req) == 3 else True
        out.append((num_new, num_cached, samples))
    return out


def kv_write_bytes(cfg, num_tokens: int, dtype_bytes: int = 2) -> int:
    """Bytes of K and V written to the cache for num_tokens new tokens (all layers)."""
    cfg = _check_cfg(cfg)
    num_tokens = _check_int("num_tokens", num_tokens, 0)
    return num_tokens * cfg.kv_bytes_per_token(_check_dtype_bytes(dtype_bytes))


# ---- the step ------------------------------------------------------------------

def step_cost(cfg, requests, dtype_bytes: int = 2) -> StepCost:
    """FLOPs and bytes of one forward step over a packed batch of requests.

    requests: [(num_new_tokens, num_cached_tokens[, samples]), ...]; samples
    (default True) says whether the step computes this request's next-token
    logits: True for a decode and for the last chunk of a prompt, False for an
    intermediate chunk, which only fills the KV cache.
    """
    cfg = _check_cfg(cfg)
    b = _check_dtype_bytes(dtype_bytes)
    reqs = normalize_step(requests)
    layers = cfg.num_layers
    d, q, kv, hd, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.head_dim, cfg.intermediate_size

    num_tokens = sum(n for n, _, _ in reqs)                    # T: rows of every GEMM
    num_sampled = sum(1 for _, _, s in reqs if s)              # S: rows of the LM head
    pairs = sum(causal_pairs(n, c) for n, c, _ in reqs)
    num_cached = sum(c for _, c, _ in reqs)
    if num_tokens == 0:      # an empty step runs nothing: no weights read either
        return StepCost(0, 0, 0, 0, 0, {op: (0, 0) for op in OPS})

    def gemm(m: int, k: int, n: int) -> tuple[int, int, int]:
        """[m, k] x [k, n]: (flops, weight bytes, activation bytes in + out)."""
        return 2 * m * n * k, k * n * b, (m * k + m * n) * b

    # Per layer. QKV: the three projections are one fused GEMM in every engine.
    qkv_f, qkv_w, qkv_a = gemm(num_tokens, d, q + 2 * kv)
    if cfg.attention_bias:
        qkv_w += (q + 2 * kv) * b
    o_f, o_w, o_a = gemm(num_tokens, q, d)
    gu_f, gu_w, gu_a = gemm(num_tokens, d, 2 * inter)          # gate and up, fused
    dn_f, dn_w, dn_a = gemm(num_tokens, inter, d)
    act_a = num_tokens * 3 * inter * b                         # SiLU(gate)*up: read 2I, write I

    # Attention: every head does one dot product of length head_dim per pair
    # for the scores and one multiply-add per pair and dim for the values.
    scores_f = 2 * pairs * hd * cfg.num_heads
    values_f = 2 * pairs * hd * cfg.num_heads
    k_read = num_cached * kv * b                               # the cached prefix of K ...
    v_read = num_cached * kv * b                               # ... and of V, once per step
    k_write = num_tokens * kv * b                              # new K and V into the cache
    v_write = num_tokens * kv * b
    scores_a = num_tokens * q * b                              # read Q (K of new tokens is in k_write)
    values_a = num_tokens * q * b                              # write the attention output

    per_layer = {
        "qkv_proj": (qkv_f, qkv_w + qkv_a),
        "attn_scores": (scores_f, k_read + k_write + scores_a),
        "attn_values": (values_f, v_read + v_write + values_a),
        "o_proj": (o_f, o_w + o_a),
        "mlp": (gu_f + dn_f, gu_w + dn_w + gu_a + act_a + dn_a),
    }
    by_op = {op: (f * layers, m * layers) for op, (f, m) in per_layer.items()}
    # LM head: only the rows whose logits are sampled; not run at all if none.
    head_f, head_w, head_a = gemm(num_sampled, d, cfg.vocab_size)
    if num_sampled == 0:
        head_w = 0
    by_op["lm_head"] = (head_f, head_w + head_a)

    bytes_weights = layers * (qkv_w + o_w + gu_w + dn_w) + head_w
    bytes_kv_read = layers * (k_read + v_read)
    bytes_kv_write = layers * (k_write + v_write)
    bytes_activations = layers * (qkv_a + scores_a + values_a + o_a + gu_a + act_a + dn_a) + head_a
    flops = sum(f for f, _ in by_op.values())
    return StepCost(flops, bytes_weights, bytes_kv_read, bytes_kv_write, bytes_activations, by_op)


def _chunks(num_tokens: int, chunk_size: int | None) -> list[tuple[int, int, bool]]:
    """The steps of one prompt prefilled alone: only the last chunk samples."""
    num_tokens = _check_int("num_tokens", num_tokens, 1)
    if chunk_size is None:
        chunk_size = num_tokens
    chunk_size = _check_int("chunk_size", chunk_size, 1)
    steps, start = [], 0
    while start < num_tokens:
        n = min(chunk_size, num_tokens - start)
        steps.append((n, start, start + n == num_tokens))
        start += n
    return steps


def prefill_cost(cfg, num_tokens: int, chunk_size: int | None = None,
                 dtype_bytes: int = 2) -> StepCost:
    """Sum of the step costs of prefilling one prompt in chunks of chunk_size tokens.

    FLOPs do not depend on chunk_size; bytes_kv_read grows as chunks shrink
    (every chunk re-reads the prefix cached so far) and so do bytes_weights
    (every step reads all the weights again, unless other requests share it).
    """
    cfg = _check_cfg(cfg)
    total = None
    for step in _chunks(num_tokens, chunk_size):
        cost = step_cost(cfg, [step], dtype_bytes)
        total = cost if total is None else total + cost
    return total


def prefill_flops(cfg, num_tokens: int, chunk_size: int | None = None) -> int:
    """FLOPs of prefilling one prompt: the same integer for every chunk_size."""
    return prefill_cost(cfg, num_tokens, chunk_size).flops


def activation_peak_bytes(cfg, num_new_tokens: int, num_cached_tokens: int = 0,
                          dtype_bytes: int = 4, materialized_scores: bool = True,
                          logits_rows: int | None = None) -> int:
    """Largest set of activations alive at once in one step of one request (an estimate).

    Inside the MLP the hidden state [T, d], gate_up [T, 2I] and SiLU(gate)*up
    [T, I] coexist; in a reference attention that builds the score matrix,
    scores and probabilities [H, T, c+T] coexist with Q, K, V. The logits
    [rows, vocab] come on top at the end (rows=T if every position's logits are
    kept, 1 if only the last one). Everything scales with T, the new tokens,
    which is why chunking caps the peak: T <= chunk_size.
    """
    cfg = _check_cfg(cfg)
    b = _check_dtype_bytes(dtype_bytes)
    t = _check_int("num_new_tokens", num_new_tokens, 1)
    c = _check_int("num_cached_tokens", num_cached_tokens, 0)
    d, inter = cfg.hidden_size, cfg.intermediate_size
    residual = 2 * t * d * b                                   # residual stream + normed copy
    mlp_peak = t * (2 * inter + inter) * b
    qkv = t * (cfg.q_size + 2 * cfg.kv_size) * b
    scores = 2 * cfg.num_heads * t * (c + t) * b if materialized_scores else 0
    attn_peak = qkv + scores + t * cfg.q_size * b
    rows = t if logits_rows is None else logits_rows
    logits = rows * cfg.vocab_size * b
    return residual + max(mlp_peak, attn_peak, logits)
