"""tests/hf_export.py: a Hugging Face-style GPT-2 checkpoint written from PyTorch, and its loss.

Writes DIR/config.json and DIR/model.safetensors the way Hugging Face's GPT2LMHeadModel saves
them: names with the "transformer." prefix, Conv1D weights stored [in, out], the causal-mask
buffers "h.<i>.attn.bias" present, and "lm_head.weight" (tied, equal to wte). Also writes an
llm.c token shard DIR/tokens.bin (uint16, vocabulary 256) of TEXT's bytes, and prints the
PyTorch loss of the first K batches of B x S tokens, windows taken as llm.c's loader takes
them (batch k: tokens[k B S .. (k+1) B S + 1)), averaged — what gpt2_train --eval-only prints.

    python3 tests/hf_export.py DIR TEXT B S K
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import gpt2_loss  # noqa: E402  (the same PyTorch-layer GPT-2 as the reference test)

L, H, A, V, P = 2, 32, 4, 256, 64


def write_safetensors(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.uint8: "U8"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    d, text, B, S, K = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    W = {"wte.weight": torch.randn(V, H, generator=g) * 0.3, "wpe.weight": torch.randn(P, H, generator=g) * 0.1}
    shapes = {"ln_1.weight": (H,), "ln_1.bias": (H,), "attn.c_attn.weight": (3 * H, H), "attn.c_attn.bias": (3 * H,),
              "attn.c_proj.weight": (H, H), "attn.c_proj.bias": (H,), "ln_2.weight": (H,), "ln_2.bias": (H,),
              "mlp.c_fc.weight": (4 * H, H), "mlp.c_fc.bias": (4 * H,), "mlp.c_proj.weight": (H, 4 * H), "mlp.c_proj.bias": (H,)}
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
        json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": P, "n_ctx": P,
                   "n_embd": H, "n_layer": L, "n_head": A, "n_inner": None, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5}, f, indent=2)
    data = open(text, "rb").read()
    with open(os.path.join(d, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(data), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(data), *data))
    toks = torch.tensor(list(data), dtype=torch.long)
    cfg = {"L": L, "H": H, "A": A, "B": B, "S": S, "ln_eps": 1e-5, "smoothing": 0.0}
    Wd = {k: t.double() for k, t in W.items()}
    total = 0.0
    with torch.no_grad():
        for k in range(K):
            w = toks[k * B * S: (k + 1) * B * S + 1]
            total += gpt2_loss(cfg, Wd, w[:-1], w[1:]).item()
    print("%.8f" % (total / K))


if __name__ == "__main__":
    main()
