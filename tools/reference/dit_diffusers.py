#!/usr/bin/env python3
"""A diffusers DiTTransformer2DModel in float64 and what it computes, for weft's DiT family
(include/weft/models/dit/): tests/models/dit/diffusers.cpp imports the model directory and checks
the predicted noise and every gradient against the reference, so CI needs neither PyTorch nor
diffusers.

  tools/reference/dit_diffusers.py OUT_DIR      (tests/fixtures/dit_diffusers)

writes
  config.json, diffusion_pytorch_model.safetensors   the model (save_pretrained, F64): 2 blocks,
        4 heads of 8, latents 4 x 8 x 8 in patches of 2 (16 positions), 10 classes; random weights
        everywhere (none at adaLN-Zero's zeros, so that every path carries a gradient). diffusers
        gives each block its own timestep and label embedders (the final layer reads block 0's);
        DiT has one: every block's copy is set to block 0's, as diffusers' conversion of DiT's
        checkpoints does.
  reference.safetensors   the inputs x (3, 4, 8, 8), timestep (3) (integers, as DiT's), labels (3)
        (int64; one the null label 10), target (3, 4, 8, 8); the output "sample" (the predicted
        noise), "loss" = mean((sample - target)^2), and "grad.<name>" for every parameter of the
        directory, the embedders' gradients the sum over the blocks' copies (block 0's names);
        "alphas_cumprod" (1000): diffusers' DDPMScheduler on DiT's linear betas (1e-4 .. 0.02).

In float64 throughout: diffusers computes the timestep features and the position table in
float32; here both are computed in float64 (the same formulas), so that 1e-10 can hold.
"""
import math
import pathlib
import sys

import torch
from diffusers import DDPMScheduler, DiTTransformer2DModel
from diffusers.models.embeddings import get_2d_sincos_pos_embed
from safetensors.torch import save_file


class Timesteps64(torch.nn.Module):
    """diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1) in float64."""

    def forward(self, t):
        half = 128
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float64) / (half - 1)
        emb = t.to(torch.float64)[:, None] * torch.exp(exponent)[None, :]
        return torch.cat([torch.cos(emb), torch.sin(emb)], dim=-1)


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(53)
    model = DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=8, in_channels=4, num_layers=2,
                                  sample_size=8, patch_size=2, num_embeds_ada_norm=10).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 1 else 1.0 / math.sqrt(p.shape[-1] if p.dim() == 2 else p[0].numel()))
        first = model.transformer_blocks[0].norm1.emb
        for b in model.transformer_blocks[1:]:
            b.norm1.emb.load_state_dict(first.state_dict())
        pos = get_2d_sincos_pos_embed(32, 4, base_size=4, interpolation_scale=1.0, output_type="pt")
        model.pos_embed.pos_embed.copy_(pos.to(torch.float64).unsqueeze(0))
    model.save_pretrained(out, safe_serialization=True)
    for b in model.transformer_blocks:
        b.norm1.emb.time_proj = Timesteps64()

    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64)
    target = torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64)
    timestep = torch.tensor([3, 250, 999], dtype=torch.int64)
    labels = torch.tensor([1, 10, 7], dtype=torch.int64)
    model.eval()  # no label dropout: the null label is passed as data
    sample = model(x, timestep=timestep, class_labels=labels).sample
    loss = torch.mean((sample - target) ** 2)
    loss.backward()

    ref = {"x": x, "timestep": timestep, "labels": labels, "target": target, "sample": sample.detach(),
           "loss": loss.detach().reshape(1),
           "alphas_cumprod": DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                                           beta_schedule="linear").alphas_cumprod.to(torch.float64)}
    params = dict(model.named_parameters())
    for name, p in params.items():
        if ".norm1.emb." in name and not name.startswith("transformer_blocks.0."):
            continue
        grad = p.grad.clone()
        if name.startswith("transformer_blocks.0.norm1.emb."):
            rest = name[len("transformer_blocks.0."):]
            for i in range(1, len(model.transformer_blocks)):
                grad += params[f"transformer_blocks.{i}.{rest}"].grad
        ref["grad." + name] = grad
    save_file({k: v.contiguous() for k, v in ref.items()}, str(out / "reference.safetensors"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
