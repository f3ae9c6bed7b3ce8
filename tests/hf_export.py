"""tests/hf_export.py: a Hugging Face-style GPT-2, Llama or GPT-NeoX checkpoint written from
PyTorch, and its loss.

GPT-2 (the default): writes DIR/config.json and DIR/model.safetensors the way Hugging Face's
GPT2LMHeadModel saves them: names with the "transformer." prefix, Conv1D weights stored [in, out],
the causal-mask buffers "h.<i>.attn.bias" present, and "lm_head.weight" (tied, equal to wte).
Llama (a last argument "llama"): writes DIR/config.json (model_type "llama", LlamaForCausalLM;
L=2, H=32, A=4 query heads, G=2 key/value heads, F=64, 64 positions, rope_theta 10000,
rms_norm_eps 1e-6, untied head) and the weights sharded as Hugging Face's save_pretrained shards
them: DIR/model-00001-of-00002.safetensors, DIR/model-00002-of-00002.safetensors and
DIR/model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {tensor:
file}}),
every tensor f32 [out, in] under LlamaForCausalLM's names; the files are read back and checked
against the index before the loss is computed from what was read.
GPT-NeoX (a last argument "neox"): DIR/config.json (model_type "gpt_neox", GPTNeoXForCausalLM; L=2,
H=32, A=4 heads of 8, rotary_pct 0.5, rotary_emb_base 10000, F=4H, hidden_act "gelu" as Pythia's,
use_parallel_residual) and DIR/model.safetensors under its names, query_key_value in its per-head
[q | k | v] row order, and the buffers older transformers versions saved beside them (each
layer's attention.bias and attention.masked_bias masks and rotary_emb.inv_freq).
All also write an llm.c token shard DIR/tokens.bin (uint16, vocabulary 256) of TEXT's bytes,
and print the PyTorch loss of the first K batches of B x S tokens, windows taken as llm.c's
loader takes them (batch k: tokens[k B S .. (k+1) B S + 1)), averaged — what train
--eval-only prints.

    python3 tests/hf_export.py DIR TEXT B S K [llama | neox]
"""

import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import (
    gpt2_loss,
    llama_loss,
    neox_loss,
)  # noqa: E402  (the same PyTorch models as the reference test)

L, H, A, V, P = 2, 32, 4, 256, 64


def write_safetensors(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.uint8: "U8"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(t.shape),
            "data_offsets": [off, off + len(raw)],
        }
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """{name: tensor} and the metadata of a safetensors file, checking its layout as a reader
    must."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    data, out, end = raw[8 + n :], {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        a, b = e["data_offsets"]
        assert e["dtype"] == "F32" and a == end and b - a == 4 * math.prod(e["shape"]), (
            path,
            name,
            e,
        )
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(e["shape"])
        end = b
    assert end == len(data), (path, "bytes past the last tensor")
    return out, meta


def windows_loss(loss_fn, cfg, W, toks, B, S, K):
    total = 0.0
    with torch.no_grad():
        for k in range(K):
            w = toks[k * B * S : (k + 1) * B * S + 1]
            total += loss_fn(dict(cfg, B=B, S=S), W, w[:-1], w[1:]).item()
    return total / K


def write_tokens(d, text):
    data = open(text, "rb").read()
    with open(os.path.join(d, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(data), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(data), *data))
    return torch.tensor(list(data), dtype=torch.long)


def llama(d, text, B, S, K):
    L, H, A, G, F, V, P, theta, eps = 2, 32, 4, 2, 64, 256, 64, 10000.0, 1e-6
    D = H // A
    g = torch.Generator().manual_seed(7)
    W = {"model.embed_tokens.weight": torch.randn(V, H, generator=g) * 0.3}
    shapes = {
        "input_layernorm.weight": (H,),
        "self_attn.q_proj.weight": (A * D, H),
        "self_attn.k_proj.weight": (G * D, H),
        "self_attn.v_proj.weight": (G * D, H),
        "self_attn.o_proj.weight": (H, A * D),
        "post_attention_layernorm.weight": (H,),
        "mlp.gate_proj.weight": (F, H),
        "mlp.up_proj.weight": (F, H),
        "mlp.down_proj.weight": (H, F),
    }
    for i in range(L):
        for k, s in shapes.items():
            t = torch.randn(*s, generator=g) * 0.2
            W["model.layers.%d.%s" % (i, k)] = 1 + t if k.endswith("layernorm.weight") else t
    W["model.norm.weight"] = 1 + 0.2 * torch.randn(H, generator=g)
    W["lm_head.weight"] = torch.randn(V, H, generator=g) * 0.2
    # two shards as save_pretrained makes them, in state-dict order: the embedding and the first
    # half of the layers, then the rest; each file's tensors sorted by name, as safetensors writes
    # them
    first = ["model.embed_tokens.weight"] + [
        "model.layers.%d.%s" % (i, k) for i in range(L // 2) for k in shapes
    ]
    files = ["model-%05d-of-%05d.safetensors" % (k + 1, 2) for k in range(2)]
    weight_map = {name: files[0 if name in first else 1] for name in W}
    for f in files:
        write_safetensors(os.path.join(d, f), {n: W[n] for n in sorted(W) if weight_map[n] == f})
    total = sum(t.numel() * t.element_size() for t in W.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(
            {"metadata": {"total_size": total}, "weight_map": weight_map},
            f,
            indent=2,
            sort_keys=True,
        )
        f.write("\n")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": V,
                "hidden_size": H,
                "intermediate_size": F,
                "num_hidden_layers": L,
                "num_attention_heads": A,
                "num_key_value_heads": G,
                "max_position_embeddings": P,
                "rms_norm_eps": eps,
                "rope_theta": theta,
                "rope_scaling": None,
                "hidden_act": "silu",
                "attention_bias": False,
                "mlp_bias": False,
                "tie_word_embeddings": False,
                "initializer_range": 0.02,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "torch_dtype": "float32",
            },
            f,
            indent=2,
        )
        f.write("\n")
    stale = os.path.join(
        d, "model.safetensors"
    )  # a reader must take the index, not an old single file
    if os.path.exists(stale):
        os.remove(stale)

    # read it all back: the index names every tensor once, its file holds it, nothing else is there
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    assert set(index) == {"metadata", "weight_map"} and index["metadata"]["total_size"] == total
    R, size = {}, 0
    for f in sorted(set(index["weight_map"].values())):
        t, meta = read_safetensors(os.path.join(d, f))
        assert meta == {"format": "pt"}, meta
        assert set(t) == {n for n, v in index["weight_map"].items() if v == f}, f
        R.update(t)
        size += sum(x.numel() * 4 for x in t.values())
    assert set(R) == set(W) and size == total
    assert all(torch.equal(R[n], W[n]) for n in W)
    c = json.load(open(os.path.join(d, "config.json")))
    cfg = {
        "L": c["num_hidden_layers"],
        "H": c["hidden_size"],
        "A": c["num_attention_heads"],
        "kv_heads": c["num_key_value_heads"],
        "norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"],
        "tie": c["tie_word_embeddings"],
        "smoothing": 0.0,
    }
    assert R["model.layers.0.mlp.gate_proj.weight"].shape == (c["intermediate_size"], H) and R[
        "lm_head.weight"
    ].shape == (c["vocab_size"], H)
    assert S <= c["max_position_embeddings"]
    toks = write_tokens(d, text)
    print(
        "%.8f" % windows_loss(llama_loss, cfg, {k: t.double() for k, t in R.items()}, toks, B, S, K)
    )


def neox(d, text, B, S, K):
    L, H, A, F, V, P, pct, theta, eps = 2, 32, 4, 128, 256, 64, 0.5, 10000.0, 1e-5
    R = int(H // A * pct)
    g = torch.Generator().manual_seed(9)
    W = {"gpt_neox.embed_in.weight": torch.randn(V, H, generator=g) * 0.3}
    shapes = {
        "input_layernorm.weight": (H,),
        "input_layernorm.bias": (H,),
        "post_attention_layernorm.weight": (H,),
        "post_attention_layernorm.bias": (H,),
        "attention.query_key_value.weight": (3 * H, H),
        "attention.query_key_value.bias": (3 * H,),
        "attention.dense.weight": (H, H),
        "attention.dense.bias": (H,),
        "mlp.dense_h_to_4h.weight": (F, H),
        "mlp.dense_h_to_4h.bias": (F,),
        "mlp.dense_4h_to_h.weight": (H, F),
        "mlp.dense_4h_to_h.bias": (H,),
    }
    for i in range(L):
        for k, s in shapes.items():
            t = torch.randn(*s, generator=g) * 0.2
            W["gpt_neox.layers.%d.%s" % (i, k)] = 1 + t if k.endswith("layernorm.weight") else t
    W["gpt_neox.final_layer_norm.weight"] = 1 + 0.2 * torch.randn(H, generator=g)
    W["gpt_neox.final_layer_norm.bias"] = 0.2 * torch.randn(H, generator=g)
    W["embed_out.weight"] = torch.randn(V, H, generator=g) * 0.2
    out = dict(W)
    for i in range(L):  # the buffers older transformers versions saved: recomputed, not parameters
        p = "gpt_neox.layers.%d.attention." % i
        out[p + "bias"] = torch.ones(P, P).tril().view(1, 1, P, P)
        out[p + "masked_bias"] = torch.tensor(-1e9)
        out[p + "rotary_emb.inv_freq"] = 1.0 / (
            theta ** (torch.arange(0, R, 2, dtype=torch.float32) / R)
        )
    write_safetensors(os.path.join(d, "model.safetensors"), out)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["GPTNeoXForCausalLM"],
                "model_type": "gpt_neox",
                "vocab_size": V,
                "hidden_size": H,
                "intermediate_size": F,
                "num_hidden_layers": L,
                "num_attention_heads": A,
                "max_position_embeddings": P,
                "rotary_pct": pct,
                "rotary_emb_base": theta,
                "layer_norm_eps": eps,
                "hidden_act": "gelu",
                "use_parallel_residual": True,
                "tie_word_embeddings": False,
                "initializer_range": 0.02,
                "bos_token_id": 0,
                "eos_token_id": 0,
                "torch_dtype": "float32",
            },
            f,
            indent=2,
        )
        f.write("\n")
    back, _ = read_safetensors(os.path.join(d, "model.safetensors"))
    assert set(back) == set(out) and all(torch.equal(back[n], out[n]) for n in out)
    cfg = {
        "L": L,
        "H": H,
        "A": A,
        "ln_eps": eps,
        "rope_theta": theta,
        "rotary_pct": pct,
        "smoothing": 0.0,
    }
    toks = write_tokens(d, text)
    print(
        "%.8f" % windows_loss(neox_loss, cfg, {k: t.double() for k, t in W.items()}, toks, B, S, K)
    )


def main():
    d, text, B, S, K = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    arch = sys.argv[6] if len(sys.argv) > 6 else "gpt2"
    if arch not in ("gpt2", "llama", "neox"):
        sys.exit("hf_export.py: expected gpt2, llama or neox, got %r" % arch)
    os.makedirs(d, exist_ok=True)
    if arch == "llama":
        return llama(d, text, B, S, K)
    if arch == "neox":
        return neox(d, text, B, S, K)
    g = torch.Generator().manual_seed(5)
    W = {
        "wte.weight": torch.randn(V, H, generator=g) * 0.3,
        "wpe.weight": torch.randn(P, H, generator=g) * 0.1,
    }
    shapes = {
        "ln_1.weight": (H,),
        "ln_1.bias": (H,),
        "attn.c_attn.weight": (3 * H, H),
        "attn.c_attn.bias": (3 * H,),
        "attn.c_proj.weight": (H, H),
        "attn.c_proj.bias": (H,),
        "ln_2.weight": (H,),
        "ln_2.bias": (H,),
        "mlp.c_fc.weight": (4 * H, H),
        "mlp.c_fc.bias": (4 * H,),
        "mlp.c_proj.weight": (H, 4 * H),
        "mlp.c_proj.bias": (H,),
    }
    for i in range(L):
        for k, s in shapes.items():
            t = torch.randn(*s, generator=g) * 0.2
            if k.startswith("ln_") and k.endswith("weight"):
                t = 1 + t
            W["h.%d.%s" % (i, k)] = t
    W["ln_f.weight"] = 1 + 0.2 * torch.randn(H, generator=g)
    W["ln_f.bias"] = 0.2 * torch.randn(H, generator=g)
    out = {}
    for k, t in W.items():  # Hugging Face layout: Conv1D weights [in, out]
        conv = k.endswith(".weight") and (".attn.c_" in k or ".mlp.c_" in k)
        out["transformer." + k] = t.t().contiguous() if conv else t
    for i in range(L):
        out["transformer.h.%d.attn.bias" % i] = torch.ones(P, P).tril().view(1, 1, P, P)
    out["lm_head.weight"] = W["wte.weight"]
    write_safetensors(os.path.join(d, "model.safetensors"), out)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(
            {
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "vocab_size": V,
                "n_positions": P,
                "n_ctx": P,
                "n_embd": H,
                "n_layer": L,
                "n_head": A,
                "n_inner": None,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": 1e-5,
            },
            f,
            indent=2,
        )
    toks = write_tokens(d, text)
    cfg = {"L": L, "H": H, "A": A, "ln_eps": 1e-5, "smoothing": 0.0}
    print(
        "%.8f" % windows_loss(gpt2_loss, cfg, {k: t.double() for k, t in W.items()}, toks, B, S, K)
    )


if __name__ == "__main__":
    main()
