"""tests/torch_ref.py: the PyTorch reference for the GPT-2, Llama, GPT-NeoX, Mixtral and Qwen2-MoE
models.

Reads what tests/torch_dump.c wrote (the global weights of a tensor-parallel run, its tokens,
its loss and its gathered gradients), rebuilds the same model in float64 with PyTorch's own
layers, and compares the loss and every gradient (relative error < 1e-4, the error relative to
the largest reference value). model.txt's config says which model ("arch", GPT-2 when absent):
  GPT-2: F.embedding, F.layer_norm, F.linear, causal softmax attention,
         F.gelu(approximate="tanh"), the tied LM head;
  Llama: written out as Hugging Face's LlamaForCausalLM computes it (without importing it):
         LlamaRMSNorm, rotary embeddings in the rotate-half convention, grouped-query attention
         (repeat_kv), the SwiGLU MLP, the untied (or tied) LM head;
  GPT-NeoX: written out as Hugging Face's GPTNeoXForCausalLM computes it (use_parallel_residual,
         the per-head [q | k | v] rows of query_key_value, rotary embeddings on the first
         rotary_pct of each head, the exact GELU or its tanh form), the untied embed_out;
  Mixtral: written out as Hugging Face's MixtralForCausalLM computes it: Llama's attention and
         norms, MixtralSparseMoeBlock (the gate, softmax, top-k, the weights renormalised, each
         expert's SwiGLU w2(silu(w1 x) * w3 x) on its tokens, index_add_), and the loss plus
         router_aux_loss_coef times load_balancing_loss_func over every layer's router logits
         concatenated; at DP > 1 each DP rank's tokens (ids<r>.bin) give a loss, and the mean of
         them is compared (each EP rank's experts read from ep<q>.txt);
  Qwen2-MoE: written out as Hugging Face's Qwen2MoeForCausalLM computes it: Qwen2's attention
         (Llama's with q, k, v biases, o_proj without), Qwen2MoeSparseMoeBlock (the gate, softmax,
         top-k, the weights renormalised only with norm_topk_prob, each expert's SwiGLU
         down_proj(silu(gate_proj x) * up_proj x) on its tokens, plus the shared expert times
         sigmoid(shared_expert_gate x) on every token) in a sparse layer, Qwen2MoeMLP (the
         SwiGLU mlp.gate_proj, up_proj, down_proj of intermediate_size) in a dense one — layer i
         sparse iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0, as
         Qwen2MoeDecoderLayer decides —, the loss plus router_aux_loss_coef times
         load_balancing_loss_func over the sparse layers' router logits alone (a dense layer
         returns none, as Qwen2MoeModel collects them); DP and EP as Mixtral's;
all F.cross_entropy with ignore_index=-100 and label_smoothing.
Prints "ok ..." or "FAIL ..." (counted by tests/run.sh); exit status 1 on failure.

    python3 tests/torch_ref.py DIR
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

TOL = 1e-4


def load(d):
    cfg, loss = {}, None

    def floats(name):
        with open(os.path.join(d, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)

    def ints(name):
        with open(os.path.join(d, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.int32).long()

    W, G = {}, {}

    def read(txt, wbin, gbin):
        nonlocal cfg, loss
        params = []
        with open(os.path.join(d, txt)) as f:
            for line in f:
                w = line.split()
                if w[0] == "config":
                    cfg = {
                        w[i]: (w[i + 1] if w[i] in ("arch", "mlp_only") else float(w[i + 1]))
                        for i in range(1, len(w), 2)
                    }
                elif w[0] == "loss":
                    loss = float(w[1])
                elif w[0] == "param":
                    ndim = int(w[3])
                    params.append((w[1], int(w[2]), [int(x) for x in w[4 : 4 + ndim]]))
        wflat, gflat = floats(wbin), floats(gbin)
        for name, off, shape in params:
            n = math.prod(shape)
            W[name] = wflat[off : off + n].reshape(shape).double().clone().requires_grad_(True)
            G[name] = gflat[off : off + n].reshape(shape).double()

    read("model.txt", "weights.bin", "grads.bin")
    if cfg.get("arch") in ("mixtral", "qwen2_moe"):  # each EP rank's experts, DP rank's tokens
        for q in range(int(cfg["ep"])):
            read("ep%d.txt" % q, "ep%d_w.bin" % q, "ep%d_g.bin" % q)
        dp = int(cfg["dp"])
        return (
            cfg,
            loss,
            W,
            G,
            [ints("ids%d.bin" % r) for r in range(dp)],
            [ints("targets%d.bin" % r) for r in range(dp)],
        )
    return cfg, loss, W, G, ints("ids.bin"), ints("targets.bin")


def gpt2_loss(cfg, W, ids, targets):
    L, H, A = int(cfg["L"]), int(cfg["H"]), int(cfg["A"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["ln_eps"]
    D = H // A
    ids = ids.view(B, S)
    x = F.embedding(ids, W["wte.weight"]) + F.embedding(torch.arange(S), W["wpe.weight"])[None]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(L):
        p = "h.%d." % i
        h = F.layer_norm(x, (H,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = F.linear(h, W[p + "attn.c_attn.weight"], W[p + "attn.c_attn.bias"])
        q, k, v = (t.view(B, S, A, D).transpose(1, 2) for t in qkv.split(H, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, H)
        x = x + F.linear(y, W[p + "attn.c_proj.weight"], W[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (H,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        u = F.gelu(
            F.linear(h, W[p + "mlp.c_fc.weight"], W[p + "mlp.c_fc.bias"]), approximate="tanh"
        )
        x = x + F.linear(u, W[p + "mlp.c_proj.weight"], W[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (H,), W["ln_f.weight"], W["ln_f.bias"], eps)
    logits = x @ W["wte.weight"].t()  # the tied LM head
    return F.cross_entropy(
        logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"]
    )


def rms_norm(x, w, eps):
    """Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(S, D, theta):
    """cos, sin [S, D] of Hugging Face Llama's rotary embedding at positions 0..S-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n):
    """[B, G, S, D] -> [B, G n, S, D]: key/value head g serves query heads g n .. g n + n - 1."""
    B, G, S, D = x.shape
    return x[:, :, None].expand(B, G, n, S, D).reshape(B, G * n, S, D)


def llama_attention(cfg, W, p, x, cos, sin):
    """LlamaAttention of layer prefix p (Mixtral's too; Qwen2's with the q, k, v biases W holds)
    on x [B, S, H]: RMSNorm, grouped-query heads with rotate-half RoPE, causal softmax, o_proj;
    the residual branch's output"""
    B, S, H = x.shape
    A, G, eps = int(cfg["A"]), int(cfg["kv_heads"]), cfg["norm_eps"]
    D = H // A
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
    a = p + "self_attn."
    q = F.linear(h, W[a + "q_proj.weight"], W.get(a + "q_proj.bias"))
    k = F.linear(h, W[a + "k_proj.weight"], W.get(a + "k_proj.bias"))
    v = F.linear(h, W[a + "v_proj.weight"], W.get(a + "v_proj.bias"))
    q = q.view(B, S, A, D).transpose(1, 2)
    k, v = k.view(B, S, G, D).transpose(1, 2), v.view(B, S, G, D).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, A // G), repeat_kv(v, A // G)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, S, H)
    return F.linear(y, W[p + "self_attn.o_proj.weight"])


def llama_loss(cfg, W, ids, targets):
    L, H, A, G = int(cfg["L"]), int(cfg["H"]), int(cfg["A"]), int(cfg["kv_heads"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["norm_eps"]
    D = H // A
    ids = ids.view(B, S)
    x = F.embedding(ids, W["model.embed_tokens.weight"])
    cos, sin = rope_cos_sin(S, D, cfg["rope_theta"])
    for i in range(L):
        p = "model.layers.%d." % i
        x = x + llama_attention(cfg, W, p, x, cos, sin)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        u = F.silu(F.linear(h, W[p + "mlp.gate_proj.weight"])) * F.linear(
            h, W[p + "mlp.up_proj.weight"]
        )
        x = x + F.linear(u, W[p + "mlp.down_proj.weight"])
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie") else W["lm_head.weight"]
    logits = F.linear(x, head)
    return F.cross_entropy(
        logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"]
    )


def load_balancing_loss_func(gate_logits, num_experts, top_k):
    """Hugging Face's (transformers.models.mixtral.modeling_mixtral), without an attention mask:
    the layers' router logits concatenated, then E sum_e f_e P_e over all of their rows."""
    concatenated_gate_logits = torch.cat(gate_logits, dim=0)
    routing_weights = F.softmax(concatenated_gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.double(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


def mixtral_loss_one(cfg, W, ids, targets):
    L, H, A, G = int(cfg["L"]), int(cfg["H"]), int(cfg["A"]), int(cfg["kv_heads"])
    E, K = int(cfg["experts"]), int(cfg["top_k"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["norm_eps"]
    D = H // A
    ids = ids.view(B, S)
    x = F.embedding(ids, W["model.embed_tokens.weight"])
    cos, sin = rope_cos_sin(S, D, cfg["rope_theta"])
    router_logits = []
    for i in range(L):
        p = "model.layers.%d." % i
        x = x + llama_attention(cfg, W, p, x, cos, sin)
        # MixtralSparseMoeBlock
        hs = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps).view(-1, H)
        m = p + "block_sparse_moe."
        logits = F.linear(hs, W[m + "gate.weight"])
        router_logits.append(logits)
        rw = F.softmax(logits, dim=1)
        rw, sel = torch.topk(rw, K, dim=-1)
        rw = rw / rw.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(hs)
        expert_mask = F.one_hot(sel, num_classes=E).permute(2, 1, 0)
        for e in range(E):
            idx, top_x = torch.where(expert_mask[e])
            cur = hs[None, top_x].reshape(-1, H)
            w = m + "experts.%d." % e
            cur = F.linear(
                F.silu(F.linear(cur, W[w + "w1.weight"])) * F.linear(cur, W[w + "w3.weight"]),
                W[w + "w2.weight"],
            ) * rw[top_x, idx, None]
            out = out.index_add(0, top_x, cur)
        x = x + out.view(B, S, H)
    x = rms_norm(x, W["model.norm.weight"], eps)
    logits = F.linear(x, W["lm_head.weight"])
    loss = F.cross_entropy(
        logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"]
    )
    return loss + cfg["aux_coef"] * load_balancing_loss_func(tuple(router_logits), E, K)


def mixtral_loss(cfg, W, ids, targets):
    """The mean over the DP ranks of each one's loss on its own tokens."""
    return sum(mixtral_loss_one(cfg, W, i, t) for i, t in zip(ids, targets)) / len(ids)


def qwen2_moe_loss_one(cfg, W, ids, targets):
    L, H, A = int(cfg["L"]), int(cfg["H"]), int(cfg["A"])
    E, K = int(cfg["experts"]), int(cfg["top_k"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["norm_eps"]
    D = H // A
    ids = ids.view(B, S)
    x = F.embedding(ids, W["model.embed_tokens.weight"])
    cos, sin = rope_cos_sin(S, D, cfg["rope_theta"])
    router_logits = []

    def swiglu(t, w):  # Qwen2MoeMLP
        return F.linear(
            F.silu(F.linear(t, W[w + "gate_proj.weight"])) * F.linear(t, W[w + "up_proj.weight"]),
            W[w + "down_proj.weight"],
        )

    step = int(cfg.get("sparse_step", 1))  # decoder_sparse_step
    only = [int(t) for t in cfg.get("mlp_only", "-").split(",") if t != "-"]  # mlp_only_layers
    for i in range(L):
        p = "model.layers.%d." % i
        x = x + llama_attention(cfg, W, p, x, cos, sin)
        hs = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps).view(-1, H)
        m = p + "mlp."
        if i in only or (i + 1) % step != 0:  # Qwen2MoeMLP: a dense layer, no router logits
            x = x + swiglu(hs, m).view(B, S, H)
            continue
        # Qwen2MoeSparseMoeBlock
        logits = F.linear(hs, W[m + "gate.weight"])
        router_logits.append(logits)
        rw = F.softmax(logits, dim=1)
        rw, sel = torch.topk(rw, K, dim=-1)
        if cfg["norm_topk_prob"]:
            rw = rw / rw.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(hs)
        expert_mask = F.one_hot(sel, num_classes=E).permute(2, 1, 0)
        for e in range(E):
            idx, top_x = torch.where(expert_mask[e])
            cur = hs[None, top_x].reshape(-1, H)
            cur = swiglu(cur, m + "experts.%d." % e) * rw[top_x, idx, None]
            out = out.index_add(0, top_x, cur)
        shared = swiglu(hs, m + "shared_expert.")
        out = out + torch.sigmoid(F.linear(hs, W[m + "shared_expert_gate.weight"])) * shared
        x = x + out.view(B, S, H)
    x = rms_norm(x, W["model.norm.weight"], eps)
    logits = F.linear(x, W["lm_head.weight"])
    loss = F.cross_entropy(
        logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"]
    )
    return loss + cfg["aux_coef"] * load_balancing_loss_func(tuple(router_logits), E, K)


def qwen2_moe_loss(cfg, W, ids, targets):
    """The mean over the DP ranks of each one's loss on its own tokens."""
    return sum(qwen2_moe_loss_one(cfg, W, i, t) for i, t in zip(ids, targets)) / len(ids)


def neox_loss(cfg, W, ids, targets):
    L, H, A = int(cfg["L"]), int(cfg["H"]), int(cfg["A"])
    B, S, eps = int(cfg["B"]), int(cfg["S"]), cfg["ln_eps"]
    D = H // A
    R = int(D * cfg["rotary_pct"])  # Hugging Face's rotary_ndims
    ids = ids.view(B, S)
    x = F.embedding(ids, W["gpt_neox.embed_in.weight"])
    cos, sin = rope_cos_sin(S, R, cfg["rope_theta"])
    causal = torch.ones(S, S, dtype=torch.bool).tril()

    def rot(t):
        r, rest = t[..., :R], t[..., R:]
        return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)

    def ln(t, name):
        return F.layer_norm(t, (H,), W[name + ".weight"], W[name + ".bias"], eps)

    def lin(t, name):
        return F.linear(t, W[name + ".weight"], W[name + ".bias"])

    for i in range(L):
        p = "gpt_neox.layers.%d." % i
        qkv = lin(ln(x, p + "input_layernorm"), p + "attention.query_key_value")
        qkv = qkv.view(B, S, A, 3 * D).permute(0, 2, 1, 3)  # per head [q | k | v]
        q, k, v = rot(qkv[..., :D]), rot(qkv[..., D : 2 * D]), qkv[..., 2 * D :]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, H)
        a = lin(y, p + "attention.dense")
        h = ln(x, p + "post_attention_layernorm")  # the parallel residual: from x
        approx = "tanh" if cfg.get("gelu_tanh") else "none"
        m = lin(
            F.gelu(lin(h, p + "mlp.dense_h_to_4h"), approximate=approx), p + "mlp.dense_4h_to_h"
        )
        x = x + a + m
    x = ln(x, "gpt_neox.final_layer_norm")
    logits = F.linear(x, W["embed_out.weight"])
    return F.cross_entropy(
        logits.view(B * S, -1), targets, ignore_index=-100, label_smoothing=cfg["smoothing"]
    )


def main():
    d = sys.argv[1]
    cfg, c_loss, W, G, ids, targets = load(d)
    where = " at t=%d%s, smoothing %.1f" % (cfg["tp"], " SP" if cfg["sp"] else "", cfg["smoothing"])
    if cfg.get("arch") == "mixtral":
        what = (
            "PyTorch reference: Mixtral (L=%d, H=%d, A=%d, G=%d, E=%d, k=%d, F=%d, V=%d, aux %g)"
            " at t=%d x EP %d x DP %d"
            % (
                cfg["L"],
                cfg["H"],
                cfg["A"],
                cfg["kv_heads"],
                cfg["experts"],
                cfg["top_k"],
                cfg["ffn"],
                cfg["V"],
                cfg["aux_coef"],
                cfg["tp"],
                cfg["ep"],
                cfg["dp"],
            )
        )
        loss = mixtral_loss(cfg, W, ids, targets)
    elif cfg.get("arch") == "qwen2_moe":
        what = (
            "PyTorch reference: Qwen2-MoE (L=%d, H=%d, A=%d, G=%d, E=%d, k=%d, F=%d, F_s=%d, V=%d, "
            "norm_topk_prob %d, aux %g%s) at t=%d x EP %d x DP %d"
            % (
                cfg["L"],
                cfg["H"],
                cfg["A"],
                cfg["kv_heads"],
                cfg["experts"],
                cfg["top_k"],
                cfg["ffn"],
                cfg["shared_ffn"],
                cfg["V"],
                cfg["norm_topk_prob"],
                cfg["aux_coef"],
                (
                    ", decoder_sparse_step %d, mlp_only_layers [%s], dense F_d=%d"
                    % (cfg["sparse_step"], cfg["mlp_only"], cfg["dense_ffn"])
                    if cfg.get("sparse_step", 1) != 1 or cfg.get("mlp_only", "-") != "-"
                    else ""
                ),
                cfg["tp"],
                cfg["ep"],
                cfg["dp"],
            )
        )
        loss = qwen2_moe_loss(cfg, W, ids, targets)
    elif cfg.get("arch") == "neox":
        what = (
            "PyTorch reference: GPT-NeoX (L=%d, H=%d, A=%d, F=%d, V=%d, rotary_pct %g, base %g, %s "
            "GELU)%s"
            % (
                cfg["L"],
                cfg["H"],
                cfg["A"],
                cfg["ffn"],
                cfg["V"],
                cfg["rotary_pct"],
                cfg["rope_theta"],
                "tanh" if cfg.get("gelu_tanh") else "exact",
                where,
            )
        )
        loss = neox_loss(cfg, W, ids, targets)
    elif cfg.get("arch", "gpt2") == "llama":
        what = (
            "PyTorch reference: Llama (L=%d, H=%d, A=%d, G=%d, F=%d, V=%d, rope_theta %g, %s "
            "head)%s"
            % (
                cfg["L"],
                cfg["H"],
                cfg["A"],
                cfg["kv_heads"],
                cfg["ffn"],
                cfg["V"],
                cfg["rope_theta"],
                "tied" if cfg["tie"] else "untied",
                where,
            )
        )
        loss = llama_loss(cfg, W, ids, targets)
    else:
        what = "PyTorch reference: GPT-2 (L=%d, H=%d, A=%d, V=%d)%s" % (
            cfg["L"],
            cfg["H"],
            cfg["A"],
            cfg["V"],
            where,
        )
        loss = gpt2_loss(cfg, W, ids, targets)
    loss.backward()
    fails = []
    lerr = abs(c_loss - loss.item()) / abs(loss.item())
    if not lerr < TOL:
        fails.append("loss %.8g, PyTorch %.8g (relative %.3g)" % (c_loss, loss.item(), lerr))
    worst = lerr
    for name, w in W.items():
        ref = w.grad
        if ref is None:  # a parameter the reference model never reads
            fails.append("%s: not a parameter of the PyTorch model" % name)
            continue
        err = ((G[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
        if not err < TOL:  # NaN fails too
            fails.append("gradient of %s: relative error %.3g" % (name, err))
    for f in fails:
        print("  " + f)
    print(
        "%s %s: loss and %d gradients match (worst relative error %.2g)"
        % ("FAIL" if fails else "ok", what, len(W), worst)
    )
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
