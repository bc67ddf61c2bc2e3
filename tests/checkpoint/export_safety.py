#!/usr/bin/env python3
"""weft-export never loses data (checkpoint/export_dir.hpp):

  export_safety.py TRAIN_GPT WEFT_EXPORT

1. --out inside the checkpoint it reads is refused, and the checkpoint's files keep their bytes:
   GPT-2's rank file and manifest named as --out, a consolidated Llama checkpoint's own step
   directory, a file in the run directory beside `latest`; --logits inside it likewise.
2. A directory that holds files no export of weft's wrote (another model's shards and config.json)
   is refused, and its files keep their bytes.
3. An export into an earlier export's directory replaces that export's files and nothing else: a
   sharded Llama export, then one file: the shards go, a file the user put beside them stays.
4. A write that fails part-way (the file-size limit, as a full disk would) exits 1, leaves the
   earlier export's file whole under its name, and no .tmp behind.
5. --logits to /dev/full exits 1 saying so (no space left on device); --max-shard-bytes 0 is refused
   by its rule, not with a 309-digit bound.
6. The manifest records the family that saved it ("family": "gpt2"); a checkpoint whose family has
   no export here is refused by its name, and weft-train --model llama refuses (exit 2) to resume
   GPT-2's checkpoint, naming both families.
Each case: the exit status, the message, and the bytes (XXH3 would do; SHA-256 here) of what must not
change.
"""
import hashlib, os, resource, shutil, signal, subprocess, sys, tempfile

train, export = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="weft_export_safety_")
env = dict(os.environ, ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=0")
failures = 0


def run(binary, args, limit=None):
    def pre():
        if limit is not None:  # a full disk, as the file-size limit makes it: writes past it fail (EFBIG)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    p = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=300, preexec_fn=pre)
    return p.returncode, p.stdout + p.stderr


def digest(path):
    """Every file under path (or path itself) with its SHA-256."""
    files = [path] if os.path.isfile(path) else sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
    return {f: hashlib.sha256(open(f, "rb").read()).hexdigest() for f in files}


def check(name, ok, detail=""):
    global failures
    print(f"{'ok' if ok else 'FAIL'}: {name}" + (f" ({detail})" if detail and not ok else ""))
    failures += not ok


def refused(name, args, message, guarded, binary=export):
    before = digest(guarded)
    rc, out = run(binary, args)
    check(name, rc == 1 and message in out and digest(guarded) == before, f"exit {rc}, printed {out[-400:]!r}")


# The checkpoints: GPT-2 (sharded, data 2 x tensor 2) and a consolidated Llama, each saved at step 2.
gpt, llama = os.path.join(work, "gpt"), os.path.join(work, "llama")
small = ["--steps", "2", "--eval-every", "0", "--batch", "4", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "16"]
for name, args in (("gpt", [*small, "--save-dir", gpt]),
                   ("llama", [*small, "--model", "llama", "--kv-heads", "2", "--save-dir", llama, "--save-policy", "consolidated"])):
    rc, out = run(train, args)
    if rc != 0:
        sys.exit(f"the {name} run failed (exit {rc}):\n{out}")
step_g, step_l = os.path.join(gpt, "step_00000002"), os.path.join(llama, "step_00000002")

# 1. Inside the checkpoint.
inside = "is inside the checkpoint it exports"
refused("--out a rank file of the checkpoint", ["--checkpoint", gpt, "--out", os.path.join(step_g, "rank_00000.safetensors")],
        inside, gpt)
refused("--out the checkpoint's manifest", ["--checkpoint", step_g, "--out", os.path.join(step_g, "manifest.json")], inside, gpt)
refused("--out beside latest", ["--checkpoint", step_g, "--out", os.path.join(gpt, "model.safetensors")], inside, gpt)
refused("a Llama export into its own step directory", ["--checkpoint", llama, "--out", step_l], inside, llama)
refused("--logits inside the checkpoint", ["--checkpoint", gpt, "--out", os.path.join(work, "ok", "model.safetensors"),
                                           "--tokens", "1,2", "--logits", os.path.join(step_g, "logits.f32")], inside, gpt)

# 2. Another model's directory.
other = os.path.join(work, "other")
os.mkdir(other)
for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
    open(os.path.join(other, f), "w").write(f"another model's {f}\n")
refused("a Llama export into another model's directory", ["--checkpoint", llama, "--out", other],
        "and no weft_export.json: not an earlier export", other)
refused("a GPT-2 export into another model's directory", ["--checkpoint", gpt, "--out", os.path.join(other, "model.safetensors")],
        "and no weft_export.json: not an earlier export", other)

# 3. An earlier export's directory: sharded, then one file.
mine = os.path.join(work, "mine")
rc, out = run(export, ["--checkpoint", llama, "--out", mine, "--max-shard-bytes", "20000"])
shards = sorted(f for f in os.listdir(mine) if f.startswith("model-")) if rc == 0 else []
check("a sharded Llama export", rc == 0 and len(shards) > 1, f"exit {rc}, {shards}, {out[-300:]!r}")
open(os.path.join(mine, "tokenizer.json"), "w").write("the user's\n")
rc, out = run(export, ["--checkpoint", llama, "--out", mine])
left = sorted(os.listdir(mine))
check("exported again into it: the shards replaced by one file, the user's file kept",
      rc == 0 and left == ["config.json", "model.safetensors", "tokenizer.json", "weft_export.json"], f"exit {rc}, {left}")

# 4. A write that fails part-way leaves the earlier export whole.
gexp = os.path.join(work, "gpt_export")
rc, out = run(export, ["--checkpoint", gpt, "--out", os.path.join(gexp, "model.safetensors")])
check("a GPT-2 export", rc == 0, out[-300:])
before = digest(gexp)
size = os.path.getsize(os.path.join(gexp, "model.safetensors"))
rc, out = run(export, ["--checkpoint", gpt, "--out", os.path.join(gexp, "model.safetensors")], limit=size // 2)
check("a full disk part-way: exit 1, the earlier export whole, no .tmp left",
      rc == 1 and "File too large" in out and digest(gexp) == before and not any(f.endswith(".tmp") for f in os.listdir(gexp)),
      f"exit {rc}, {sorted(os.listdir(gexp))}, printed {out[-300:]!r}")

# 5. Write errors and the shard bound's refusal.
rc, out = run(export, ["--checkpoint", gpt, "--out", os.path.join(work, "e5", "model.safetensors"), "--tokens", "1,2",
                       "--logits", "/dev/full"])
check("--logits /dev/full: exit 1, no space left", rc == 1 and "No space left on device" in out, f"exit {rc}, {out[-300:]!r}")
rc, out = run(export, ["--checkpoint", llama, "--out", os.path.join(work, "e6"), "--max-shard-bytes", "0"])
check("--max-shard-bytes 0: refused by its rule", rc == 2 and "0 is out of range: use a number >= 1" in out and len(out) < 400,
      f"exit {rc}, {out[-300:]!r}")

# 6. The manifest names the family that saved it: a checkpoint of a family weft-export does not know
# is refused by that name, and weft-train refuses to resume one family's checkpoint as another's.
import json
manifest = json.load(open(os.path.join(step_g, "manifest.json")))
check("the manifest records the family", manifest.get("family") == "gpt2", f"family {manifest.get('family')!r}")
alien = os.path.join(work, "alien")
shutil.copytree(step_g, alien)
manifest["family"] = "mine"
json.dump(manifest, open(os.path.join(alien, "manifest.json"), "w"))
refused("a checkpoint of another family", ["--checkpoint", alien, "--out", os.path.join(work, "e7", "model.safetensors")],
        "holds a model of the family 'mine', which has no Hugging Face export here", alien)
longer = [*small]
longer[longer.index("--steps") + 1] = "4"  # past the checkpoint's step 2
rc, out = run(train, [*longer, "--model", "llama", "--kv-heads", "2", "--resume", step_g])
check("--model llama --resume a GPT-2 checkpoint: refused by the family's name (exit 2)",
      rc == 2 and f"--resume: the checkpoint {step_g} holds a model of the family 'gpt2'; this run trains 'llama'; give --model gpt2" in out,
      f"exit {rc}, {out[-400:]!r}")

shutil.rmtree(work, ignore_errors=True)
if failures:
    sys.exit(f"{failures} cases failed")
print("weft-export: every case passed")
