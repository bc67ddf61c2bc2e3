#!/usr/bin/env python3
"""weft-train --model dit (the DiT family through weft's trainer library, a model that reads latents,
not tokens), checked by what it computes:

  weft_train_dit.py WEFT_TRAIN

1. The tiny DiT on synthetic latents (class patterns plus noise), DDPM, data 2 x tensor 2, 60
   steps: the mean loss of the last 10 steps is below 0.6 of the first 5's (the noise is
   predictable from the noised latents and the class), and the validation at 0.25, 0.5 and 0.75 of
   the schedule is printed, its mean the logged eval loss; bf16 mixed precision's last 10 losses
   within 0.05 of f32's on average.
2. The same 4 steps on one rank, on data 2 x tensor 2 with SP under ZeRO-1, on pipe 2 under ZB-H1,
   on context 2 (ring attention) and on data 2 under FSDP: every logged loss within 2e-5 of one
   rank's (f32 sums in other orders; tests/models/dit holds the layouts to 1e-12 in f64). The same
   with rectified flow (--objective flow) on tensor 2, whose losses are not DDPM's.
3. Latent records (tools/records.py: 48 latents of 4 x 8 x 8 f32 and their i32 labels): 4 steps on
   data 2 saving at step 2, resumed on tensor 2: steps 3 and 4 equal the uninterrupted run's within
   2e-5.
4. --plan (the step measured on the Meta device over a micro-batch of zeros of DiT's inputs) prints
   the step peak that the run then logs, to the byte: data 2 x tensor 2 with SP under ZeRO-1, and
   context 2 x tensor 2; its collectives name DiT's layers.
5. Refused before anything is built (exit 2, naming the values): --data-file, --text and --vocab
   for DiT, --records without --labels, --objective for GPT-2, a tensor degree that does not divide
   the heads; and (exit 1) latents of the wrong shape and labels fewer than the latents, by file
   name.
6. --init-from the diffusers fixture (tests/fixtures/dit_diffusers, the tiny preset's sizes) trains
   from its weights (a first loss other than the seed's); a run whose --layers differs from its
   config.json is refused naming the field (exit 1: the import runs as the run starts).
"""
import json, os, re, subprocess, sys, tempfile

bin_ = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tools"))
import records  # noqa: E402  (tools/records.py)

work = tempfile.mkdtemp(prefix="weft_dit_train_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []


def run(name, args, want=0):
    log = os.path.join(work, name + ".jsonl")
    p = subprocess.run([bin_, "--model", "dit", "--log", log, *args], capture_output=True, text=True, env=env,
                       timeout=600)
    if p.returncode != want:
        failures.append(f"{name}: exit {p.returncode}, expected {want}\n{p.stdout}\n{p.stderr}")
        return {}, p.stdout + p.stderr, []
    if want != 0:
        return {}, p.stdout + p.stderr, []
    recs = [json.loads(line) for line in open(log)]
    return ({r["step"]: r["loss"] for r in recs if "loss" in r}, p.stdout,
            [r["eval_loss"] for r in recs if "eval_loss" in r])


def within(got, ref, what, tol=2e-5, steps=None):
    keys = steps or sorted(ref)
    worst = max((abs(got.get(s, float("inf")) - ref[s]) for s in keys), default=float("inf"))
    print(f"{what}: losses within {worst:.3g} of the reference's")
    if not (ref and worst <= tol):
        failures.append(f"{what}: {got} against {ref}")


# 1. It learns.
learn, out, evals = run("learn", ["--steps", "60", "--batch", "16", "--lr", "2e-3", "--eval-every", "60",
                                  "--data", "2", "--tensor", "2"])
if len(learn) == 60:
    first = sum(learn[s] for s in range(1, 6)) / 5
    last = sum(learn[s] for s in range(51, 61)) / 10
    print(f"60 steps: mean loss of the first 5 {first:.4f}, of the last 10 {last:.4f}")
    if not last < 0.6 * first:
        failures.append(f"the loss went from {first} to {last}:\n{out}")
learn16, _, _ = run("learn_bf16", ["--steps", "60", "--batch", "16", "--lr", "2e-3", "--eval-every", "0",
                                     "--data", "2", "--tensor", "2", "--dtype", "bf16"])
if len(learn) == 60 and len(learn16) == 60:
    t32, t16 = (sum(l[s] for s in range(51, 61)) / 10 for l in (learn, learn16))
    print(f"60 steps, mean of the last 10 losses: f32 {t32:.4f}, bf16 {t16:.4f}")
    if not abs(t16 - t32) <= 0.05:  # bf16's rounding in every op; the same data and schedule
        failures.append(f"bf16 ended at {t16} against f32's {t32}")
if "validation loss: t=0.25 " not in out or "t=0.5 " not in out or "t=0.75 " not in out or len(evals) != 1:
    failures.append(f"no validation at 0.25, 0.5 and 0.75 of the schedule:\n{out}")

# 2. Layouts, in f32.
short = ["--steps", "4", "--batch", "8", "--micro-batch", "4", "--eval-every", "0", "--seed", "3"]
one, _, _ = run("one", [*short, "--data", "1", "--tensor", "1"])
for name, args in (("data 2 x tensor 2, zero1-sp", ["--data", "2", "--tensor", "2", "--strategy", "zero1-sp"]),
                   ("pipe 2, zb", ["--data", "1", "--tensor", "1", "--pipe", "2", "--schedule", "zb"]),
                   ("context 2, ring", ["--data", "1", "--tensor", "1", "--context", "2"]),
                   ("data 2, fsdp", ["--data", "2", "--tensor", "1", "--strategy", "fsdp"])):
    got, _, _ = run(name.replace(" ", "_").replace(",", ""), [*short, *args])
    within(got, one, name)
flow_one, _, _ = run("flow_one", [*short, "--data", "1", "--tensor", "1", "--objective", "flow"])
flow_t2, _, _ = run("flow_t2", [*short, "--data", "1", "--tensor", "2", "--objective", "flow"])
within(flow_t2, flow_one, "rectified flow, tensor 2")
if flow_one and one and abs(flow_one[1] - one[1]) < 1e-3:
    failures.append(f"rectified flow's first loss {flow_one[1]} is DDPM's {one[1]}")

# 3. Records, saved on one mesh and resumed on another.
n = 48
latents = [((k * 7919 + i * 104729) % 1000) / 500.0 - 1.0 for k in range(n) for i in range(4 * 8 * 8)]
lat = os.path.join(work, "latents.bin")
lab = os.path.join(work, "labels.bin")
records.write(lat, "f32", (4, 8, 8), latents)
records.write(lab, "i32", (1,), [k % 10 for k in range(n)])
rec = ["--records", lat, "--labels", lab]
whole, _, _ = run("records", [*short, *rec, "--data", "1", "--tensor", "1"])
ck = os.path.join(work, "ck")
saved, _, _ = run("records_save", [*short, *rec, "--data", "2", "--tensor", "1", "--save-dir", ck, "--save-every", "2"])
resumed, _, _ = run("records_resume", [*short, *rec, "--data", "1", "--tensor", "2", "--resume",
                                      os.path.join(ck, "step_00000002")])
within(saved, whole, "records on data 2")
within(resumed, whole, "records resumed on tensor 2", steps=[3, 4])
if whole and one and abs(whole[1] - one[1]) < 1e-6:
    failures.append("the records' run gave the synthetic run's loss")

# 4. The plan, to the byte.
def plan_equals_run(name, args, rows):
    p = subprocess.run([bin_, "--model", "dit", "--plan", *args], capture_output=True, text=True, env=env, timeout=300)
    totals = [int(x) for x in re.findall(r"(?:step peak|pipe rank \d+:) (\d+) bytes", p.stdout)]
    log = os.path.join(work, name + ".jsonl")
    subprocess.run([bin_, "--model", "dit", "--log", log, *args, "--steps", "2", "--eval-every", "0"],
                   capture_output=True, text=True, env=env, timeout=300)
    peaks = [json.loads(l)["peak_bytes"] for l in open(log) if '"peak_bytes"' in l] if os.path.exists(log) else []
    ok = p.returncode == 0 and totals and peaks and all(x == max(totals) for x in peaks)
    ok = ok and all(re.search(r, p.stdout) for r in rows)
    print(f"--plan {' '.join(args)}: step peak {max(totals) if totals else None} bytes, the run's {peaks}")
    if not ok:
        failures.append(f"--plan {args}: exit {p.returncode}, planned {totals}, measured {peaks}\n{p.stdout}{p.stderr}")


plan_equals_run("plan", ["--data", "2", "--tensor", "2", "--strategy", "zero1-sp", "--batch", "8", "--micro-batch", "4"],
                [r"blocks\.0\.attn"])
plan_equals_run("plan_context", ["--data", "1", "--tensor", "2", "--context", "2", "--batch", "8"], [])

# 6. --init-from a diffusers directory (tests/fixtures/dit_diffusers: the tiny preset's sizes).
fixture = os.path.join(here, "..", "fixtures", "dit_diffusers")
warm, warm_out, _ = run("init_from", [*short, "--data", "1", "--tensor", "2", "--init-from", fixture])
if "initial weights: " not in warm_out or not warm or not one or abs(warm[1] - one[1]) < 1e-3:
    failures.append(f"--init-from {fixture}: {warm} against the seed's {one}\n{warm_out}")
print(f"--init-from the diffusers fixture: first loss {warm.get(1)}, the seed's {one.get(1)}")
# exit 1: the import runs when the run starts (it converts the directory), before any step
_, said, _ = run("init_from_bad", [*short, "--data", "1", "--tensor", "1", "--layers", "3", "--init-from", fixture], 1)
if "its config.json has layers 2; the run's model has 3" not in said:
    failures.append(f"--init-from with --layers 3 was not refused by name:\n{said}")

# 5. Refusals.
wrong = os.path.join(work, "wrong.bin")
records.write(wrong, "f32", (4, 4, 4), [0.0] * (4 * 4 * 4 * 8))
few = os.path.join(work, "few.bin")
records.write(few, "i32", (1,), list(range(10)))
tiny = ["--steps", "1", "--batch", "8", "--data", "1"]
for want, fragment, args in (
        (2, "the model family 'dit' reads no tokens", ["--tensor", "1", "--data-file", lat]),
        (2, "the model family 'dit' reads no tokens", ["--text", lat]),
        (2, "the model family 'dit' has no vocabulary", ["--vocab", "64"]),
        (2, "--labels", ["--labels", lab]),
        (2, "no --labels", ["--records", lat]),
        (2, "4 heads over a tensor degree of 3", ["--tensor", "3"]),
        (1, "wrong.bin", ["--records", wrong, "--labels", lab]),
        (1, "holds 10 labels for 48 latents", ["--records", lat, "--labels", few])):
    _, said, _ = run("refuse", [*tiny, *args], want)
    if fragment not in said:
        failures.append(f"{args}: exit {want} without '{fragment}':\n{said}")
p = subprocess.run([bin_, "--model", "gpt2", "--objective", "flow", "--steps", "1"], capture_output=True, text=True,
                   env=env, timeout=120)
if p.returncode != 2 or "the model family 'gpt2' reads tokens" not in p.stdout + p.stderr:
    failures.append(f"--objective for GPT-2: exit {p.returncode}\n{p.stdout}\n{p.stderr}")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("weft-train --model dit: all checks passed")
