#!/usr/bin/env python3
"""weft-plan as a user runs it:

  weft_plan.py WEFT_PLAN

1. GPT-2 124M on one GPU: DDP's state is 18 bytes per parameter in bf16 (2 + 4 gradient + 4 master +
   8 AdamW), 124,439,808 parameters: a closed form the plan must hit exactly; and its GEMM and
   attention seconds are their FLOPs at the cluster's rates.
   In FP8: the same state, the linear GEMMs at the FP8 peak, the casts' seconds and workspace.
2. On 64 GPUs of 8 per node: FSDP's state is 1/64 of DDP's (padding aside, bounded both ways), DDP's
   GEMM seconds are those of 1/64 of the tokens, a 1F1B pipeline's share is bounded on both sides by
   the balanced bubble and the serial model, a pipe rank's
   state is its layers' 18 bytes per parameter exactly, the list is ranked by step time among those that fit,
   tensor degrees above the node size are not offered, and pipelines of 2 and 4 ranks are.
3. A device too small for anything: every candidate marked as not fitting, none dropped.
4. 1024 GPUs: plans in well under a second per candidate (nothing is allocated).
5. Bad clusters and options exit 2 naming the problem; with no candidate, the reason for each layout.
6. --model llama: Llama 3.1 8B's state and compute parts against closed forms, measured on the Meta device;
   Llama 3.2 1B's state with its tied head, and untied (--tie-embeddings false).
7. --model mixtral: Mixtral 8x7B with every expert degree, its state, GEMM and dispatch seconds against
   closed forms (the dispatch on NVLink inside a node, on InfiniBand across nodes); the experts'
   gradients over their expert-data groups.
"""
import json, os, subprocess, sys, tempfile, time

bin_ = sys.argv[1]
failures = 0

def run(*args, timeout=60):
    return subprocess.run([bin_, *args], capture_output=True, text=True, timeout=timeout)

def rows(p):
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]

def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print("FAIL:", what)
    else:
        print("ok:", what)

# 1. The closed form.
p = run("--preset", "gpt2-124m", "--gpus", "1", "--batch", "8", "--micro", "8", "--json", "--show", "100")
r = rows(p)
ddp = [x for x in r if x["strategy"] == "ddp" and x["tensor"] == 1]
check(p.returncode == 0 and len(ddp) == 1 and ddp[0]["state_bytes"] == 18 * 124_439_808,
      f"GPT-2 124M DDP bf16 state = 18 B/parameter: {ddp[0]['state_bytes'] if ddp else p.stderr}")
# Its compute parts from FLOP counts written here, at the default cluster's rates (989 TFLOP/s dense
# bf16; GEMMs at 0.7 of it, the attention core at 0.3): 8 x 1024 tokens, 6 FLOPs per matrix element
# per token (the 12 blocks' 12 C^2 and the 50257 x 768 head), and the causal core's 2 T (T + 1) hd
# per sequence and head, forward once and backward twice.
tokens, C = 8 * 1024, 768
gemm_s = 6 * tokens * (12 * 12 * C * C + 50257 * C) / (989e12 * 0.7)
attention_s = 3 * 2 * 1024 * 1025 * 64 * 8 * 12 * 12 / (989e12 * 0.3)
check(ddp and abs(ddp[0]["gemm_s"] - gemm_s) <= 1e-9 * gemm_s and abs(ddp[0]["attention_s"] - attention_s) <= 1e-9 * attention_s,
      f"GPT-2 124M's GEMM and attention seconds from their FLOPs: {gemm_s:.6g} and {attention_s:.6g} s, planned "
      f"{ddp and ddp[0]['gemm_s']} and {ddp and ddp[0]['attention_s']}")

# 1b. FP8 (--dtype fp8-rowwise, fp8-tensorwise): the same state (bf16 weights, f32 gradients, master
# and AdamW), the linear layers' GEMMs at the FP8 peak (1979 TFLOP/s dense, 0.7 of it) and the tied
# head's at bf16's, and the float8 casts' elements (each linear GEMM's two operands, (m + n) k) as
# elementwise seconds at the HBM bandwidth, 5 bytes each (bf16 read for the amax and for the cast, a
# byte written); the largest GEMM's casts in the workspace.
N = tokens
linear = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # (in, out)
cast_elements = 12 * sum((N + o) * i + (N + i) * o + (o + i) * N for i, o in linear)
largest_casts = max(max((N + o) * i, (N + i) * o, (o + i) * N) for i, o in linear)
for dtype in ("fp8-rowwise", "fp8-tensorwise"):
    p = run("--preset", "gpt2-124m", "--gpus", "1", "--batch", "8", "--micro", "8", "--dtype", dtype, "--json",
            "--show", "100")
    f8 = [x for x in rows(p) if x["strategy"] == "ddp" and x["tensor"] == 1]
    want = 6 * tokens * 12 * 12 * C * C / (1979e12 * 0.7) + 6 * tokens * 50257 * C / (989e12 * 0.7)
    casts_s = cast_elements * 5 / 4800e9
    ok = (p.returncode == 0 and len(f8) == 1 and f8[0]["state_bytes"] == 18 * 124_439_808
          and abs(f8[0]["gemm_s"] - want) <= 1e-9 * want
          and abs(f8[0]["elementwise_s"] - ddp[0]["elementwise_s"] - casts_s) <= 1e-9 * casts_s
          and f8[0]["workspace_bytes"] - ddp[0]["workspace_bytes"] == largest_casts)
    check(ok, f"GPT-2 124M DDP {dtype}: state 18 B/parameter, GEMMs {want:.6g} s (planned "
              f"{f8 and f8[0]['gemm_s']}), casts {casts_s:.6g} s, workspace +{largest_casts} B; step "
              f"{f8 and f8[0]['step_s']:.6g} s against bf16's {ddp[0]['step_s']:.6g}")

# 2. 64 GPUs.
p = run("--preset", "gpt2-124m", "--gpus", "64", "--gpus-per-node", "8", "--batch", "256", "--micro", "2", "--json",
        "--show", "1000")
r = rows(p)
by = {(x["strategy"], x["tensor"]): x for x in r if x["pipe"] == 1}
d, f = by.get(("ddp", 1)), by.get(("fsdp", 1))
# Two-sided: 64 shards hold every element (never less than DDP's state in all), and each of GPT-2's 15
# units (the tied table, the positions, 12 blocks, the final norm: nn/staged_model.hpp) is padded to a
# multiple of 64 elements, so by at most 63 elements of 18 bytes in all.
check(p.returncode == 0 and d and f and d["state_bytes"] <= 64 * f["state_bytes"] <= d["state_bytes"] + 15 * 63 * 18,
      f"FSDP holds 1/64 of DDP's state: {f and f['state_bytes']} x 64 vs {d and d['state_bytes']}")
# Data parallelism divides the compute: DDP on 64 data ranks does each GEMM on 256 x 1024 / 64 tokens,
# the closed form of part 1 at those tokens.
gemm_64 = 6 * (256 * 1024 // 64) * (12 * 12 * C * C + 50257 * C) / (989e12 * 0.7)
check(d and abs(d["gemm_s"] - gemm_64) <= 1e-9 * gemm_64, f"DDP on 64 GPUs: GEMM seconds {gemm_64:.6g}, planned {d and d['gemm_s']}")
# A pipeline's share beyond its parts (each pipe rank's parts are the pipe-1 parts over the pipe
# degree): at least the bubble of a balanced 1F1B, (p - 1) / m of each micro-batch's parts for m
# micro-batches (imbalance and messages only add to it), and at most the whole model run serially on
# one rank with that bubble, p (m + p - 1) / m of the parts, less the parts.
parts = ["gemm_s", "attention_s", "elementwise_s", "memory_s", "tensor_comm_s", "data_comm_s"]
per_micro = ["gemm_s", "attention_s", "elementwise_s", "memory_s", "tensor_comm_s"]  # not the once-a-step data_comm_s
def bubble_ok(x):
    p_, m = x["pipe"], x["accumulation"]
    low, w = (p_ - 1) / m * sum(x[k] for k in per_micro), sum(x[k] for k in parts)
    return low * (1 - 1e-9) <= x["pipeline_s"] <= (p_ * (m + p_ - 1) / m - 1) * w
piped_1f1b = [x for x in r if x["pipe"] > 1 and x["schedule"] == "1f1b"]
check(piped_1f1b and all(bubble_ok(x) for x in piped_1f1b),
      "each 1F1B pipeline's share: at least a balanced bubble, at most the serial model's: " +
      ", ".join(f"pipe {x['pipe']} m {x['accumulation']}: {x['pipeline_s']:.3g} s" for x in piped_1f1b[:4]))
fits = [x["step_s"] for x in r if x["fits"]]
check(fits == sorted(fits) and all(x["fits"] for x in r[:len(fits)]), "ranked by step time, those that fit first")
check({x["tensor"] for x in r} == {1, 2, 4}, f"tensor degrees 1, 2, 4 (12 heads; 8 does not divide): {sorted({x['tensor'] for x in r})}")
check(all(x["tensor"] * x["pipe"] * x["data"] == 64 for x in r), "every candidate uses the 64 GPUs")
# Pipelines: every pipe degree that divides the 12 layers and leaves at least as many micro-batches
# as pipe ranks (256 / (2 x 64 / (tensor x pipe)) >= pipe); a pipe rank holds about 1/pipe of the
# blocks, plus the embedding or the head.
piped = {(x["pipe"], x["schedule"]) for x in r if x["pipe"] > 1}
check({p for p, _ in piped} == {2, 4}, f"pipe degrees 2 and 4 (8 leaves fewer micro-batches than ranks): {sorted(piped)}")
# Interleaved with 2 virtual stages where the 12 layers split into 2 x pipe stages: pipe 2, not 4.
check({p for p, sched in piped if sched == "int2"} == {2}, f"interleaved (int2) on pipe 2 only: {sorted(piped)}")
# DDP on pipe 2 and 4: the largest pipe rank is the first (the embedding, 50257 x 768 + 1024 x 768,
# and 12 / pipe blocks of 12 x 768^2 + 13 x 768), at 18 bytes per parameter, exactly.
block, embedding = 12 * 768 * 768 + 13 * 768, 50257 * 768 + 1024 * 768
for pipe in (2, 4):
    pp = [x for x in r if x["strategy"] == "ddp" and x["tensor"] == 1 and x["pipe"] == pipe and x["schedule"] == "1f1b"]
    want = 18 * (embedding + 12 // pipe * block)
    check(pp and pp[0]["state_bytes"] == want and pp[0]["pipeline_s"] > 0,
          f"DDP on pipe {pipe}: the first pipe rank's state is 18 B x (embedding + {12 // pipe} blocks) = {want}, and a bubble: "
          f"{pp and pp[0]['state_bytes']}, pipeline {pp and pp[0]['pipeline_s']} s")

# 3. Nothing fits 1 MiB.
p = run("--preset", "gpt2-124m", "--gpus", "8", "--batch", "64", "--memory-gib", "0.001", "--json", "--show", "1000")
r = rows(p)
check(p.returncode == 0 and r and not any(x["fits"] for x in r), f"nothing fits 1 MiB ({len(r)} candidates listed)")
p = run("--preset", "gpt2-124m", "--gpus", "8", "--batch", "64", "--memory-gib", "0.001")
check("(does not fit)" in p.stdout, "the table says which do not fit")

# 4. Thousands of GPUs.
t0 = time.monotonic()
p = run("--preset", "gpt2-1.5b", "--gpus", "4096", "--batch", "4096", "--micro", "1", "--json", "--show", "1000")
took = time.monotonic() - t0
check(p.returncode == 0 and len(rows(p)) >= 16 and took < 30, f"4096 GPUs: {len(rows(p))} candidates in {took:.2f} s")

# 5. Bad input.
work = tempfile.mkdtemp(prefix="weft_plan_")
def cluster(name, text):
    path = os.path.join(work, name)
    open(path, "w").write(text)
    return path
fifo = os.path.join(work, "cluster.fifo")
os.mkfifo(fifo)
bad = [
    (["--cluster", os.path.join(work, "missing.json")], "cannot read"),
    # nested past the limit (before, the message's printing of the value overflowed the stack), and
    # a FIFO (before, the read waited for a writer forever)
    (["--cluster", cluster("deep.json", '{"inter_gbps": ' + "[" * 100000 + "]" * 100000 + "}")],
     "nests JSON arrays and objects 5 or more deep, over the limit of 4"),
    (["--cluster", fifo], "is a FIFO (named pipe), not a regular file"),
    (["--cluster", cluster("text.json", "gpus per node: 8")], "is not JSON"),
    (["--cluster", cluster("list.json", "[8]")], "is not a JSON object"),
    (["--cluster", cluster("unknown.json", '{"gpus_per_nod": 8}')], "unknown key 'gpus_per_nod'"),
    (["--cluster", cluster("negative.json", '{"inter_gbps": -5}')], "inter_gbps is -5"),
    (["--cluster", cluster("string.json", '{"peak_tflops": "fast"}')], "peak_tflops is \"fast\""),
    (["--cluster", cluster("half.json", '{"gpus_per_node": 8.5}')], "gpus_per_node is 8.5"),
    (["--cluster", cluster("twice.json", '{"memory_gib": 80, "memory_gib": 141}')], "gives memory_gib twice"),
    (["--cluster", cluster("efficient.json", '{"gemm_efficiency": 1e308}')], "gemm_efficiency is 1e+308; give a number from 1e-06 to 1"),
    (["--cluster", cluster("empty.json", '{"memory_gib": 0}')], "memory_gib is 0; give a number from 1e-06 to 1e+09"),
    (["--cluster", cluster("slow.json", '{"inter_us": 1e300}')], "inter_us is 1e+300; give a number from 0 to 1e+09"),
    (["--gpus", "0"], "--gpus: 0 is out of range: use a number >= 1"),
    (["--gpus", "nan"], "not a finite number"),
    (["--micro", "4", "--gpus", "1024", "--batch", "512"], "more than the batch"),
    (["--width", "100000000", "--micro", "64", "--gpus", "1"], "elements per GPU"),
    # 3 GPUs: tensor 2 does not divide them, and data 3 does not divide the batch of 4; both reasons named
    (["--gpus", "3", "--batch", "4", "--micro", "1"], "tensor 2: does not divide 3 GPUs"),
    (["--gpus", "3", "--batch", "4", "--micro", "1", "--json"], "not a multiple of the micro-batch 3"),
]
for args, fragment in bad:
    p = run(*args)
    check(p.returncode == 2 and fragment in p.stdout + p.stderr, f"{' '.join(args)} -> exit {p.returncode}, '{fragment}'")

# 6. Llama (--model llama), planned from its step measured on the Meta device. Llama 3.1 8B at T = 1024
# on 8 GPUs: DDP's state is 18 bytes per parameter (8,030,261,248 with the untied head: the
# embedding and the head 128256 x 4096 each, 32 blocks of 2 C^2 + 2 C kv + 3 C F + 2 C, the final
# norm), and its GEMM and attention seconds are their FLOPs at the cluster's rates: 6 per matrix
# element per token (the blocks' matrices and the head; the embedding is a gather) and the causal
# core of 32 query heads of 128.
C, L, kv, F, V, T = 4096, 32, 8 * 128, 14336, 128256, 1024
params = 2 * V * C + L * (2 * C * C + 2 * C * kv + 3 * C * F + 2 * C) + C
p = run("--model", "llama", "--preset", "llama-3.1-8b", "--seq", str(T), "--gpus", "8", "--batch", "8", "--micro", "1",
        "--json", "--show", "1000", timeout=240)
r = rows(p)
d = [x for x in r if x["strategy"] == "ddp" and x["tensor"] == 1 and x["pipe"] == 1]
gemm_s = 6 * T * (L * (2 * C * C + 2 * C * kv + 3 * C * F) + V * C) / (989e12 * 0.7)
attention_s = 3 * 2 * T * (T + 1) * 128 * 32 * L / (989e12 * 0.3)
check(p.returncode == 0 and len(d) == 1 and d[0]["state_bytes"] == 18 * params
      and abs(d[0]["gemm_s"] - gemm_s) <= 1e-9 * gemm_s and abs(d[0]["attention_s"] - attention_s) <= 1e-9 * attention_s,
      f"Llama 3.1 8B DDP bf16 on 8 GPUs: state 18 B x {params} = {18 * params}, GEMMs {gemm_s:.6g} s, attention "
      f"{attention_s:.6g} s; planned {d and (d[0]['state_bytes'], d[0]['gemm_s'], d[0]['attention_s'])} {p.stderr[-300:]}")
check({x["tensor"] for x in r} == {1, 2, 4, 8}, f"Llama's tensor degrees divide its 8 key-value heads: {sorted({x['tensor'] for x in r})}")
# Llama 3.2 1B ties its LM head to the embedding table (Llama's tied variant): one 128256 x 2048
# table where --tie-embeddings false plans two. On one GPU, DDP's state is 18 bytes per parameter.
C, L, kv, F = 2048, 16, 8 * 64, 8192
params = V * C + L * (2 * C * C + 2 * C * kv + 3 * C * F + 2 * C) + C
for tie, want in (([], params), (["--tie-embeddings", "false"], params + V * C)):
    p = run("--model", "llama", "--preset", "llama-3.2-1b", "--seq", "256", "--gpus", "1", "--batch", "1", "--micro", "1",
            "--json", "--show", "1000", *tie, timeout=240)
    d = [x for x in rows(p) if x["strategy"] == "ddp" and x["pipe"] == 1]
    check(p.returncode == 0 and len(d) == 1 and d[0]["state_bytes"] == 18 * want,
          f"Llama 3.2 1B{' untied' if tie else ''} DDP bf16 on 1 GPU: state 18 B x {want} = {18 * want}; planned "
          f"{d and d[0]['state_bytes']} {p.stderr[-300:]}")
p = run("--model", "llama", "--preset", "gpt2-124m")
check(p.returncode == 2 and "gpt2-124m" in p.stdout + p.stderr, "--model llama with a GPT-2 preset is refused")

# 7. Mixtral 8x7B's sizes (--model mixtral) with 8 of its 32 layers (the plan measures each layer of
# each candidate: 8 keep the check short under the sanitizers) at T = 256 on 8 GPUs, with every
# expert degree e carved from the data ranks that divides its 8 experts: DDP's state is 18 bytes per
# parameter of the dense part (the embedding and the head 32000 x 4096 each, 8 blocks of attention
# 2 C^2 + 2 C kv, the router C E, two norms; the final norm) and of 1/e of the experts' (8 x 8
# experts of 3 C F); the GEMM seconds are the active parameters' (the router's and top-2 experts'
# of each token, at the balanced routing the plan assumes) at the cluster's rate for every e; and
# the expert group's dispatch and combine, priced on NVLink (3 us, 450 GB/s: e ranks inside the
# node), are per layer one all-to-all of the 8 experts' int64 counts and four of the T k C bf16 rows
# (dispatch and combine, forward and backward) for e > 1, and nothing for e = 1.
C, L, kv, F, V, E, K, T = 4096, 8, 8 * 128, 14336, 32000, 8, 2, 256
dense = 2 * V * C + L * (2 * C * C + 2 * C * kv + C * E + 2 * C) + C
expert_params = L * E * 3 * C * F
def all_to_all_s(n, nbytes):
    return (n - 1) * 3e-6 + (n - 1) / n * nbytes / 450e9
p = run("--model", "mixtral", "--layers", str(L), "--seq", str(T), "--gpus", "8", "--batch", "8", "--micro", "1", "--json",
        "--show", "1000", timeout=400)
r = rows(p)
ddp = {x["expert"]: x for x in r if x["strategy"] == "ddp" and x["tensor"] == 1 and x["pipe"] == 1}
gemm_s = 6 * T * (L * (2 * C * C + 2 * C * kv + C * E + K * 3 * C * F) + V * C) / (989e12 * 0.7)
for e in (1, 2, 4, 8):
    x = ddp.get(e)
    state = 18 * (dense + expert_params // e)
    comm = 0 if e == 1 else L * (all_to_all_s(e, 8 * E) + 4 * all_to_all_s(e, T * K * C * 2))
    check(p.returncode == 0 and x is not None and x["state_bytes"] == state and abs(x["gemm_s"] - gemm_s) <= 1e-9 * gemm_s
          and abs(x["expert_comm_s"] - comm) <= 1e-9 * comm,
          f"Mixtral 8x7B (8 layers) DDP bf16 on data 8, expert {e}: state {state}, GEMMs {gemm_s:.6g} s, dispatch and combine "
          f"{comm:.6g} s; planned {x and (x['state_bytes'], x['gemm_s'], x['expert_comm_s'])} {p.stderr[-300:]}")
# With 4 GPUs a node, an expert group of 8 leaves the node: its all-to-alls go over InfiniBand (10 us,
# 50 GB/s a GPU); one of 4 stays on NVLink.
def all_to_all_inter_s(n, nbytes):
    return (n - 1) * 10e-6 + (n - 1) / n * nbytes / 50e9
q = run("--model", "mixtral", "--layers", str(L), "--seq", str(T), "--gpus", "8", "--gpus-per-node", "4", "--batch", "8",
        "--micro", "1", "--json", "--show", "1000", timeout=400)
by_node = {x["expert"]: x for x in rows(q) if x["strategy"] == "ddp" and x["tensor"] == 1 and x["pipe"] == 1}
for e, price in ((4, all_to_all_s), (8, all_to_all_inter_s)):
    comm = L * (price(e, 8 * E) + 4 * price(e, T * K * C * 2))
    x = by_node.get(e)
    check(q.returncode == 0 and x is not None and abs(x["expert_comm_s"] - comm) <= 1e-9 * comm,
          f"4 GPUs a node, expert {e}: dispatch and combine {comm:.6g} s "
          f"({'InfiniBand' if e == 8 else 'NVLink'}); planned {x and x['expert_comm_s']} {q.stderr[-300:]}")
# The experts' gradients reduce over their expert-data group (8 / e ranks), the rest over all 8: the
# data collectives' time falls as e grows.
data_s = [ddp[e]["data_comm_s"] for e in (1, 2, 4, 8) if e in ddp]
check(len(data_s) == 4 and all(a > b for a, b in zip(data_s, data_s[1:])),
      f"the experts' gradients over 8 / e ranks: data collectives {data_s} s for e = 1, 2, 4, 8")
# The MoE families are planned in bf16 (their cluster precisions): f32 is refused by name.
p = run("--model", "mixtral", "--dtype", "f32", "--gpus", "8")
check(p.returncode == 2 and "precision 'f32' is not planned for the model family 'mixtral'; use one of: bf16" in p.stderr,
      f"--model mixtral --dtype f32 refused: exit {p.returncode} {p.stderr[-200:]}")
check({(x["tensor"], x["expert"]) for x in r if x["pipe"] == 1} ==
      {(t, e) for t in (1, 2, 4, 8) for e in (1, 2, 4, 8) if e <= 8 // t},
      f"expert degrees that divide the data degree (8 / tensor) and the 8 experts: "
      f"{sorted({(x['tensor'], x['expert']) for x in r if x['pipe'] == 1})}")

sys.exit(1 if failures else 0)
