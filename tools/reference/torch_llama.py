#!/usr/bin/env python3
"""PyTorch eager training steps of weft's Llama (the side-by-side benchmark's reference).

The same architecture as weft's llama::Model (pre-RMSNorm blocks, rotary positions with theta
500000 on q and k, grouped-query attention with --kv-heads key-value heads, a SwiGLU MLP of
--hidden units, no biases, an untied LM head), written plainly in eager PyTorch with
scaled_dot_product_attention (causal; key-value heads expanded to the query heads), f32, AdamW
(foreach, the default; --fused for the fused one), gradient clipping at 1.0. Prints one JSON
object: the median step time and tokens/s over --steps steps after 2 warm-up steps, on --threads
threads (torch.set_num_threads).

--experts E --top-k k: Mixtral's blocks instead (weft's mixtral::Model): the MLP a mixture of E
SwiGLU experts of --hidden units, a linear router (softmax, the top k renormalised), each expert run
on the tokens routed to it (index_select, then index_add_ of the weighted outputs, as transformers'
eager Mixtral loops over experts), and 0.01 times each layer's load-balancing loss E sum_e f_e P_e
added to the loss (weft's default aux coefficient for mixtral-tiny; the same math as weft's).

Usage: torch_llama.py --layers 4 --width 256 --heads 8 --kv-heads 2 --hidden 688 --seq 128 --vocab 256 --batch 8
       [--experts 8 --top-k 2]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

from torch_steps import timed_steps


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, cos, sin):  # x (B, heads, T, hd): the halves rotated, as transformers' rotate_half
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Moe(torch.nn.Module):
    """E SwiGLU experts of Fh units, the top k of a softmax router renormalised; the aux loss kept."""

    def __init__(self, C, Fh, E, k):
        super().__init__()
        self.E, self.k = E, k
        self.router = torch.nn.Linear(C, E, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(E, 2 * Fh, C) * 0.02)
        self.down = torch.nn.Parameter(torch.randn(E, C, Fh) * 0.02)
        self.aux = torch.zeros(())

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)
        probs = torch.softmax(self.router(h), dim=-1)
        top, idx = torch.topk(probs, self.k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        counts = torch.zeros(self.E).index_add_(0, idx.reshape(-1), torch.ones(idx.numel()))
        self.aux = self.E * (counts / h.shape[0] * probs.mean(0)).sum()
        y = torch.zeros_like(h)
        for e in range(self.E):
            token, slot = torch.where(idx == e)
            if token.numel() == 0:
                continue
            gate, up = F.linear(h.index_select(0, token), self.gate_up[e]).chunk(2, dim=-1)
            out = F.linear(F.silu(gate) * up, self.down[e])
            y.index_add_(0, token, out * top[token, slot].unsqueeze(-1))
        return y.view(B, T, C)


class Block(torch.nn.Module):
    gqa = False  # key-value heads expanded by repeat_interleave; True: SDPA's enable_gqa

    def __init__(self, C, H, KV, Fh, E=0, k=0):
        super().__init__()
        self.moe = Moe(C, Fh, E, k) if E > 0 else None
        self.H, self.KV, self.hd = H, KV, C // H
        self.norm1 = torch.nn.Parameter(torch.ones(C))
        self.norm2 = torch.nn.Parameter(torch.ones(C))
        self.q = torch.nn.Linear(C, C, bias=False)
        self.kv = torch.nn.Linear(C, 2 * KV * self.hd, bias=False)
        self.o = torch.nn.Linear(C, C, bias=False)
        if E == 0:
            self.gate_up = torch.nn.Linear(C, 2 * Fh, bias=False)
            self.down = torch.nn.Linear(Fh, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = rms_norm(x, self.norm1)
        q = self.q(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k, v = self.kv(h).view(B, T, 2, self.KV, self.hd).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.gqa:  # SDPA's own grouped-query path (PyTorch >= 2.5; the GPU benchmark's choice)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.H // self.KV
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        if self.moe is not None:
            return x + self.moe(rms_norm(x, self.norm2))
        gate, up = self.gate_up(rms_norm(x, self.norm2)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(torch.nn.Module):
    def __init__(self, V, T, L, H, KV, C, Fh, theta=500000.0, E=0, k=0):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.blocks = torch.nn.ModuleList(Block(C, H, KV, Fh, E, k) for _ in range(L))
        self.norm = torch.nn.Parameter(torch.ones(C))
        self.head = torch.nn.Linear(C, V, bias=False)
        hd = C // H
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = self.head(rms_norm(x, self.norm))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        for b in self.blocks:
            if b.moe is not None:
                loss = loss + 0.01 * b.moe.aux
        return loss


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 4), ("width", 256), ("heads", 8), ("kv-heads", 2), ("hidden", 688), ("seq", 128),
                          ("vocab", 256), ("batch", 8), ("threads", 1), ("steps", 5)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--fused", action="store_true", help="fused AdamW")
    ap.add_argument("--experts", type=int, default=0, help="Mixtral's blocks: a mixture of this many experts")
    ap.add_argument("--top-k", type=int, default=2)
    a = ap.parse_args()
    if a.experts and not 1 <= a.top_k <= a.experts:
        sys.exit("torch_llama.py: --top-k from 1 to --experts")
    if (min(a.layers, a.width, a.heads, a.kv_heads, a.hidden, a.seq, a.vocab, a.batch, a.threads, a.steps) < 1
            or a.width % a.heads or a.heads % a.kv_heads or (a.width // a.heads) % 2):
        sys.exit("torch_llama.py: sizes must be >= 1, the width a multiple of the heads (an even head size), "
                 "the heads a multiple of the key-value heads")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a.vocab, a.seq, a.layers, a.heads, a.kv_heads, a.width, a.hidden, E=a.experts, k=a.top_k)
    sizes = {"model": "mixtral" if a.experts else "llama", "layers": a.layers, "width": a.width, "heads": a.heads,
             "kv_heads": a.kv_heads, "hidden": a.hidden, "seq": a.seq, "vocab": a.vocab}
    if a.experts:
        sizes.update(experts=a.experts, top_k=a.top_k)
    timed_steps(model, a, sizes)

if __name__ == "__main__":
    main()
