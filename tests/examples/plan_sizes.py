#!/usr/bin/env python3
"""Planning answers any sizes in bounded time, or refuses them by name, and never aborts:

  plan_sizes.py TRAIN_GPT WEFT_PLAN

`weft-train --plan` (GPT-2 and Llama) with layers, batch (whole and in micro-batches of one
sequence), ranks and vocabulary of 2^k for k in 4, 20, 40, 62, and `weft-plan` with layers, batch,
GPUs and vocabulary of 2^k for k in 4, 31, 62: each call exits 0 (a plan) or 2 (a refusal that names
the value given, as the command line printed it), never anything else (134: an uncaught exception; a
hang: the timeout). Each call's time is bounded by the mechanism, not by this machine's speed: a plan
replays at most 2^16 layer passes (train/rank_plan.hpp) and measures the host's rates at shapes of at
most 2^20 elements a buffer (cost/host_rates.hpp), so a call may take at most twice what the largest
plan allowed takes here, measured first (2^7 layers of 2^9 micro-batches of 512 sequences: both caps
reached), plus 10 s for the process and a loaded machine. weft-plan costs up to a few dozen layouts,
each bounded the same way (it measures no rates): its bound is 40 such plans.
"""
import os, subprocess, sys, time

train, plan = sys.argv[1], sys.argv[2]
env = dict(os.environ, ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=0")
failures = 0


def timed(args, limit):
    t0 = time.monotonic()
    try:
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=limit)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, f"still running after {limit:.0f} s", time.monotonic() - t0


# The largest plan the bounds allow: 2^7 layers x 2^9 micro-batches of 512 sequences (the tiny preset's
# widths), whose ops reach the rates' cap.
rc, out, largest = timed([train, "--plan", "--layers", "128", "--batch", str(512 * 512), "--micro-batch", "512", "--data", "1",
                          "--tensor", "1"], 600)
if rc != 0:
    sys.exit(f"the largest allowed plan failed (exit {rc}):\n{out[-800:]}")
bound = 2 * largest + 10
print(f"the largest allowed plan (2^16 layer passes) took {largest:.2f} s: each call is bounded by {bound:.1f} s, "
      f"weft-plan's by {40 * largest + 10:.1f} s")

cases = []
for k in (4, 20, 40, 62):
    v = str(2 ** k)
    for model in (["--model", "gpt2"], ["--model", "llama"]):
        cases += [([train, "--plan", *model, "--layers", v], v, bound),
                  ([train, "--plan", *model, "--batch", v], v, bound),
                  ([train, "--plan", *model, "--batch", v, "--micro-batch", "1", "--data", "1", "--tensor", "1"], v, bound),
                  ([train, "--plan", *model, "--data", v], v, bound),
                  ([train, "--plan", *model, "--vocab", v], v, bound)]
for k in (4, 31, 62):
    v = str(2 ** k)
    cases += [([plan, "--layers", v], v, 40 * largest + 10),
              ([plan, "--batch", v], v, 40 * largest + 10),
              ([plan, "--gpus", v], v, 40 * largest + 10),
              ([plan, "--vocab", v], v, 40 * largest + 10)]
    if k > 4:  # Llama 3.1 8B's widths measured on the Meta device per layout: weft_plan.py plans it at its size
        cases.append(([plan, "--model", "llama", "--layers", v, "--gpus", "8"], v, 40 * largest + 10))

for args, value, limit in cases:
    rc, out, took = timed(args, limit)
    name = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(args))
    ok = rc == 0 or (rc == 2 and value in out)  # a refusal names the value given
    if not ok or took > limit:
        failures += 1
        print(f"FAIL: {name}: exit {rc} in {took:.2f} s (bound {limit:.1f} s): {out.strip()[-400:]!r}")
    else:
        print(f"{name}: exit {rc} in {took:.2f} s" + ("" if rc == 0 else f": {out.strip().splitlines()[-1][:160]}"))

if failures:
    sys.exit(f"{failures} of {len(cases)} calls failed")
print(f"every one of {len(cases)} calls answered or refused by name within its bound")
