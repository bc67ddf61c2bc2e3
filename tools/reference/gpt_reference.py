#!/usr/bin/env python3
"""Independent reference for weft's gpt2::Model: a tiny GPT written directly in PyTorch (float64, CPU).

It writes tests/fixtures/gpt_reference.bin: the loss, the logits and the gradient of every parameter for
fixed weights and tokens. The weights are not stored: both sides compute them from the closed form
in `weight()` below, element by element in PyTorch's row-major order, with the parameter's index in
`PARAMS`. The architecture matches weft's: pre-LayerNorm blocks, GELU (tanh approximation), learned
position embeddings, an LM head tied to the token embedding, and a fused QKV projection whose
output features are ordered (head, {q, k, v}, head_dim).

File format (little-endian): for each record, a text line "name count\\n" then count float64 values.
Records: "loss" (1), "logits" (B*T*V), then one per parameter in PARAMS order, named as weft names
them (gpt2::Model::for_each_param), holding the gradient.

Usage: python3 tools/reference/gpt_reference.py [output path]
"""
import math
import struct
import sys

import torch

V, T, L, H, C, B = 64, 16, 2, 4, 32, 2
HD = C // H


def param_specs():
    specs = [("wte", (V, C), "normal"), ("wpe", (T, C), "normal")]
    for l in range(L):
        p = f"h{l}"
        specs += [
            (f"{p}.ln1.weight", (C,), "one"), (f"{p}.ln1.bias", (C,), "normal"),
            (f"{p}.attn.qkv.weight", (3 * C, C), "normal"), (f"{p}.attn.qkv.bias", (3 * C,), "normal"),
            (f"{p}.attn.proj.weight", (C, C), "normal"), (f"{p}.attn.proj.bias", (C,), "normal"),
            (f"{p}.ln2.weight", (C,), "one"), (f"{p}.ln2.bias", (C,), "normal"),
            (f"{p}.mlp.fc.weight", (4 * C, C), "normal"), (f"{p}.mlp.fc.bias", (4 * C,), "normal"),
            (f"{p}.mlp.proj.weight", (C, 4 * C), "normal"), (f"{p}.mlp.proj.bias", (C,), "normal"),
        ]
    specs += [("ln_f.weight", (C,), "one"), ("ln_f.bias", (C,), "normal")]
    return specs


PARAMS = param_specs()


def weight(index, kind, i):
    """Element i (row-major) of parameter number `index`: deterministic, varied, O(0.1)."""
    s = 0.15 * math.sin(0.731 * i + 1.37 * index + 0.5) * math.cos(0.117 * i + 0.29 * index)
    return 1.0 + s if kind == "one" else s


def tokens():
    x = [(7 * i + 3 * (i // T) + 1) % V for i in range(B * T)]
    y = [(5 * i + 11 * (i // T) + 2) % V for i in range(B * T)]
    return torch.tensor(x).view(B, T), torch.tensor(y).view(B, T)


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def main(out_path):
    torch.manual_seed(0)
    params = {}
    for index, (name, shape, kind) in enumerate(PARAMS):
        n = math.prod(shape)
        params[name] = torch.tensor([weight(index, kind, i) for i in range(n)], dtype=torch.float64).view(shape)
        params[name].requires_grad_(True)
    x_tok, y_tok = tokens()

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), params[p + ".weight"], params[p + ".bias"], eps=1e-5)

    def linear(x, p):
        return x @ params[p + ".weight"].T + params[p + ".bias"]

    x = params["wte"][x_tok] + params["wpe"][torch.arange(T)]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        p = f"h{l}"
        qkv = linear(ln(x, p + ".ln1"), p + ".attn.qkv").view(B, T, H, 3, HD)
        q, k, v = (qkv[:, :, :, j, :].transpose(1, 2) for j in range(3))  # (B, H, T, HD)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + ".attn.proj")
        x = x + linear(gelu(linear(ln(x, p + ".ln2"), p + ".mlp.fc")), p + ".mlp.proj")
    logits = ln(x, "ln_f") @ params["wte"].T
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), y_tok.view(-1))
    loss.backward()

    with open(out_path, "wb") as f:
        def record(name, values):
            values = values.detach().reshape(-1).tolist()
            f.write(f"{name} {len(values)}\n".encode())
            f.write(struct.pack(f"<{len(values)}d", *values))
        record("loss", loss.reshape(1))
        record("logits", logits)
        for name, _, _ in PARAMS:
            record(name, params[name].grad)
    print(f"wrote {out_path}: loss {loss.item():.17g}, {len(PARAMS)} gradients")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gpt_reference.bin")
