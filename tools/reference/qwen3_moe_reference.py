#!/usr/bin/env python3
"""Writes a small random Qwen3-MoE (transformers' Qwen3MoeForCausalLM) and what it computes, in
float64, for weft's check against transformers (tests/models/qwen3_moe/model.cpp).

The model: 2 layers, width 16, 4 heads over 2 key-value heads of head_dim 8 (not width / heads: the
attention's width is 32), each head's queries and keys RMS-normalised before the rotation (q_norm,
k_norm), 4 experts of hidden width 8 with the top 2 not renormalised (norm_topk_prob false, the
config's default), an untied head, every norm weight drawn around 1. As
tools/reference/mixtral_reference.py does, the rotary frequencies and tables, RMSNorm, the eager
attention's softmax and the router's softmax are lifted to float64, so that the comparison can be
held to 1e-10.

The loss: the mean cross-entropy plus, for each layer, 0.02 times its load-balancing loss and 0.001
times its z-loss (weft's per-layer form; moe_block.py's router_losses), as the Mixtral reference.

With --dense-layers (as tests/fixtures/qwen3_moe/dense is written: --dense-layers 1 --layers 3):
those layers dense (mlp_only_layers), each a SwiGLU MLP of intermediate_size 24 (Qwen3MoeMLP), the
others' experts as above; aux and z hold the sparse layers' only, in order.

Writes --out/reference.safetensors, every tensor F64 (I64 for tokens and targets) under weft's names
and layout (models/qwen3_moe/model.hpp): tokens, targets (B, T); logits (B, T, V); loss (1): the
cross-entropy; aux, z (L); value/<name> and grad/<name> for every parameter: wte (V, C),
layers.<l>.attn_norm.weight, layers.<l>.attn.qkv.weight (KV (g + 2) hd, C), layers.<l>.attn.q_norm.weight
(hd), layers.<l>.attn.k_norm.weight (hd), layers.<l>.attn.proj.weight (C, H hd),
layers.<l>.mlp_norm.weight, layers.<l>.mlp.router.weight (E, C), layers.<l>.mlp.experts.gate_up
(E, 2H, C: row 2f the gate of feature f, 2f + 1 its up), layers.<l>.mlp.experts.down (E, C, H), or a dense layer's layers.<l>.mlp.gate_up.weight (2F, C:
row 2f the gate of feature f, 2f + 1 its up) and layers.<l>.mlp.down.weight (C, F),
ln_f.weight, lm_head (V, C); and --out/hf/: the model as save_pretrained writes it (float64).

Usage: python3 tools/reference/qwen3_moe_reference.py --out tests/fixtures/qwen3_moe
       python3 tools/reference/qwen3_moe_reference.py --dense-layers 1 --layers 3 --out tests/fixtures/qwen3_moe/dense
Needs PyTorch, transformers (5.x) and safetensors.
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

from llama_reference import attention_f64, rms_norm_f64, rotary_f64  # the same lifts as Llama's
from moe_block import AUX, Z, router_losses


def router_f64(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, idx


def weft_tensors(model, c, grad):
    """Every parameter (or its gradient) under weft's name and layout."""
    get = (lambda p: p.grad) if grad else (lambda p: p.detach())
    m = model.model
    H, KV, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    g = H // KV
    out = {"wte": get(m.embed_tokens.weight), "ln_f.weight": get(m.norm.weight), "lm_head": get(model.lm_head.weight)}
    for l, layer in enumerate(m.layers):
        a = layer.self_attn
        q, k, v = get(a.q_proj.weight), get(a.k_proj.weight), get(a.v_proj.weight)
        rows = []
        for j in range(KV):
            rows += [q[(j * g + i) * hd:(j * g + i + 1) * hd] for i in range(g)]
            rows += [k[j * hd:(j + 1) * hd], v[j * hd:(j + 1) * hd]]
        out[f"layers.{l}.attn_norm.weight"] = get(layer.input_layernorm.weight)
        out[f"layers.{l}.attn.qkv.weight"] = torch.cat(rows)
        out[f"layers.{l}.attn.q_norm.weight"] = get(a.q_norm.weight)
        out[f"layers.{l}.attn.k_norm.weight"] = get(a.k_norm.weight)
        out[f"layers.{l}.attn.proj.weight"] = get(a.o_proj.weight)
        out[f"layers.{l}.mlp_norm.weight"] = get(layer.post_attention_layernorm.weight)
        if isinstance(layer.mlp, qm.Qwen3MoeMLP):  # a dense layer: weft's gate_up pairs (gate f, up f)
            gate, up = get(layer.mlp.gate_proj.weight), get(layer.mlp.up_proj.weight)
            out[f"layers.{l}.mlp.gate_up.weight"] = torch.stack([gate, up], dim=1).reshape(-1, gate.shape[1])
            out[f"layers.{l}.mlp.down.weight"] = get(layer.mlp.down_proj.weight)
            continue
        out[f"layers.{l}.mlp.router.weight"] = get(layer.mlp.gate.weight)
        gu = get(layer.mlp.experts.gate_up_proj)  # (E, 2F, C): the F gate rows, then the F up rows
        E, F2, C = gu.shape
        out[f"layers.{l}.mlp.experts.gate_up"] = gu.reshape(E, 2, F2 // 2, C).transpose(1, 2).reshape(E, F2, C)
        out[f"layers.{l}.mlp.experts.down"] = get(layer.mlp.experts.down_proj)  # (E, C, F)
    return {n: t.contiguous().clone() for n, t in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dense-layers", type=int, nargs="*", default=[], help="mlp_only_layers")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    c = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
                       num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=a.dense_layers,
                       tie_word_embeddings=False, initializer_range=0.3, output_router_logits=True)
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"  # the loop over experts (grouped_mm takes no float64)
    model = Qwen3MoeForCausalLM(c).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "experts" in name or "gate.weight" in name:
                p.normal_(0.0, 0.3)
    qm.Qwen3MoeRMSNorm.forward = rms_norm_f64
    qm.Qwen3MoeRotaryEmbedding.forward = rotary_f64
    qm.eager_attention_forward = attention_f64
    qm.Qwen3MoeTopKRouter.forward = router_f64
    hd = c.head_dim  # the rotary frequencies in float64 (transformers': float32)
    model.model.rotary_emb.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    model.train()

    B, T = 4, 8
    tokens = torch.randint(0, c.vocab_size, (B, T + 1), dtype=torch.int64)
    x, y = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    out = model(input_ids=x, output_router_logits=True)
    logits = out.logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1))
    k, E = c.num_experts_per_tok, c.num_experts
    aux, z = zip(*(router_losses(r, torch.topk(torch.softmax(r, dim=-1), k, dim=-1)[1], E) for r in out.router_logits))
    aux, z = torch.stack(aux), torch.stack(z)
    loss = ce + AUX * aux.sum() + Z * z.sum()
    loss.backward()

    ref = {"tokens": x, "targets": y, "logits": logits.detach().contiguous(), "loss": ce.detach().reshape(1),
           "aux": aux.detach(), "z": z.detach()}
    for n, t in weft_tensors(model, c, False).items():
        ref["value/" + n] = t
    for n, t in weft_tensors(model, c, True).items():
        ref["grad/" + n] = t
    os.makedirs(a.out, exist_ok=True)
    save_file(ref, os.path.join(a.out, "reference.safetensors"))
    model.config.output_router_logits = False
    model.save_pretrained(os.path.join(a.out, "hf"))
    print(f"cross-entropy {ce.item():.17g}, aux {aux.tolist()}, z {z.tolist()}; {len(ref)} tensors into {a.out}")


if __name__ == "__main__":
    main()
