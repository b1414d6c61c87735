#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass of Gemma 3 270M (GGUF).

Purpose: judge the numerical error of an inference engine against a reference
that has *no* activation rounding.  The weights are the GGUF's quantized
weights (Q4_K / Q5_0 / Q6_K / Q8_0 / F32), dequantized by llama.cpp's gguf-py
and then widened to float64; everything after that (activations, KV, softmax,
logits) is computed in float64.  The only error left relative to the
"true" quantized model is float64 round-off.

The forward pass follows llama.cpp src/models/gemma3.cpp:

    x = token_embd[tokens] * sqrt(n_embd)
    per layer il:
        h = rmsnorm(x) * attn_norm
        q = h Wq^T, k = h Wk^T, v = h Wv^T          (per-head, head_dim 256)
        q = rmsnorm_head(q) * attn_q_norm; k = rmsnorm_head(k) * attn_k_norm
        q, k = NEOX RoPE (pairs (i, i+128)), base 1e4 (local) / 1e6 (global)
        attn = softmax(q k^T / sqrt(256) + causal/sliding mask) v   (GQA 4:1)
        o = attn Wo^T; o = rmsnorm(o) * post_attention_norm; x = x + o
        h = rmsnorm(x) * ffn_norm
        f = gelu_tanh(h Wgate^T) * (h Wup^T); f = f Wdown^T
        f = rmsnorm(f) * post_ffw_norm; x = x + f
    logits = (rmsnorm(x) * output_norm) token_embd^T     (tied embeddings)

Layer il is local (sliding window 512, rope base 10000 = llama.cpp's default
rope_freq_base_train_swa, since the GGUF has no rope.freq_base_swa key) iff
il % 6 < 5; layers 5, 11, 17 are global (rope base gemma3.rope.freq_base).
The GGUF norm weights already contain Gemma's "+1".

For each case in greedy.json, the sequence prompt_token_ids +
generated_token_ids[:7] is run through the model in one pass, and the
log-softmax is taken at positions len(prompt)-1 .. len(prompt)+6, i.e. the
8 positions whose next-token distributions llama.cpp reported in
top10_logprobs_first8.

Usage (stdlib + numpy + gguf-py only):
    PYTHONPATH=<llama.cpp>/gguf-py python reference_f64.py [model.gguf] [greedy.json] > f64_logprobs.json
"""

import json
import math
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "..", ".models", "gemma-3-270m-q4_k_m.gguf")
DEFAULT_CASES = os.path.join(HERE, "greedy.json")

N_TOP = 20          # how many most-likely ids to list per position
N_POSITIONS = 8     # positions per case (matches top10_logprobs_first8)


def field_value(reader, key, default=None):
    """Scalar metadata value from the GGUF header (or default if absent)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load_weights(path):
    """Read the GGUF; return (hparams dict, {tensor name: float64 array}).

    GGUF dims are listed ne0-first: a matrix with shape [ne0=cols, ne1=rows]
    dequantizes to a numpy array of shape (rows, cols), i.e. exactly the
    PyTorch nn.Linear layout (out_features, in_features), so y = x @ W.T.
    The shape is checked against the header for every tensor.
    """
    r = gguf.GGUFReader(path)
    arch = field_value(r, "general.architecture")
    assert arch == "gemma3", arch
    hp = {
        "n_layer": int(field_value(r, "gemma3.block_count")),
        "n_embd": int(field_value(r, "gemma3.embedding_length")),
        "n_ff": int(field_value(r, "gemma3.feed_forward_length")),
        "n_head": int(field_value(r, "gemma3.attention.head_count")),
        "n_head_kv": int(field_value(r, "gemma3.attention.head_count_kv")),
        "head_dim": int(field_value(r, "gemma3.attention.key_length")),
        "head_dim_v": int(field_value(r, "gemma3.attention.value_length")),
        # stored as f32 in the file (9.99999997e-07); llama.cpp uses that f32
        "eps": float(field_value(r, "gemma3.attention.layer_norm_rms_epsilon")),
        "rope_base_global": float(field_value(r, "gemma3.rope.freq_base")),
        # llama.cpp default (llama-hparams.h) when the key is absent
        "rope_base_local": float(field_value(r, "gemma3.rope.freq_base_swa", 10000.0)),
        "n_swa": int(field_value(r, "gemma3.attention.sliding_window")),
        # gemma3.cpp: load_swa_pattern(ml, 6) -> layer il is SWA iff il % 6 < 5
        "swa_pattern": int(field_value(r, "gemma3.attention.sliding_window_pattern", 6)),
        "softcap": float(field_value(r, "gemma3.final_logit_softcapping", 0.0)),
    }
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        expected = tuple(int(d) for d in reversed(list(t.shape)))  # (ne1, ne0)
        assert a.shape == expected, (t.name, a.shape, expected)
        W[t.name] = np.asarray(a, dtype=np.float64)
        del a
    return hp, W


def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) over the last axis, times weight w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    """GELU, tanh approximation (what ggml_gelu computes, here in f64)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_neox(x, pos, base):
    """NEOX-style RoPE on x of shape (n_tok, n_heads, d).

    Dimension i (0 <= i < d/2) is paired with i + d/2 and rotated by the angle
    theta_i = pos * base^(-2i/d)  (freq_scale 1, no YaRN for this model).
    """
    d = x.shape[-1]
    half = d // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / d)    # (half,)
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]            # (n_tok, half)
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    x0 = x[..., :half]
    x1 = x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def forward(hp, W, tokens, out_positions):
    """Run all tokens at once (positions 0..n-1); return f64 logits at out_positions."""
    n = len(tokens)
    E, H, HKV, D = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    eps = hp["eps"]
    pos = np.arange(n)
    tok_embd = W["token_embd.weight"]                                     # (vocab, n_embd)

    x = tok_embd[np.asarray(tokens)] * math.sqrt(E)                       # (n, E)

    # masks: causal for all layers; local layers additionally need
    # pos_q - pos_k < n_swa  (llama.cpp LLAMA_SWA_TYPE_STANDARD)
    diff = pos[:, None] - pos[None, :]                                    # pos_q - pos_k
    mask_global = diff >= 0
    mask_local = mask_global & (diff < hp["n_swa"])

    for il in range(hp["n_layer"]):
        p = f"blk.{il}."
        is_local = (il % hp["swa_pattern"]) < (hp["swa_pattern"] - 1)
        base = hp["rope_base_local"] if is_local else hp["rope_base_global"]
        mask = mask_local if is_local else mask_global

        # ---- self-attention ----
        h = rmsnorm(x, W[p + "attn_norm.weight"], eps)
        q = (h @ W[p + "attn_q.weight"].T).reshape(n, H, D)
        k = (h @ W[p + "attn_k.weight"].T).reshape(n, HKV, D)
        v = (h @ W[p + "attn_v.weight"].T).reshape(n, HKV, hp["head_dim_v"])
        # per-head RMSNorm over head_dim
        q = rmsnorm(q, W[p + "attn_q_norm.weight"], eps)
        k = rmsnorm(k, W[p + "attn_k_norm.weight"], eps)
        q = rope_neox(q, pos, base)
        k = rope_neox(k, pos, base)
        scale = 1.0 / math.sqrt(D)      # f_attention_scale for non-27B models
        group = H // HKV                # GQA: query head hq uses kv head hq // group
        out = np.empty((n, H, hp["head_dim_v"]), dtype=np.float64)
        for hq in range(H):
            hk = hq // group
            s = (q[:, hq, :] @ k[:, hk, :].T) * scale                     # (n_q, n_k)
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            out[:, hq, :] = pr @ v[:, hk, :]
        o = out.reshape(n, H * hp["head_dim_v"]) @ W[p + "attn_output.weight"].T
        o = rmsnorm(o, W[p + "post_attention_norm.weight"], eps)
        x = x + o

        # ---- feed-forward (GELU-tanh gated, parallel) ----
        h = rmsnorm(x, W[p + "ffn_norm.weight"], eps)
        g = gelu_tanh(h @ W[p + "ffn_gate.weight"].T)
        u = h @ W[p + "ffn_up.weight"].T
        f = (g * u) @ W[p + "ffn_down.weight"].T
        f = rmsnorm(f, W[p + "post_ffw_norm.weight"], eps)
        x = x + f

    xo = rmsnorm(x[np.asarray(out_positions)], W["output_norm.weight"], eps)
    out_w = W.get("output.weight", tok_embd)                              # tied
    logits = xo @ out_w.T                                                 # (n_out, vocab)
    if hp["softcap"]:
        logits = hp["softcap"] * np.tanh(logits / hp["softcap"])
    return logits


def log_softmax(z):
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def main():
    model_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    cases_path = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_CASES
    hp, W = load_weights(model_path)
    golden = json.load(open(cases_path))

    cases_out = []
    for case in golden["cases"]:
        prompt = list(case["prompt_token_ids"])
        gen = list(case["generated_token_ids"])
        tokens = prompt + gen[: N_POSITIONS - 1]
        out_pos = list(range(len(prompt) - 1, len(prompt) - 1 + N_POSITIONS))
        lp = log_softmax(forward(hp, W, tokens, out_pos))                 # (8, vocab)

        positions = []
        for j in range(N_POSITIONS):
            row = lp[j]
            top = np.argsort(-row, kind="stable")[:N_TOP]
            listed = case["top10_logprobs_first8"][j]["top_logprobs"]
            positions.append({
                "top_logprobs": [{"id": int(i), "logprob": float(row[i])} for i in top],
                "llama_cpp_listed": [{"id": int(e["id"]), "logprob": float(row[int(e["id"])])}
                                     for e in listed],
            })
        cases_out.append({"user_message": case.get("user_message"), "positions": positions})
        print(f"case done: {case.get('user_message')!r}", file=sys.stderr)

    result = {
        "model_file": os.path.basename(model_path),
        "notes": (
            "Made by reference_f64.py: independent NumPy forward pass of Gemma 3 270M "
            "following llama.cpp src/models/gemma3.cpp. Weights dequantized with gguf-py "
            "(gguf.quants.dequantize) from the GGUF's quantized tensors, then all arithmetic "
            "in float64 (no activation/KV/GELU rounding). NEOX RoPE, base 10000 for local "
            "layers (il % 6 < 5, sliding window 512) and 1e6 for global layers 5/11/17; "
            "per-head q/k RMSNorm; scale 1/sqrt(256); tied output = token_embd. For each case "
            "the sequence prompt_token_ids + generated_token_ids[:7] is evaluated in one pass "
            "and the natural-log softmax is taken at positions len(prompt)-1 .. len(prompt)+6. "
            "top_logprobs: the 20 most likely ids by the f64 numbers; llama_cpp_listed: the f64 "
            "log-prob of each of the 10 ids llama.cpp listed in greedy.json at that position."
        ),
        "hparams": hp,
        "cases": cases_out,
    }
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
