#!/usr/bin/env python3
"""weft, PyTorch (eager and torch.compile) and llm.c training the same models on one GPU, in one run.

Models (T = 1024, bf16 compute with f32 master weights, AdamW, gradient clipping at 1.0):
  gpt2   GPT-2 124M (12 layers, width 768, 12 heads, vocabulary 50257, LM head tied)
  llama  Llama 3.2 1B's shape (16 layers, width 2048, 32 heads in 8 key-value groups, SwiGLU of 8192,
         vocabulary 128256, LM head tied; 1.24B parameters)
Implementations:
  weft        GPT-2: the prebuilt benchmarks/gpt2.cu (its own largest micro-batch of 32, 16, 8, 4);
              Llama: the prebuilt weft-train (--model llama --preset llama-3.2-1b --seq 1024 --device cuda
              --dtype bf16, one rank), the median of its logged steps after the first two.
  pytorch     tools/reference/torch_gpt.py's and torch_llama.py's modules on the GPU: bf16 autocast,
              fused AdamW, scaled_dot_product_attention (causal; Llama with enable_gqa), eager;
  compiled    the same with the model under torch.compile (default mode);
  llmc        llm.c's train_gpt2cu (and train_gpt2cu_cudnn, its cuDNN attention) built by
              scripts/llmc-build, GPT-2 only (-e d12: random init; random tokens in llm.c's .bin format).
Each runs at the largest batch of the candidates that fits (GPT-2: 32, 16, 8, 4; Llama: 16, 8, 4, 2),
in a process of its own. Step times are the median of --steps steps after warm-up, each step ended by a
device synchronization.

One formula for MFU, the same for all: model FLOPs per token 6 N + 12 L C T (the PaLM paper's
appendix; N the parameters in matrices and tables, a tied table once, as weft's gpt2::flops_per_token
and llama::flops_per_token count them) times tokens/s, over the data-sheet dense bf16 peak (989
TFLOP/s on an H100 or H200).

Memory: each program's allocator peak where it has one (weft: its Cuda device's peak bytes; PyTorch:
torch.cuda.max_memory_allocated; llm.c: none), and for all the device memory in use at its highest
while the program ran (nvidia-smi, sampled every 0.1 s; includes the CUDA context and any cache).

Prints one JSON line per run and a table; --out FILE gets the JSON lines too.

Usage: benchmarks/gpu_vs_pytorch.py --weft build/gpu-prebuilt [--llmc build/llmc] [--models gpt2,llama]
                                    [--impls weft,pytorch,compiled,llmc] [--steps 10] [--out FILE]
                                    [--weft-gpt2-json build/gpu-results/gpt2.jsonl]
"""
import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools", "reference"))

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
SIZES = {
    "gpt2": dict(vocab=50257, seq=1024, layers=12, heads=12, kv_heads=12, width=768, hidden=3072, batches=[32, 16, 8, 4]),
    "llama": dict(vocab=128256, seq=1024, layers=16, heads=32, kv_heads=8, width=2048, hidden=8192, batches=[16, 8, 4, 2]),
}


def flops_per_token(model):
    """6 N + 12 L C T, N as weft counts it (models/gpt2/config.hpp, models/llama/config.hpp)."""
    s = SIZES[model]
    C, L, T, V = s["width"], s["layers"], s["seq"], s["vocab"]
    if model == "gpt2":
        n = V * C + T * C + L * 12 * C * C
    else:
        kv = s["kv_heads"] * (C // s["heads"])
        n = L * (2 * C * C + 2 * C * kv + 3 * C * s["hidden"]) + V * C  # tied: the table once
    return 6.0 * n + 12.0 * L * C * T


class MemorySampler:
    """The device's memory in use at its highest (nvidia-smi, MiB) while the block runs."""

    def __enter__(self):
        self.peak, self.stop = None, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                     capture_output=True, text=True, timeout=5).stdout.strip()
                self.peak = max(self.peak or 0, int(out.splitlines()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass
            self.stop.wait(0.1)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run(cmd, timeout, env=None):
    """(return code, stdout + stderr, device MiB in use at most); a run past `timeout` is killed (rc 124)."""
    with MemorySampler() as mem:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = 124, f"{(e.stdout or b'').decode(errors='replace') if isinstance(e.stdout, bytes) else (e.stdout or '')}" \
                           f"\n(killed after {timeout} s)"
    return rc, out, mem.peak


# ---- PyTorch, in a child process (one model, one mode, the largest batch that fits) ----

def torch_child(model_name, compiled, batches, steps):
    import torch
    import torch.nn.functional as F  # noqa: F401  (the reference modules use it)
    import torch_gpt
    import torch_llama

    s = SIZES[model_name]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    for B in batches:
        try:
            if model_name == "gpt2":
                model = torch_gpt.Gpt(s["vocab"], s["seq"], s["layers"], s["heads"], s["width"])
            else:
                torch_llama.Block.gqa = True
                model = torch_llama.Llama(s["vocab"], s["seq"], s["layers"], s["heads"], s["kv_heads"], s["width"], s["hidden"])
                model.head.weight = model.wte.weight  # tied, as Llama 3.2 1B
            for m in model.modules():  # GPT-2's initialization (normal, 0.02), so the loss starts near log V
                if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                    torch.nn.init.normal_(m.weight, std=0.02)
            model = model.to(dev)
            fwd = torch.compile(model) if compiled else model
            opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
            g = torch.Generator(device=dev).manual_seed(1)
            x = torch.randint(0, s["vocab"], (B, s["seq"]), generator=g, device=dev)
            y = torch.randint(0, s["vocab"], (B, s["seq"]), generator=g, device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = fwd(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                torch.cuda.synchronize()
                return loss

            t0 = time.perf_counter()
            for _ in range(3):
                loss = step()
            warm_s = time.perf_counter() - t0
            torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = step()
                times.append(time.perf_counter() - t0)
            loss = float(loss)
            if loss != loss:
                raise RuntimeError("the loss is NaN")
            print(json.dumps({"batch": B, "step_s": statistics.median(times), "warmup_s": warm_s, "loss": loss,
                              "allocator_peak_bytes": torch.cuda.max_memory_allocated(), "torch": torch.__version__}))
            return 0
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:  # compiled code may wrap the OOM
            if "out of memory" not in str(e).lower():
                raise
            print(f"pytorch: batch {B} does not fit", file=sys.stderr)
            model = fwd = opt = x = y = loss = None
            gc.collect()
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return 1


def pytorch(model, compiled, steps, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", model, "compiled" if compiled else "eager",
           "--steps", str(steps)]
    rc, out, mem = run(cmd, timeout)
    rec = last_json(out)
    if rc != 0 or rec is None:
        return {"error": tail(out)}
    return {**rec, "device_peak_mib": mem}


# ---- weft ----

def weft_gpt2(bin_dir, steps, timeout, reuse=None):
    if reuse:  # a record benchmarks/gpt2.cu printed earlier in the same session (scripts/gpu-check's)
        rc, out, mem = 0, open(reuse).read(), None
    else:
        rc, out, mem = run([os.path.join(bin_dir, "gpt2"), "--steps", str(steps)], timeout)
    rec = last_json(out)
    if rc != 0 or rec is None:
        return {"error": tail(out) or "no record"}
    return {"batch": rec["micro_batch"], "step_s": rec["step_ms"] / 1e3, "allocator_peak_bytes": rec["peak_bytes"]["total"],
            "device_peak_mib": mem, "weft_mfu": rec.get("mfu"), "gemm_share": rec.get("gemm_share"),
            "attention_share": rec.get("attention_share")}


def weft_llama(bin_dir, steps, timeout):
    s = SIZES["llama"]
    for B in s["batches"]:
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log.jsonl")
            cmd = [os.path.join(bin_dir, "weft-train"), "--model", "llama", "--preset", "llama-3.2-1b", "--seq", str(s["seq"]),
                   "--device", "cuda", "--dtype", "bf16", "--data", "1", "--tensor", "1", "--batch", str(B),
                   "--steps", str(steps + 2), "--eval-every", "0", "--log", log]
            rc, out, mem = run(cmd, timeout)
            recs = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
        steps_rec = [r for r in recs if "tokens_per_s" in r]
        if rc == 0 and len(steps_rec) > 2:
            tok = statistics.median(r["tokens_per_s"] for r in steps_rec[2:])
            return {"batch": B, "step_s": B * s["seq"] / tok, "allocator_peak_bytes": max(r["peak_bytes"] for r in steps_rec),
                    "device_peak_mib": mem, "loss": steps_rec[-1]["loss"]}
        if "out of memory" not in out.lower() and "does not fit" not in out.lower():
            return {"error": tail(out)}
    return {"error": "no candidate batch fits"}


# ---- llm.c ----

def write_llmc_tokens(path, n, vocab):
    """n random tokens in llm.c's .bin format (256 int32 header: magic 20240520, version 1, count; uint16 tokens)."""
    import array
    import random
    rng = random.Random(1)
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        header.tofile(f)
        array.array("H", (rng.randrange(vocab) for _ in range(n))).tofile(f)


def llmc(binary, steps, timeout):
    s = SIZES["gpt2"]
    with tempfile.TemporaryDirectory() as tmp:
        train, val = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
        n = max(s["batches"]) * s["seq"] * (steps + 6) + 1
        write_llmc_tokens(train, n, s["vocab"])
        write_llmc_tokens(val, n, s["vocab"])
        for B in s["batches"]:
            cmd = [binary, "-i", train, "-j", val, "-e", "d12", "-b", str(B), "-t", str(s["seq"]), "-x", str(steps + 3),
                   "-v", "1000000", "-m", "1", "-s", "0", "-h", "0", "-y", "0"]  # -v 0 divides by zero in llm.c; one validation batch at the end
            rc, out, mem = run(cmd, timeout)
            ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms \|", out)]
            losses = [float(m) for m in re.findall(r"\| loss ([0-9.]+)", out)]
            if rc == 0 and len(ms) > 3:
                return {"batch": B, "step_s": statistics.median(ms[3:]) / 1e3, "device_peak_mib": mem,
                        "loss": losses[-1] if losses else None}
            if "out of memory" not in out.lower():
                return {"error": tail(out)}
    return {"error": "no candidate batch fits"}


# ---- reporting ----

def last_json(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def tail(out, n=12):
    return "\n".join(out.strip().splitlines()[-n:])


def gpu():
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
        return q.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", help="the folder scripts/gpu-build made (gpt2, weft-train)")
    ap.add_argument("--llmc", help="the folder scripts/llmc-build made (train_gpt2cu[_cudnn])")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--impls", default="weft,pytorch,compiled,llmc")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=240, help="seconds for one run")
    ap.add_argument("--out")
    ap.add_argument("--weft-gpt2-json", help="take weft's GPT-2 record from this file (benchmarks/gpt2.cu's output, "
                                             "as scripts/gpu-check leaves it) instead of running it again")
    ap.add_argument("--torch-child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        model, mode = a.torch_child
        sys.exit(torch_child(model, mode == "compiled", SIZES[model]["batches"], a.steps))
    name = gpu()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    impls = a.impls.split(",")
    out = open(a.out, "a") if a.out else None
    rows = []
    for model in a.models.split(","):
        if model not in SIZES:
            sys.exit(f"gpu_vs_pytorch.py: no model named {model}; use gpt2 or llama")
        runs = []
        if "weft" in impls and a.weft:
            if model == "gpt2":
                runs.append(("weft", lambda: weft_gpt2(a.weft, a.steps, a.timeout, a.weft_gpt2_json)))
            else:
                runs.append(("weft", lambda: weft_llama(a.weft, a.steps, a.timeout)))
        if "pytorch" in impls:
            runs.append(("pytorch eager", lambda: pytorch(model, False, a.steps, a.timeout)))
        if "compiled" in impls:
            runs.append(("pytorch compiled", lambda: pytorch(model, True, a.steps, a.timeout)))
        if "llmc" in impls and a.llmc and model == "gpt2":
            for b in ("train_gpt2cu", "train_gpt2cu_cudnn"):
                path = os.path.join(a.llmc, b)
                if os.path.exists(path):
                    runs.append(("llm.c" + (" cudnn" if "cudnn" in b else ""), lambda p=path: llmc(p, a.steps, a.timeout)))
        for impl, fn in runs:
            t0 = time.time()
            r = fn()
            rec = {"bench": "gpu_vs_pytorch", "model": model, "impl": impl, "gpu": name, "seq": SIZES[model]["seq"],
                   "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1), **r}
            if "step_s" in r:
                rec["tokens_per_s"] = r["batch"] * SIZES[model]["seq"] / r["step_s"]
                rec["model_flops_per_token"] = flops_per_token(model)
                if peak:
                    rec["mfu"] = rec["tokens_per_s"] * flops_per_token(model) / peak
            print(json.dumps(rec), flush=True)
            if out:
                print(json.dumps(rec), file=out, flush=True)
            rows.append(rec)
    print(f"\n{name}; MFU: (6 N + 12 L C T) x tokens/s over {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s dense bf16")
    print(f"{'model':6} {'implementation':18} {'batch':>5} {'tokens/s':>10} {'MFU %':>6} {'alloc GiB':>9} {'device GiB':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:6} {r['impl']:18} FAILED: {r['error'].splitlines()[-1] if r['error'] else '?'}")
            continue
        alloc = r.get("allocator_peak_bytes")
        dev = r.get("device_peak_mib")
        print(f"{r['model']:6} {r['impl']:18} {r['batch']:5d} {r['tokens_per_s']:10.0f} {100 * r.get('mfu', float('nan')):6.1f} "
              f"{(f'{alloc / 2**30:.1f}' if alloc else '-'):>9} {(f'{dev / 1024:.1f}' if dev else '-'):>10}")
    sys.exit(0 if rows and all("error" not in r for r in rows) else 1)


if __name__ == "__main__":
    main()
