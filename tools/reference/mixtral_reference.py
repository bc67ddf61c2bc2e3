#!/usr/bin/env python3
"""Writes a small random Mixtral (transformers' MixtralForCausalLM) and what it computes, in float64,
for weft's check against transformers (tests/models/mixtral/model.cpp).

The model: 2 layers, width 16, 4 heads over 2 key-value heads, 4 experts of hidden width 8 with
the top 2 renormalised (Mixtral's router), an untied head, RMSNorm weights drawn around 1. As
tools/reference/llama_reference.py does, the rotary frequencies and tables, RMSNorm and the eager
attention's softmax are lifted to float64, and so is the router's softmax (transformers takes it in float32), so
that the comparison can be held to 1e-10.

The loss: the mean cross-entropy of the targets plus, for each layer, 0.02 times its load-balancing
loss and 0.001 times its z-loss, from the router logits transformers returns
(output_router_logits): aux_l = E sum_e f_e P_e (f_e: the slots routed to expert e over the tokens,
P_e: the mean of e's probability over the tokens) and z_l = the mean over tokens of
logsumexp(logits)^2. That is weft's per-layer form (as Megatron-Core's); transformers' own
aux_loss pools the statistics of all layers before the product, and is written beside it
("hf_aux") for the record.

Writes --out/reference.safetensors, every tensor F64 (I64 for tokens and targets) under weft's
names and in weft's layout (models/mixtral/model.hpp), so the test loads it without an importer:
  tokens, targets (B, T); logits (B, T, V); loss (1): the cross-entropy; aux, z (L): each layer's;
  hf_aux (1); value/<name> and grad/<name> for every parameter: wte (V, C),
  layers.<l>.attn_norm.weight, layers.<l>.attn.qkv.weight (KV (g + 2) hd, C: per key-value group
  its g query heads, then its key and value heads), layers.<l>.attn.proj.weight,
  layers.<l>.mlp_norm.weight, layers.<l>.mlp.router.weight (E, C), layers.<l>.mlp.experts.gate_up
  (E, 2H, C: row 2f the gate of feature f, 2f + 1 its up), layers.<l>.mlp.experts.down (E, C, H),
  ln_f.weight, lm_head (V, C).

And --out/hf/: the model as save_pretrained writes it (config.json, model.safetensors in float64:
block_sparse_moe.experts.<e>.w1/w2/w3), for tests/models/mixtral/hf.cpp.

Usage: python3 tools/reference/mixtral_reference.py --out tests/fixtures/mixtral
Needs PyTorch, transformers (5.x) and safetensors.
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral import modeling_mixtral as mm

from llama_reference import attention_f64, rms_norm_f64, rotary_f64  # the same lifts as Llama's
from moe_block import AUX, Z, router_losses



def router_f64(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    return logits, top / top.sum(dim=-1, keepdim=True), idx


def weft_tensors(model, c, grad):
    """Every parameter (or its gradient) under weft's name and layout."""
    get = (lambda p: p.grad) if grad else (lambda p: p.detach())
    m = model.model
    H, KV, hd = c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads
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
        out[f"layers.{l}.attn.proj.weight"] = get(a.o_proj.weight)
        out[f"layers.{l}.mlp_norm.weight"] = get(layer.post_attention_layernorm.weight)
        out[f"layers.{l}.mlp.router.weight"] = get(layer.mlp.gate.weight)
        gu = get(layer.mlp.experts.gate_up_proj)  # (E, 2F, C): the F gate rows, then the F up rows
        E, F2, C = gu.shape
        out[f"layers.{l}.mlp.experts.gate_up"] = gu.reshape(E, 2, F2 // 2, C).transpose(1, 2).reshape(E, F2, C)
        out[f"layers.{l}.mlp.experts.down"] = get(layer.mlp.experts.down_proj)  # (E, C, F)
    return {n: t.contiguous().clone() for n, t in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    c = MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                      num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False, initializer_range=0.3,
                      router_jitter_noise=0.0, output_router_logits=True)
    c._attn_implementation = "eager"
    c._experts_implementation = "eager"  # the loop over experts (grouped_mm takes no float64)
    model = MixtralForCausalLM(c).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "experts" in name or "gate.weight" in name:
                p.normal_(0.0, 0.3)
    mm.MixtralRMSNorm.forward = rms_norm_f64
    mm.MixtralRotaryEmbedding.forward = rotary_f64
    mm.eager_attention_forward = attention_f64
    mm.MixtralTopKRouter.forward = router_f64
    hd = c.hidden_size // c.num_attention_heads  # the rotary frequencies in float64 (transformers': float32)
    model.model.rotary_emb.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    model.train()

    B, T = 4, 8
    tokens = torch.randint(0, c.vocab_size, (B, T + 1), dtype=torch.int64)
    x, y = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    out = model(input_ids=x, output_router_logits=True)
    logits = out.logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1))
    k, E = c.num_experts_per_tok, c.num_local_experts
    aux, z = zip(*(router_losses(r, torch.topk(torch.softmax(r, dim=-1), k, dim=-1)[1], E) for r in out.router_logits))
    aux, z = torch.stack(aux), torch.stack(z)
    loss = ce + AUX * aux.sum() + Z * z.sum()
    loss.backward()

    ref = {"tokens": x, "targets": y, "logits": logits.detach().contiguous(), "loss": ce.detach().reshape(1),
           "aux": aux.detach(), "z": z.detach(), "hf_aux": out.aux_loss.detach().reshape(1)}
    for n, t in weft_tensors(model, c, False).items():
        ref["value/" + n] = t
    for n, t in weft_tensors(model, c, True).items():
        ref["grad/" + n] = t
    os.makedirs(a.out, exist_ok=True)
    save_file(ref, os.path.join(a.out, "reference.safetensors"))
    # The same model as save_pretrained writes it (float64), for the importer and the exporter
    # (models/mixtral/hf.hpp): config.json and model.safetensors under hf/.
    model.config.output_router_logits = False
    model.save_pretrained(os.path.join(a.out, "hf"))
    print(f"cross-entropy {ce.item():.17g}, aux {aux.tolist()}, z {z.tolist()}, transformers' pooled aux "
          f"{out.aux_loss.item():.6f}; {len(ref)} tensors into {a.out}")


if __name__ == "__main__":
    main()
