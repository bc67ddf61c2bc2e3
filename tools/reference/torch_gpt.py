#!/usr/bin/env python3
"""PyTorch eager training steps of weft's GPT (the side-by-side benchmark's reference).

The same architecture as weft's gpt2::Model (pre-LayerNorm blocks, fused QKV, GELU tanh, learned
positions, LM head tied to the token embedding, vocabulary padded like weft's at tensor degree 1:
not at all), written plainly in eager PyTorch with scaled_dot_product_attention (causal), f32,
AdamW (foreach, the default; --fused for the fused one), gradient clipping at 1.0. Prints one JSON
object: the median step time and tokens/s over --steps steps after 2 warm-up steps, on --threads
threads (torch.set_num_threads).

Usage: torch_gpt.py --layers 12 --width 768 --heads 12 --seq 64 --vocab 50257 --batch 4 --threads 2
"""
import argparse
import sys

import torch
import torch.nn.functional as F

from torch_steps import timed_steps


class Block(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = torch.nn.LayerNorm(C)
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.proj = torch.nn.Linear(C, C)
        self.ln2 = torch.nn.LayerNorm(C)
        self.fc = torch.nn.Linear(C, 4 * C)
        self.fc2 = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, self.H, 3, C // self.H).unbind(3)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(T, C)
        self.blocks = torch.nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 12), ("width", 768), ("heads", 12), ("seq", 64), ("vocab", 50257), ("batch", 4),
                          ("threads", 1), ("steps", 5)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--fused", action="store_true", help="fused AdamW")
    a = ap.parse_args()
    if min(a.layers, a.width, a.heads, a.seq, a.vocab, a.batch, a.threads, a.steps) < 1 or a.width % a.heads:
        sys.exit("torch_gpt.py: sizes must be >= 1 and the width a multiple of the heads")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt(a.vocab, a.seq, a.layers, a.heads, a.width)
    timed_steps(model, a, {"layers": a.layers, "width": a.width, "heads": a.heads, "seq": a.seq, "vocab": a.vocab})

if __name__ == "__main__":
    main()
