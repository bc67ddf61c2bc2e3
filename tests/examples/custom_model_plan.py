#!/usr/bin/env python3
"""The custom model's own weft-plan (examples/03_custom_model_plan.cpp), a main over weft's trainer
library that costs each layout by measuring its step on the Meta device:

  custom_model_plan.py CUSTOM_MODEL_PLAN CUSTOM_MODEL_TRAIN

1. On 4 GPUs, for layouts on tensor, pipe and data axes: the planner's peak per GPU (its bounding
   ranks measured alone) equals to the byte the trainer's --plan (every rank of the mesh measured
   as a thread, itself held to the run's logged peak by custom_model_train.py), the state likewise.
2. The search: every compiled strategy (DDP and ZeRO-1, with and without SP) and no other, no full
   recompute (the family has none), tensor degrees the model divides (tensor 8 left out with the
   model's own message for 4 heads), pipe 2 (the model's 2 layers), a 1F1B pipeline's share between a
   balanced bubble and the serial model, ranked among those that fit.
3. 4096 GPUs of a larger configuration: every candidate on the 4096 GPUs (nothing is allocated, one
   rank's step per measurement).
4. What the family does not have is refused (exit 2, naming the choices).
"""
import json, os, re, subprocess, sys, time

plan, train = sys.argv[1], sys.argv[2]
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []

def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok: failures.append(what)

def rows(p):
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]

size = ["--seq", "16", "--width", "32"]
p = subprocess.run([plan, "--gpus", "4", "--gpus-per-node", "8", "--batch", "8", "--micro", "1", "--dtype", "f64", "--json",
                    "--show", "1000", *size], capture_output=True, text=True, env=env, timeout=120)
r = rows(p)
check(p.returncode == 0 and len(r) > 0, f"4 GPUs: {len(r)} candidates (exit {p.returncode}) {p.stderr[-400:]}")

# 1. Against the trainer's --plan.
for strategy, tensor, pipe, schedule in (("zero1-sp", 2, 1, "-"), ("ddp", 1, 2, "zb"), ("zero1", 1, 1, "-"), ("zero1-sp", 2, 2, "1f1b")):
    got = [x for x in r if x["strategy"] == strategy and x["tensor"] == tensor and x["pipe"] == pipe and x["schedule"] == schedule]
    if not got:
        check(False, f"{strategy} tensor {tensor} pipe {pipe} {schedule}: not among the candidates")
        continue
    x = got[0]
    args = ["--plan", "--dtype", "f64", "--batch", "8", "--micro-batch", str(x["micro_batch"]), "--data", str(x["data"]),
            "--tensor", str(tensor), "--pipe", str(pipe), "--strategy", strategy, *size]
    if pipe > 1: args += ["--schedule", schedule]
    q = subprocess.run([train, *args], capture_output=True, text=True, env=env, timeout=120)
    totals = [int(v) for v in re.findall(r"(?:step peak|pipe rank \d+:) (\d+) bytes", q.stdout)]
    check(q.returncode == 0 and totals and max(totals) == x["peak_bytes"],
          f"{strategy} tensor {tensor} pipe {pipe} {schedule} data {x['data']}: planned {x['peak_bytes']} bytes, the trainer's "
          f"--plan {max(totals) if totals else q.stdout + q.stderr}")

# 2. The search.
names = {x["strategy"] for x in r}
check(names == {"ddp", "ddp-sp", "zero1", "zero1-sp"}, f"every compiled strategy and no other: {sorted(names)}")
check({x["tensor"] for x in r} == {1, 2, 4}, f"tensor 1, 2 and 4: {sorted({x['tensor'] for x in r})}")
check({x["pipe"] for x in r} == {1, 2}, f"pipe 1 and 2: {sorted({x['pipe'] for x in r})}")
check(all(x["tensor"] * x["pipe"] * x["data"] == 4 for x in r), "every candidate uses the 4 GPUs")
check(all(x["gemm_s"] > 0 for x in r), "every candidate's GEMMs take time")
fits = [x["step_s"] for x in r if x["fits"]]
check(fits == sorted(fits) and all(x["fits"] for x in r[:len(fits)]), "ranked by step time, those that fit first")
# A pipeline's share beyond its parts: at least a balanced bubble of each micro-batch's parts, at most
# the whole model serially with that bubble (weft_plan.py says why).
per_micro = ["gemm_s", "attention_s", "elementwise_s", "memory_s", "tensor_comm_s"]
parts = per_micro + ["data_comm_s"]
def bubble_ok(x):
    p_, m = x["pipe"], x["accumulation"]
    low, w = (p_ - 1) / m * sum(x[k] for k in per_micro), sum(x[k] for k in parts)
    return low * (1 - 1e-9) <= x["pipeline_s"] <= (p_ * (m + p_ - 1) / m - 1) * w
piped = [x for x in r if x["pipe"] > 1 and x["schedule"] == "1f1b"]
check(piped and all(bubble_ok(x) for x in piped), "every 1F1B pipeline's share between a balanced bubble and the serial model")
p = subprocess.run([plan, "--gpus", "8", "--batch", "8", "--micro", "1", *size], capture_output=True, text=True, env=env, timeout=120)
check(p.returncode == 0 and re.search(r"left out:\n(.*\n)*  tensor 8, data 1: .*4", p.stdout) is not None,
      f"tensor 8 left out with the model's message:\n{p.stdout[-600:]}")
check("measured on the Meta device" in p.stdout and "custom_model_plan: custom: " in p.stdout, "the table says how it was planned")

# 3. Thousands of GPUs.
t0 = time.monotonic()
p = subprocess.run([plan, "--gpus", "4096", "--batch", "4096", "--micro", "1", "--layers", "8", "--width", "256", "--heads", "8",
                    "--seq", "128", "--vocab", "1024", "--json", "--show", "1000"], capture_output=True, text=True, env=env, timeout=240)
took = time.monotonic() - t0
r = rows(p)
check(p.returncode == 0 and len(r) >= 8 and all(x["tensor"] * x["pipe"] * x["data"] == 4096 for x in r),
      f"4096 GPUs: {len(r)} candidates in {took:.1f} s {p.stderr[-300:]}")

# 4. Refusals.
for args, message in ((["--dtype", "bf16"], "precision 'bf16' is not planned for the model family 'custom'; use one of: f32, f64"),
                      (["--preset", "huge"], "the model family 'custom' has no preset 'huge'; use one of: tiny"),
                      (["--model", "gpt2"], "--model: gpt2 not in {custom}"),
                      (["--gpus", "1024", "--batch", "8"], "more than the batch")):
    p = subprocess.run([plan, *args], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 2 and message in p.stdout + p.stderr, f"{' '.join(args)}: exit {p.returncode}, '{message}'")

if failures:
    print(f"FAIL: {len(failures)} checks")
    sys.exit(1)
print("custom_model_plan: every check passed")
