#!/usr/bin/env python3
"""Fixtures for weft's DiT embeddings (include/weft/models/dit/embeddings.hpp) from diffusers' own
functions (PyPI diffusers, the module DiTTransformer2DModel builds on), written as record files
(tools/records.py) that tests/models/dit/embeddings.cpp reads, so that CI checks them without
PyTorch or diffusers.

  tools/reference/dit_reference.py OUT_DIR

writes
  dit_sincos_2d.bin    one f64 sample (H W, D) = get_2d_sincos_pos_embed(D = 32, grid 4 x 4,
                       base_size 4, interpolation_scale 1): DiT's positions for 4 x 4 patches
  dit_timesteps.bin    one f64 sample (5, 256) = get_timestep_embedding(t, 256,
                       flip_sin_to_cos=True, downscale_freq_shift=1) at t = 0, 1, 17.5, 250, 999
                       (diffusers computes these in float32: the test allows float's rounding)
"""
import pathlib
import sys

import torch
from diffusers.models.embeddings import get_2d_sincos_pos_embed, get_timestep_embedding

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import records  # noqa: E402  (tools/records.py)

TIMESTEPS = [0.0, 1.0, 17.5, 250.0, 999.0]


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pos = get_2d_sincos_pos_embed(32, 4, base_size=4, interpolation_scale=1.0, output_type="pt")
    pos = pos.to(torch.float64).reshape(-1).tolist()
    records.write(out / "dit_sincos_2d.bin", "f64", (16, 32), pos)
    t = torch.tensor(TIMESTEPS, dtype=torch.float64)
    emb = get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=1)
    records.write(out / "dit_timesteps.bin", "f64", (len(TIMESTEPS), 256), emb.to(torch.float64).reshape(-1).tolist())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
