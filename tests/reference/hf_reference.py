#!/usr/bin/env python3
"""hf_reference.py - an independent NumPy implementation of Hugging Face transformers' causal LMs
of model_type llama, mistral, qwen2 and qwen3, written from transformers' modelling code
(modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py and
modeling_rope_utils.py), to check the engine against. It shares no code with the engine: it reads
config.json and the safetensors files (one file or shards) itself.

    hf_reference.py init CONFIG.json OUT [--seed S] [--dtype f32|bf16] [--shards N]
        a model folder with random weights for CONFIG (HF tensor names and shapes), to score
    hf_reference.py score DIR [--generate N]  < ids.json
        stdin: a JSON list of ids or a list of lists (as `marlaas score --ids`); stdout: the same
        JSON document `marlaas score` writes: per-token log-probs, and N greedy tokens
    hf_reference.py compare OURS.json REF.json [--tol 1e-4]
        the largest log-prob difference and the greedy tokens compared; exit 1 beyond tol

Numerics: everything in float64, except where transformers computes the rotary embedding in fp32
(inv_freq, position * inv_freq, and yarn's attention factor applied to fp32 cos/sin), which is
reproduced in fp32, as the engine must reproduce it too.
"""
import json
import math
import struct
import sys

import numpy as np

# --- safetensors ------------------------------------------------------------------------------------


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        raw = body[b:en]
        dt = e["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise SystemExit(f"{path}: {name} has dtype {dt}")
        out[name] = a.reshape(e["shape"])
    return out


def st_write(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a32 = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "bf16":
            u = a32.view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")   # round to nearest even
            raw, dt = u.tobytes(), "BF16"
        else:
            raw, dt = a32.astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def load_weights(d):
    import os
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return st_read(single)
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    w = {}
    for fn in sorted(set(idx["weight_map"].values())):
        w.update(st_read(os.path.join(d, fn)))
    return w


# --- the model ---------------------------------------------------------------------------------------


class Config:
    """config.json with the defaults of transformers' config classes for the four types."""

    def __init__(self, c):
        self.raw = c
        t = c.get("model_type", "llama")
        self.type = t
        self.D = c["hidden_size"]
        self.F = c["intermediate_size"]
        self.L = c["num_hidden_layers"]
        self.H = c["num_attention_heads"]
        self.KV = c.get("num_key_value_heads") or self.H
        hd = c.get("head_dim")
        if hd is None and t == "qwen3":
            hd = 128
        self.hd = hd or self.D // self.H
        self.V = c["vocab_size"]
        default_max = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}[t]
        self.max_pos = c.get("max_position_embeddings") or default_max
        self.eps = c.get("rms_norm_eps") or 1e-6
        rp = c.get("rope_parameters")
        self.theta = c.get("rope_theta") or (rp or {}).get("rope_theta") or 10000.0
        self.rope = c.get("rope_scaling") or rp or {}
        self.rope_type = self.rope.get("rope_type", self.rope.get("type", "default"))
        self.tie = bool(c.get("tie_word_embeddings", False))
        self.act = c.get("hidden_act") or "silu"
        ab = bool(c.get("attention_bias", False))
        # qwen2: q/k/v biases always, o_proj never; llama and qwen3: all four with attention_bias
        self.qkv_bias = True if t == "qwen2" else (ab if t in ("llama", "qwen3") else False)
        self.o_bias = ab if t in ("llama", "qwen3") else False
        self.mlp_bias = bool(c.get("mlp_bias", False)) if t == "llama" else False
        self.qk_norm = t == "qwen3"
        # sliding window: mistral on every layer when set (class default 4096); qwen2/qwen3 only
        # with use_sliding_window, on layers >= max_window_layers
        sw = c.get("sliding_window", 4096) if t != "llama" else None
        if t in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
            sw = None
        mwl = c.get("max_window_layers", 28)
        self.window = [sw if (sw is not None and (t == "mistral" or i >= mwl)) else None for i in range(self.L)]


def rope_inv_freq(cfg, seq_len):
    """(inv_freq float32 (hd/2), attention_factor) as modeling_rope_utils computes them."""
    f32 = np.float32
    dim = cfg.hd
    base = cfg.theta
    ar = (np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)).astype(f32)
    inv = (f32(1.0) / np.power(f32(base), ar)).astype(f32)
    r, t = cfg.rope, cfg.rope_type
    if t == "default":
        return inv, 1.0
    if t == "linear":
        return (inv / f32(r["factor"])).astype(f32), 1.0
    if t == "dynamic":
        factor = r["factor"]
        seq = max(seq_len, cfg.max_pos)
        b = base * ((factor * seq / cfg.max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return (f32(1.0) / np.power(f32(b), ar)).astype(f32), 1.0
    if t == "llama3":
        factor, lo, hi = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        # `scalar / tensor` in torch is Tensor.__rtruediv__: reciprocal(tensor) * scalar
        wavelen = ((f32(1) / inv).astype(f32) * f32(2 * math.pi)).astype(f32)
        inv_l = np.where(wavelen > f32(low_wl), (inv / f32(factor)).astype(f32), inv).astype(f32)
        smooth = ((((f32(1) / wavelen).astype(f32) * f32(old)).astype(f32) - f32(lo)) / f32(hi - lo)).astype(f32)
        smoothed = ((f32(1) - smooth) * inv_l / f32(factor) + smooth * inv_l).astype(f32)
        medium = ~(wavelen < f32(high_wl)) & ~(wavelen > f32(low_wl))
        return np.where(medium, smoothed, inv_l).astype(f32), 1.0
    if t == "yarn":
        factor = r["factor"]
        orig = r.get("original_max_position_embeddings") or cfg.max_pos
        af = r.get("attention_factor")
        ms, msa = r.get("mscale"), r.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if af is None:
            af = get_mscale(factor, ms) / get_mscale(factor, msa) if (ms and msa) else get_mscale(factor)
        beta_fast = r.get("beta_fast") or 32
        beta_slow = r.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if r.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
        extrap_factor = (f32(1) - ramp).astype(f32)
        pos_freqs = np.power(f32(base), ar).astype(f32)
        inv_ext = (f32(1.0) / pos_freqs).astype(f32)
        inv_int = (f32(1.0) / (f32(factor) * pos_freqs)).astype(f32)
        return (inv_int * (f32(1) - extrap_factor) + inv_ext * extrap_factor).astype(f32), af
    raise SystemExit(f"rope type {t} is not in this reference")


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def act(name, x):
    if name in ("silu", "swish"):
        return x / (1.0 + np.exp(-x))
    if name == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise SystemExit(f"hidden_act {name} is not in this reference")


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(cfg, w, ids):
    """log_softmax of the logits of every position (T, V), float64."""
    T = len(ids)
    pos = np.arange(T)
    inv, af = rope_inv_freq(cfg, T)
    ang = (pos.astype(np.float32)[:, None] * inv[None, :]).astype(np.float32)   # fp32, as HF
    emb = np.concatenate([ang, ang], axis=-1)
    cos = (np.cos(emb).astype(np.float32) * np.float32(af)).astype(np.float64)
    sin = (np.sin(emb).astype(np.float32) * np.float32(af)).astype(np.float64)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    H, KV, hd = cfg.H, cfg.KV, cfg.hd
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], cfg.eps)

        def proj(name, inp, bias):
            y = inp @ w[p + name + ".weight"].T
            return y + w[p + name + ".bias"] if bias else y

        q = proj("self_attn.q_proj", h, cfg.qkv_bias).reshape(T, H, hd)
        k = proj("self_attn.k_proj", h, cfg.qkv_bias).reshape(T, KV, hd)
        v = proj("self_attn.v_proj", h, cfg.qkv_bias).reshape(T, KV, hd)
        if cfg.qk_norm:
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        rep = H // KV
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
        allowed = ki <= qi
        if cfg.window[l] is not None:
            allowed &= ki > qi - cfg.window[l]
        scores = np.where(allowed[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        pr = np.exp(scores)
        pr /= pr.sum(axis=-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", pr, v).reshape(T, H * hd)
        x = x + proj("self_attn.o_proj", att, cfg.o_bias)
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        g = proj("mlp.gate_proj", h, cfg.mlp_bias)
        u = proj("mlp.up_proj", h, cfg.mlp_bias)
        x = x + proj("mlp.down_proj", act(cfg.act, g) * u, cfg.mlp_bias)
    x = rmsnorm(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight"] if cfg.tie else w["lm_head.weight"]
    logits = x @ head.T
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


# --- commands ------------------------------------------------------------------------------------------


def weight_shapes(cfg):
    D, F, H, KV, hd, V = cfg.D, cfg.F, cfg.H, cfg.KV, cfg.hd, cfg.V
    s = {"model.embed_tokens.weight": (V, D)}
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (D,)
        s[p + "self_attn.q_proj.weight"] = (H * hd, D)
        s[p + "self_attn.k_proj.weight"] = (KV * hd, D)
        s[p + "self_attn.v_proj.weight"] = (KV * hd, D)
        s[p + "self_attn.o_proj.weight"] = (D, H * hd)
        if cfg.qkv_bias:
            s[p + "self_attn.q_proj.bias"] = (H * hd,)
            s[p + "self_attn.k_proj.bias"] = (KV * hd,)
            s[p + "self_attn.v_proj.bias"] = (KV * hd,)
        if cfg.o_bias:
            s[p + "self_attn.o_proj.bias"] = (D,)
        if cfg.qk_norm:
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "post_attention_layernorm.weight"] = (D,)
        s[p + "mlp.gate_proj.weight"] = (F, D)
        s[p + "mlp.up_proj.weight"] = (F, D)
        s[p + "mlp.down_proj.weight"] = (D, F)
        if cfg.mlp_bias:
            s[p + "mlp.gate_proj.bias"] = (F,)
            s[p + "mlp.up_proj.bias"] = (F,)
            s[p + "mlp.down_proj.bias"] = (D,)
    s["model.norm.weight"] = (D,)
    if not cfg.tie:
        s["lm_head.weight"] = (V, D)
    return s


def cmd_init(args):
    import argparse
    import os
    ap = argparse.ArgumentParser(prog="hf_reference.py init")
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args(args)
    c = json.load(open(a.config))
    cfg = Config(c)
    rng = np.random.default_rng(a.seed)
    t = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t[name] = 1.0 + 0.2 * rng.uniform(-1, 1, shape)
        elif name.endswith(".bias"):
            t[name] = 0.3 * rng.uniform(-1, 1, shape)
        else:
            # large enough that attention is far from uniform and the logits spread out
            t[name] = rng.uniform(-1, 1, shape) * (1.2 / math.sqrt(shape[-1]) if name != "model.embed_tokens.weight" else 1.0)
    os.makedirs(a.out, exist_ok=True)
    json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    names = list(t)
    if a.shards <= 1:
        st_write(os.path.join(a.out, "model.safetensors"), t, a.dtype)
        return
    per = -(-len(names) // a.shards)
    wm, total = {}, 0
    for i in range(a.shards):
        part = names[i * per:(i + 1) * per]
        fn = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
        total += st_write(os.path.join(a.out, fn), {n: t[n] for n in part}, a.dtype)
        wm.update({n: fn for n in part})
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)


def cmd_score(args):
    import argparse
    ap = argparse.ArgumentParser(prog="hf_reference.py score")
    ap.add_argument("dir")
    ap.add_argument("--generate", type=int, default=0)
    a = ap.parse_args(args)
    cfg = Config(json.load(open(a.dir + "/config.json")))
    w = load_weights(a.dir)
    data = json.load(sys.stdin)
    seqs = data if isinstance(data[0], list) else [data]
    out = []
    for ids in seqs:
        lp = forward(cfg, w, ids)
        s = {"tokens": ids, "logprobs": [None] + [float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]}
        s["sum"] = float(sum(s["logprobs"][1:]))
        if a.generate:
            cur, gen, glp, gaps = list(ids), [], [], []
            for _ in range(a.generate):
                row = forward(cfg, w, cur)[-1]
                order = np.argsort(-row, kind="stable")
                tok = int(order[0])
                gen.append(tok)
                glp.append(float(row[tok]))
                gaps.append(float(row[order[0]] - row[order[1]]))
                cur.append(tok)
            s["generated"], s["generated_logprobs"], s["top2_gaps"] = gen, glp, gaps
        out.append(s)
    json.dump({"sequences": out}, sys.stdout, indent=1)
    print()


def cmd_compare(args):
    import argparse
    ap = argparse.ArgumentParser(prog="hf_reference.py compare")
    ap.add_argument("ours")
    ap.add_argument("ref")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--label", default="")
    a = ap.parse_args(args)
    ours, ref = json.load(open(a.ours))["sequences"], json.load(open(a.ref))["sequences"]
    if len(ours) != len(ref):
        raise SystemExit(f"{a.label}: {len(ours)} sequences vs {len(ref)}")
    worst, n, ok, greedy, ties = 0.0, 0, True, 0, 0
    for o, r in zip(ours, ref):
        if o["tokens"] != r["tokens"]:
            raise SystemExit(f"{a.label}: different input tokens")
        for x, y in zip(o["logprobs"][1:], r["logprobs"][1:]):
            worst = max(worst, abs(x - y))
            n += 1
        if "generated" in r:
            for t, (x, y) in enumerate(zip(o["generated"], r["generated"])):
                if x != y:
                    # a near tie of the reference's top two logits may fall either way in fp32
                    if r["top2_gaps"][t] < a.tol:
                        ties += 1
                        break
                    print(f"{a.label}: greedy token {t}: ours {x}, reference {y} "
                          f"(top-2 gap {r['top2_gaps'][t]:.3g})")
                    ok = False
                    break
                worst = max(worst, abs(o["generated_logprobs"][t] - r["generated_logprobs"][t]))
                greedy += 1
                n += 1
            if len(o["generated"]) != len(r["generated"]):
                print(f"{a.label}: {len(o['generated'])} generated tokens vs {len(r['generated'])}")
                ok = False
    ok = ok and worst <= a.tol
    print(f"{a.label}: {n} log-probs, max |diff| {worst:.3g} (tol {a.tol:g}); {greedy} greedy tokens equal"
          f"{f', {ties} near-tie(s) stopped the comparison' if ties else ''}: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("init", "score", "compare"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    {"init": cmd_init, "score": cmd_score, "compare": cmd_compare}[sys.argv[1]](sys.argv[2:])
