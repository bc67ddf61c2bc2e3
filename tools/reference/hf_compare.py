#!/usr/bin/env python3
"""Compares weft's logits with Hugging Face transformers' GPT2LMHeadModel on the same weights.

weft-export writes a weft checkpoint (any mesh, strategy, precision) as a Hugging Face GPT-2
safetensors file with its config.json, and the logits weft computes from it (one host rank, f32) for
given tokens. This script loads that file with `safetensors` and `transformers`, runs the same tokens
and compares the logits. It needs PyTorch, transformers and safetensors (pip install torch
transformers safetensors); it is not part of the default test tier.

Usage:
  python3 tools/reference/hf_compare.py --export build/dev/examples/weft-export --checkpoint runs/a
Exit status 0 when the largest difference is within --tolerance (default 1e-4 of the largest |logit|:
both sides compute in f32, in different orders).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True, help="the weft-export binary")
    ap.add_argument("--checkpoint", required=True, help="a weft checkpoint directory")
    ap.add_argument("--tokens", type=int, default=0, help="how many tokens (default: the model's sequence length)")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        st = os.path.join(d, "model.safetensors")
        subprocess.run([a.export, "--checkpoint", a.checkpoint, "--out", st], check=True, stdout=subprocess.DEVNULL)
        config = GPT2Config.from_pretrained(d)
        n = a.tokens or config.n_positions
        ids = [(7 * i + 3) % config.vocab_size for i in range(n)]
        logits_path = os.path.join(d, "logits.f32")
        subprocess.run([a.export, "--checkpoint", a.checkpoint, "--out", st, "--tokens", ",".join(map(str, ids)),
                        "--logits", logits_path], check=True, stdout=subprocess.DEVNULL)
        weft = np.fromfile(logits_path, dtype="<f4").reshape(n, config.vocab_size)

        # The file as safetensors reads it, into transformers' model (lm_head tied to wte).
        state = load_file(st)
        model = GPT2LMHeadModel(config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("attn.bias") and not k.endswith("attn.masked_bias") and k != "lm_head.weight"]
        if missing or unexpected:
            print(f"the export does not match GPT2LMHeadModel: missing {missing}, unexpected {unexpected}")
            return 1
        model.tie_weights()
        model.eval()
        with torch.no_grad():
            hf = model(torch.tensor([ids])).logits[0].float().numpy()

    diff = np.abs(hf - weft).max()
    scale = np.abs(hf).max()
    print(f"{n} tokens, vocab {config.vocab_size}, {config.n_layer} layers, width {config.n_embd}, {config.n_head} heads: "
          f"max |weft - transformers| = {diff:.3e} (max |logit| {scale:.3f}, relative {diff / scale:.3e}; "
          f"tolerance {a.tolerance:.0e})")
    return 0 if diff <= a.tolerance * scale else 1


if __name__ == "__main__":
    sys.exit(main())
