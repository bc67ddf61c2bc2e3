#!/usr/bin/env python3
"""Writes FP8 scaling recipes and scaled GEMMs as PyTorch computes them (torchao's current-scaling
recipes written out in torch, and torch._scaled_mm on the CPU), for weft's fp8::quantize and
fp8::scaled_gemm (include/weft/core/float8_scaling.hpp, tests/core/float8_scaling.cpp).

A recipe's scale of a tensor, or of each row (the GEMM's reduction dim K): amax in float64, scale =
the format's largest / max(amax, 1e-12), as float32, rounded down to a power of two where the recipe
says (torchao's amax_to_scale); q = (x * scale) clamped to the format's range, cast to float8; the
GEMM y = torch._scaled_mm(qx, qw^T, scale_a = 1 / scale_x, scale_b = (1 / scale_w)^T) in float32.

Cases (x (M, K) activations, w (N, K) a weight, normal values with outliers of 20x and a row of tiny
ones, seed 11):
  tensorwise   e4m3 x e4m3, one scale each
  rowwise      e4m3 x e4m3, a scale a row, rounded down to powers of two (torchao's ROWWISE)
  rowwise_exact  the same with exact scales
  hybrid       e5m2 x e4m3 tensorwise (a gradient times a weight, as the backward's GEMMs)

Delayed scaling (Transformer Engine's DelayedScaling, its amax_and_scale_update written out in
torch, float32): a scaler of a history of 4 steps, reduced by max (margin 0) and by the newest
(margin 1), casts 6 tensors (4, 64) in turn to e4m3, the 3rd 50 times the others (its values
saturate: the scale comes from earlier steps) and the 6th all zeros (the scale stays): delayed_<how>.
<step>.q (I32 bytes), .inv (1), .saturated (1), .scale (1: after the step's update).

Blockwise (DeepSeek-V3's): x (8, 256) in 1x128 blocks, w (128, 256) in 128x128 blocks, each block's
scale from its own amax (exact scales), e4m3; the reference GEMM dequantizes both (each block's bytes
times its inverse scale) and multiplies them in float32: blockwise.x, .w, .qx, .qw, .inv_x (8 x 2),
.inv_w (1 x 2), .y.

Writes --out/gemm.safetensors: <case>.x, <case>.w (F32), <case>.qx, <case>.qw (I32: the float8
bytes), <case>.inv_x (M or 1), <case>.inv_w (N or 1), <case>.y (M, N) (F32).

Usage: python3 tools/reference/float8_gemm.py --out tests/fixtures/float8
Needs PyTorch (2.5 or later: _scaled_mm on the CPU) and safetensors.
"""
import argparse
import os

import torch
from safetensors.torch import save_file


def scales(t, dtype, rowwise, pow2):
    amax = (t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()).to(torch.float64)
    s = (torch.finfo(dtype).max / torch.clamp(amax, min=1e-12)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(s))) if pow2 else s


def quantize(t, dtype, rowwise, pow2):
    s = scales(t, dtype, rowwise, pow2)
    m = torch.finfo(dtype).max
    return (t * s).clamp(-m, m).to(dtype), s.reciprocal()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(11)
    M, N, K = 8, 16, 64
    x = torch.randn(M, K) * 3
    x[2, 5], x[6, 40] = 60.0, -75.0
    x[4] *= 1e-4
    w = torch.randn(N, K) * 0.05
    w[3, 7] = 1.2
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    out = {}
    for name, fx, fw, rowwise, pow2 in [("tensorwise", e4, e4, False, False), ("rowwise", e4, e4, True, True),
                                        ("rowwise_exact", e4, e4, True, False), ("hybrid", e5, e4, False, False)]:
        qx, ix = quantize(x, fx, rowwise, pow2)
        qw, iw = quantize(w, fw, rowwise, pow2)
        y = torch._scaled_mm(qx, qw.t(), scale_a=ix, scale_b=iw.t() if rowwise else iw, out_dtype=torch.float32)
        out.update({f"{name}.x": x.clone(), f"{name}.w": w.clone(), f"{name}.qx": qx.view(torch.uint8).to(torch.int32),
                    f"{name}.qw": qw.view(torch.uint8).to(torch.int32), f"{name}.inv_x": ix.reshape(-1),
                    f"{name}.inv_w": iw.reshape(-1), f"{name}.y": y})
    steps = [torch.randn(4, 64) * (50.0 if i == 2 else 1.0) * (0.0 if i == 5 else 1.0) for i in range(6)]
    for how, reduce_max, margin in [("max", True, 0), ("most_recent", False, 1)]:
        history, scale = torch.zeros(4), torch.tensor(1.0)
        fmax = torch.tensor(torch.finfo(e4).max)
        for i, t in enumerate(steps):
            v = t * scale
            q = v.clamp(-fmax, fmax).to(e4)
            history[0] = torch.maximum(history[0], t.abs().amax())
            pre = f"delayed_{how}.{i}"
            out[f"{pre}.x"] = t.clone()
            out[f"{pre}.q"] = q.view(torch.uint8).to(torch.int32)
            out[f"{pre}.inv"] = scale.reciprocal().reshape(1).clone()
            out[f"{pre}.saturated"] = (v.abs() > fmax).sum().to(torch.int32).reshape(1)
            amax = history.max() if reduce_max else history[0]  # TE: amax_compute_algo "max" or "most_recent"
            sf = (fmax / amax) / (2.0 ** margin)
            sf = torch.where(amax > 0.0, sf, scale)
            scale = torch.where(torch.isfinite(amax), sf, scale)
            history = torch.roll(history, -1, 0)
            history[0] = 0.0
            out[f"{pre}.scale"] = scale.reshape(1).clone()
    xb = torch.randn(8, 256) * 2
    xb[1, 200] = 40.0
    wb = torch.randn(128, 256) * 0.05

    def blocks(t, br, bc):
        R, C = t.shape
        tb = t.reshape(R // br, br, C // bc, bc)
        amax = tb.abs().amax(dim=(1, 3)).to(torch.float64)  # (R / br, C / bc)
        s = (torch.finfo(e4).max / torch.clamp(amax, min=1e-12)).to(torch.float32)
        m = torch.finfo(e4).max
        q = (tb * s[:, None, :, None]).clamp(-m, m).to(e4).reshape(R, C)
        inv = s.reciprocal()
        deq = (q.float().reshape(R // br, br, C // bc, bc) * inv[:, None, :, None]).reshape(R, C)
        return q, inv, deq

    qxb, ixb, dxb = blocks(xb, 1, 128)
    qwb, iwb, dwb = blocks(wb, 128, 128)
    out.update({"blockwise.x": xb, "blockwise.w": wb, "blockwise.qx": qxb.view(torch.uint8).to(torch.int32),
                "blockwise.qw": qwb.view(torch.uint8).to(torch.int32), "blockwise.inv_x": ixb.reshape(-1),
                "blockwise.inv_w": iwb.reshape(-1), "blockwise.y": dxb @ dwb.t()})
    os.makedirs(a.out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(a.out, "gemm.safetensors"))
    print(f"{len(out)} tensors into {a.out}/gemm.safetensors (torch {torch.__version__})")


if __name__ == "__main__":
    main()
