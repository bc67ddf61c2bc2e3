#!/usr/bin/env python3
"""A family shipped by name (docs/training.md, "Shipping a family"): weft's own weft-train, weft-plan
and weft-export built over the list `custom` (tests/CMakeLists.txt: weft_add_trainer and
weft_add_family_program with FAMILIES custom, the header tests/examples/families/weft/models/custom/
family.hpp), against the custom decoder's one-line trainer:

  shipped_family.py TRAIN_GPT_CUSTOM WEFT_PLAN_CUSTOM WEFT_EXPORT_CUSTOM CUSTOM_MODEL_TRAIN

1. weft-train over `custom` trains the custom decoder: 4 steps on data 2 x tensor 2 (ZeRO-1 with SP)
   log the same losses, bit for bit, as custom_model_train's (the same family through the same
   library: the same instantiations, a unit generated instead of one written by hand).
2. Its --help offers `custom` as the only model, and what it did not compile is refused naming the
   option and listing what it did: --dtype f64 (the build keeps f32 alone), --context 2.
3. weft-plan over `custom` plans it (the step measured on the Meta device): exit 0, the family's
   name and a ranked table.
4. weft-export over `custom` refuses the checkpoint weft-train saved, naming the family and that it
   has no Hugging Face export (exit 1), and writes nothing.
"""
import json, os, subprocess, sys, tempfile

train, plan, export, reference = sys.argv[1:5]
work = tempfile.mkdtemp(prefix="weft_shipped_family_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []
common = ["--dtype", "f32", "--steps", "4", "--batch", "8", "--micro-batch", "4", "--eval-every", "0", "--seq", "16",
          "--width", "32", "--lr", "3e-3", "--seed", "5", "--data", "2", "--tensor", "2", "--strategy", "zero1-sp"]

def losses(name, binary, extra=()):
    log = os.path.join(work, name + ".jsonl")
    p = subprocess.run([binary, *common, "--log", log, *extra], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        failures.append(f"{name}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, open(log)) if "loss" in r}

ck = os.path.join(work, "ck")
got = losses("weft-train over custom", train, ["--save-dir", ck])
want = losses("custom_model_train", reference)
print("weft-train over custom: " + ", ".join(f"{got[s]!r}" for s in sorted(got)))
print("custom_model_train:    " + ", ".join(f"{want[s]!r}" for s in sorted(want)))
if sorted(got) != [1, 2, 3, 4] or got != want:
    failures.append(f"the losses differ (bit for bit expected): {got} against {want}")

p = subprocess.run([train, "--help"], capture_output=True, text=True, env=env, timeout=60)
if p.returncode != 0 or "model family: custom (default: custom)" not in p.stdout:
    failures.append(f"weft-train --help over custom: exit {p.returncode}\n{p.stdout}")
for args, message in ((["--dtype", "f64"], "precision 'f64' is not compiled for the model family 'custom'; use one of: f32; "
                                           "this binary compiled custom on host: plain in f32 | custom on host with SP: plain in f32"),
                      (["--context", "2"], "--context 2: the model family 'custom' has no context-parallel attention")):
    p = subprocess.run([train, *args], capture_output=True, text=True, env=env, timeout=120)
    ok = p.returncode == 2 and message in p.stderr
    print(f"weft-train over custom {' '.join(args)}: exit {p.returncode}{'' if ok else ' (FAIL)'}")
    if not ok: failures.append(f"{args}: exit {p.returncode}, wanted 2 and '{message}':\n{p.stdout}{p.stderr}")

p = subprocess.run([plan, "--gpus", "16", "--batch", "64", "--micro", "2"], capture_output=True, text=True, env=env, timeout=300)
ok = p.returncode == 0 and "weft-plan: custom: " in p.stdout and "tokens/s" in p.stdout
print(f"weft-plan over custom: exit {p.returncode}{'' if ok else ' (FAIL)'}")
if not ok: failures.append(f"weft-plan over custom: exit {p.returncode}\n{p.stdout}\n{p.stderr}")

out = os.path.join(work, "hf")
p = subprocess.run([export, "--checkpoint", ck, "--out", out], capture_output=True, text=True, env=env, timeout=120)
message = "holds a model of the family 'custom', which has no Hugging Face export"
ok = p.returncode == 1 and message in p.stderr and not os.path.exists(out)
print(f"weft-export over custom: exit {p.returncode}{'' if ok else ' (FAIL)'}: {p.stderr.strip()}")
if not ok: failures.append(f"weft-export over custom: exit {p.returncode}, wanted 1 and '{message}'\n{p.stdout}{p.stderr}")

if failures:
    print("\n".join(["FAIL:"] + failures))
    sys.exit(1)
print("a family shipped by name: every check passed")
