#!/usr/bin/env python3
"""An independent f32 forward pass of the real-weight test GGUFs (llama, qwen2, gemma3), written in numpy from the
Hugging Face definitions and run on the GGUF's own weights dequantized by `gguf` (llama.cpp's Python
package): exact activations, f32 KV, no fusion. It is the oracle that separates kvgate's arithmetic from
llama.cpp's 8-bit activations and f16 KV cache: scripts/logprobs-fixture.py calls `reference(path)` and
stores its top-10 beside llama.cpp's. Needs `pip install gguf numpy`; kvgate's tests only read the fixture.
"""
import numpy as np
import gguf
from gguf.quants import dequantize


class Reference:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.t = {t.name: t for t in r.tensors}
        f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
        a = f["general.architecture"]
        self.arch = a
        self.hidden = int(f[f"{a}.embedding_length"])
        self.layers = int(f[f"{a}.block_count"])
        self.heads = int(f[f"{a}.attention.head_count"])
        self.kv_heads = int(f.get(f"{a}.attention.head_count_kv", self.heads))
        self.head_dim = int(f.get(f"{a}.attention.key_length", self.hidden // self.heads))
        self.eps = float(f[f"{a}.attention.layer_norm_rms_epsilon"])
        self.theta = float(f.get(f"{a}.rope.freq_base", 10000.0))
        self.window = int(f[f"{a}.attention.sliding_window"]) if a == "gemma3" else None
        self.cache = {}

    def w(self, name):
        if name not in self.cache:
            t = self.t[name]
            x = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.cache[name] = x.reshape([int(d) for d in reversed(t.shape)])
        return self.cache[name]

    def has(self, name):
        return name in self.t

    def rms(self, x, w):
        ms = (x.astype(np.float64) ** 2).mean(-1, keepdims=True)
        return (x / np.sqrt(ms + self.eps)).astype(np.float32) * w

    def rope(self, x, pos, base):
        """Hugging Face's rotate_half pairing (i, i + d/2); for llama, whose GGUF converter permutes Q and
        K rows so llama.cpp can rotate adjacent pairs, the pairing (2i, 2i + 1) on those rows."""
        d = self.head_dim
        if self.arch == "llama":
            inv = 1.0 / (base ** (np.arange(0, d // 2, dtype=np.float64) * 2 / d))
            ang = np.outer(pos, inv)
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x2 * c + x1 * s
            return out.astype(np.float32)
        inv = 1.0 / (base ** (np.arange(0, d // 2, dtype=np.float64) * 2 / d))
        ang = np.outer(pos, inv)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1).astype(np.float32)

    def linear(self, x, p):
        y = x @ self.w(p + ".weight").T
        return y + self.w(p + ".bias") if self.has(p + ".bias") else y

    def logprobs(self, ids):
        gemma = self.arch == "gemma3"
        n, hd = len(ids), self.head_dim
        pos = np.arange(n)
        emb = self.w("token_embd.weight")
        h = emb[ids].copy()
        if gemma:
            h *= np.float32(np.sqrt(self.hidden))
        group = self.heads // self.kv_heads
        for li in range(self.layers):
            p = f"blk.{li}."
            sliding = gemma and (li + 1) % 6 != 0
            x = self.rms(h, self.w(p + "attn_norm.weight"))
            q = self.linear(x, p + "attn_q").reshape(n, self.heads, hd)
            k = self.linear(x, p + "attn_k").reshape(n, self.kv_heads, hd)
            v = self.linear(x, p + "attn_v").reshape(n, self.kv_heads, hd)
            if gemma:  # the converter has already added Gemma's +1 to every norm weight
                q = self.rms(q, self.w(p + "attn_q_norm.weight"))
                k = self.rms(k, self.w(p + "attn_k_norm.weight"))
            base = 10000.0 if sliding else self.theta
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            mask = pos[None, :] > pos[:, None]
            if sliding:
                mask |= pos[None, :] <= pos[:, None] - self.window
            out = np.zeros((n, self.heads, hd), np.float32)
            for hh in range(self.heads):
                s = q[:, hh] @ k[:, hh // group].T / np.float32(np.sqrt(hd))
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // group]
            a = self.linear(out.reshape(n, -1), p + "attn_output")
            if gemma:
                a = self.rms(a, self.w(p + "post_attention_norm.weight"))
            h = h + a
            x = self.rms(h, self.w(p + "ffn_norm.weight"))
            g = self.linear(x, p + "ffn_gate")
            if gemma:
                g = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                g = g / (1 + np.exp(-g))
            f = self.linear(g * self.linear(x, p + "ffn_up"), p + "ffn_down")
            if gemma:
                f = self.rms(f, self.w(p + "post_ffw_norm.weight"))
            h = h + f
        h = self.rms(h[-1:], self.w("output_norm.weight"))
        out = self.w("output.weight") if self.has("output.weight") else emb
        z = (h @ out.T)[0].astype(np.float64)
        m = z.max()
        return z - m - np.log(np.exp(z - m).sum())


def top10(ref, ids):
    lp = ref.logprobs(ids)
    return [{"id": int(i), "logprob": round(float(lp[i]), 5)} for i in np.argsort(-lp)[:10]]
