#!/usr/bin/env python3
"""Writes a small random Llama (transformers' LlamaForCausalLM) and what it computes, in float64, for
weft's check against transformers (tests/models/llama/hf.cpp).

The model has grouped-query attention (4 heads over 2 key-value heads), the llama3 rotary scaling
with an original context short enough that all three frequency bands occur, an untied head (or with
--tied, the head reading the embedding table: tie_word_embeddings, as Llama 3.2 1B's) and RMSNorm weights drawn around 1 (not all ones). transformers computes the rotary tables, RMSNorm and
the eager attention's softmax in float32 even in a float64 model (about 1e-6 off in the logits);
this script lifts all three to float64 (the rotary frequencies recomputed from transformers' llama3
formula in float64, the norm's statistics and the softmax in the model's dtype), so that the
comparison can be held to 1e-10.

Writes into --out:
  config.json, model.safetensors   the model, as save_pretrained writes it (float64)
  reference.safetensors            tokens and targets (B, T) I64, logits (B, T, V) F64, loss (1) F64,
                                   and grad/<name> F64: the gradient of the mean cross-entropy of
                                   the targets for every parameter, under transformers' names (a
                                   tied table's is the sum of its two uses, under
                                   model.embed_tokens.weight)

Usage: python3 tools/reference/llama_reference.py --out tests/fixtures/llama_hf
       python3 tools/reference/llama_reference.py --out tests/fixtures/llama_hf_tied --seed 13 --tied
Needs PyTorch, transformers and safetensors.
"""
import argparse
import math
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama


def llama3_inv_freq(theta, dim, factor, low, high, original):
    """transformers' _compute_llama3_parameters, in float64."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rms_norm_f64(self, x):
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def rotary_f64(self, x, position_ids):
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager attention with the softmax in the inputs' dtype (it takes float32)."""
    key = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tied", action="store_true", help="tie the LM head to the embedding table")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rope = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_parameters=rope,
                         tie_word_embeddings=a.tied, attention_bias=False, mlp_bias=False, initializer_range=0.2)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    modeling_llama.LlamaRMSNorm.forward = rms_norm_f64
    modeling_llama.LlamaRotaryEmbedding.forward = rotary_f64
    modeling_llama.eager_attention_forward = attention_f64
    hd = config.hidden_size // config.num_attention_heads
    model.model.rotary_emb.inv_freq = llama3_inv_freq(rope["rope_theta"], hd, rope["factor"], rope["low_freq_factor"],
                                                      rope["high_freq_factor"], rope["original_max_position_embeddings"])

    B, T = 2, 16
    tokens = torch.randint(0, config.vocab_size, (B, T + 1), dtype=torch.int64)
    x, y = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
    logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), y.reshape(-1))
    loss.backward()

    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    ref = {"tokens": x, "targets": y, "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        ref["grad/" + name] = p.grad.detach().contiguous()
    save_file(ref, os.path.join(a.out, "reference.safetensors"))
    print(f"loss {loss.item():.17g}, {len(ref) - 4} gradients, into {a.out}")


if __name__ == "__main__":
    main()
