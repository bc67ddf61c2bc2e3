#!/usr/bin/env python3
"""weft's host training step beside PyTorch eager, same model, same machine, interleaved runs.

For GPT-2 124M (B=4, T=64) and a small model (4 layers, width 256, 4 heads, T=128, V=256, B=8), a
mixture of experts (mixtral-small: llama-small's blocks with 8 SwiGLU experts of 688, the top 2; on 2
threads also its experts over data 2 x expert 2), and two Llamas (llama-small: 4 layers, width 256, 8 heads in 2 key-value groups, SwiGLU of 688, T=128,
V=256, B=8; llama-wide: 2 layers, width 768, 12 heads in 4 groups, SwiGLU of 2048, T=64, V=32000,
B=4; llama-100m: the same widths over 8 layers, 99.5M parameters; llama-tiny: the trainer's preset,
B=16), on 1 and 2 threads: weft's benchmarks/train_step (1 thread: one rank; 2 threads: data 2 or
tensor 2 ranks, or one rank on 2 threads; the fastest counts) and tools/reference/torch_gpt.py or
torch_llama.py (torch.set_num_threads), alternating, --reps times each; medians. Prints one JSON object per model
and thread count: tokens/s of each, effective GFLOP/s (the FLOPs per token weft counts, train_step's
"flops_per_token": 6 N + 12 L C T for GPT-2, the same for both sides), the ratio weft / PyTorch,
and weft's share of the step outside GEMMs. Without PyTorch it says so and exits 0.

--avx2 compares both sides on AVX2 code only, on a machine that also has AVX-512: PyTorch with
ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2 and DNNL_MAX_CPU_ISA=AVX2; OpenBLAS with
OPENBLAS_CORETYPE=Haswell; and weft's own ops from a train_step compiled without AVX-512 (refused
otherwise), for example:
  cmake --preset release -B build/release-avx2 -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DWEFT_ENABLE_CUDA=OFF
  cmake --build build/release-avx2 --target train_step
  benchmarks/vs_pytorch.py --avx2 --train-step build/release-avx2/benchmarks/train_step

Usage: benchmarks/vs_pytorch.py [--train-step build/release/benchmarks/train_step] [--reps 3] [--only llama-small] [--avx2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
MODELS = {
    "gpt2-124m": dict(layers=12, width=768, heads=12, seq=64, vocab=50257, batch=4, steps=3),
    "small": dict(layers=4, width=256, heads=4, seq=128, vocab=256, batch=8, steps=8),
    "llama-small": dict(model="llama", layers=4, width=256, heads=8, kv_heads=2, hidden=688, seq=128, vocab=256, batch=8,
                        steps=8),
    "llama-wide": dict(model="llama", layers=2, width=768, heads=12, kv_heads=4, hidden=2048, seq=64, vocab=32000, batch=4,
                       steps=3),
    # 99.5M parameters: llama-wide's widths over 8 layers (the embedding and head are 49.2M of them)
    "llama-100m": dict(model="llama", layers=8, width=768, heads=12, kv_heads=4, hidden=2048, seq=64, vocab=32000, batch=4,
                       steps=2),
    # a mixture of experts (issue 54's benchmark): llama-small's blocks with 8 SwiGLU experts of 688, the
    # top 2 (weft's mixtral::Model; torch_llama.py --experts: the same math, a loop over experts)
    "mixtral-small": dict(model="mixtral", layers=4, width=256, heads=8, kv_heads=2, hidden=688, seq=128, vocab=256,
                          batch=8, experts=8, top_k=2, steps=6),
    # the trainer's llama-tiny preset (models/llama/config.hpp) at its batch of 16
    "llama-tiny": dict(model="llama", layers=2, width=64, heads=4, kv_heads=2, hidden=176, seq=64, vocab=64, batch=16,
                       steps=20),
}


def cpu():
    """This machine's CPU as /proc/cpuinfo names it, with its family and model numbers."""
    try:
        info = dict(l.split(":", 1) for l in open("/proc/cpuinfo").read().split("\n\n")[0].splitlines() if ":" in l)
        info = {k.strip(): v.strip() for k, v in info.items()}
        return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    except OSError:
        return "unknown"


def run(cmd, may_refuse=False):
    """The command's last JSON line; None when may_refuse and it refused its options (exit 2)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 2 and may_refuse:
        print(f"vs_pytorch: skipped {' '.join(cmd[-2:])}: {p.stderr.strip()}", file=sys.stderr)
        return None
    if p.returncode != 0:
        sys.exit(f"vs_pytorch: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-step", default=os.path.join(here, "..", "build", "release", "benchmarks", "train_step"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--avx2", action="store_true", help="both sides on AVX2 code only (see above)")
    a = ap.parse_args()
    if a.avx2:  # read when the libraries load: set before importing torch and before any run
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", DNNL_MAX_CPU_ISA="AVX2",
                          OPENBLAS_CORETYPE="Haswell")
    try:
        import torch
    except ImportError:
        print("vs_pytorch: PyTorch is not installed (pip install torch); nothing compared")
        return 0
    for name, m in MODELS.items():
        if a.only and name != a.only:
            continue
        reference = os.path.join(here, "..", "tools", "reference",
                                 "torch_llama.py" if m.get("model") in ("llama", "mixtral") else "torch_gpt.py")
        sizes = [f"--{k.replace('_', '-')}={v}" for k, v in m.items() if k != "model"]
        for threads in (1, 2):
            # (data, tensor, op threads): on 2 threads, two thread ranks or one rank on 2 threads
            layouts = [(1, 1, 1)] if threads == 1 else [(2, 1, 1), (1, 2, 1), (1, 1, 2)]
            if m.get("model") == "mixtral" and threads == 2:  # and the experts over the two data ranks
                layouts.append((2, 1, 1, 2))
            weft = {l: [] for l in layouts}
            torch_s, share = [], {l: [] for l in layouts}
            library = simd = flops = None
            for _ in range(a.reps):
                for l in list(layouts):
                    r = run([a.train_step, *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in m.items()), []), "--data", str(l[0]),
                             "--tensor", str(l[1]), "--threads", str(l[2]), *(["--expert", str(l[3])] if len(l) > 3 else [])],
                            may_refuse=l[2] > 1)
                    if r is None:
                        layouts.remove(l)
                        continue
                    weft[l].append(r["tokens_per_s"])
                    share[l].append(r["share_outside_gemm"])
                    library, simd, flops = r["gemm_library"], r["simd"], r["flops_per_token"]
                    if a.avx2 and simd != "avx2":
                        sys.exit(f"vs_pytorch: --avx2 needs a train_step compiled for AVX2 without AVX-512; "
                                 f"{a.train_step} was compiled for {simd} (build one as the usage above says)")
                torch_s.append(run([sys.executable, reference, *sizes, f"--threads={threads}"])["tokens_per_s"])
            best = max(layouts, key=lambda l: statistics.median(weft[l]))
            label = lambda l: (f"data {l[0]} x tensor {l[1]}" + (f", {l[2]} threads" if l[2] > 1 else "") +
                               (f", expert {l[3]}" if len(l) > 3 else ""))
            w, t = statistics.median(weft[best]), statistics.median(torch_s)
            f = flops
            print(json.dumps({"bench": "vs_pytorch", "model": name, "threads": threads,
                              "weft_layout": label(best),
                              "weft_tokens_per_s": w, "pytorch_tokens_per_s": t, "ratio": w / t,
                              "weft_effective_gflops": w * f / 1e9, "pytorch_effective_gflops": t * f / 1e9,
                              "weft_share_outside_gemm": statistics.median(share[best]),
                              "weft_all_layouts": {label(l): statistics.median(weft[l]) for l in layouts},
                              "weft_gemm_library": library, "weft_simd": simd,
                              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                              "torch_version": torch.__version__, "cpu": cpu(),
                              "reps": a.reps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
