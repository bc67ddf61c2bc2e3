#!/usr/bin/env python3
"""weft-train --model qwen3-moe (Qwen3-MoE through weft's trainer: Mixtral's experts with Qwen3's
attention, heads of a size of their own and QK norm), checked by what it computes:

  weft_train_qwen3_moe.py WEFT_TRAIN WEFT_EXPORT [--through-transformers]

1. qwen3-moe-tiny on the built-in corpus, data 2 x expert 2, 30 steps with sigmoid scores and an
   expert bias (--router sigmoid --expert-bias 1e-2, aux-loss-free balancing: the softmax router's
   learning is weft_train_mixtral.py's): the mean loss of the last 10 below 0.8 of the first 5's,
   every record carrying the routers' aux loss and expert load.
2. The same 4 steps on one rank, on data 2 x tensor 2 x expert 2 with SP under ZeRO-1 (the QK norms'
   gradients summed over the tensor ranks' heads) and on pipe 2 x data 2 x expert 2: every logged
   loss within 2e-5 of one rank's (f32 sums in other orders; tests/models/qwen3_moe holds the layouts
   to 1e-12 in f64).
3. --init-from the directory save_pretrained wrote for the reference model (tests/fixtures/qwen3_moe/hf,
   float64) without --preset trains the model its config.json describes (heads of 8, QK norm, the top
   2 not renormalised); one step at a learning rate of 1e-30 on data 2 x expert 2, saved and exported,
   gives transformers' logits of the reference's tokens within 1e-5 of the largest (f32). The same
   from tests/fixtures/qwen3_moe/dense/hf (3 layers, layer 1 dense by mlp_only_layers) on pipe 3, so
   that the middle stage holds no router; and that model trained 4 steps on pipe 3 gives one rank's
   losses and aux losses within 2e-5. A config.json that makes a layer with a router dense is refused
   by name before anything is built (exit 2).
4. --through-transformers (a CTest test of its own, skipped with 77 without PyTorch and
   transformers): Qwen3MoeForCausalLM.from_pretrained reads part 3's exports: their weights are the
   fixtures' rounded to f32, bit for bit, and their logits are weft's within 1e-5 of the largest.
"""
import json, os, re, struct, subprocess, sys, tempfile

from hf_checks import relative, safetensors  # tests/examples/hf_checks.py

through_transformers = "--through-transformers" in sys.argv
sys.argv = [a for a in sys.argv if a != "--through-transformers"]
if through_transformers:
    try:
        import torch
        from transformers import Qwen3MoeForCausalLM
    except ImportError as e:
        print(f"SKIPPED: the export through transformers needs PyTorch and transformers ({e})")
        sys.exit(77)
bin_, export_bin = sys.argv[1], sys.argv[2]
fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "qwen3_moe")
work = tempfile.mkdtemp(prefix="weft_qwen3_moe_train_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []


def run(name, args, want=0):
    log = os.path.join(work, name + ".jsonl")
    p = subprocess.run([bin_, "--model", "qwen3-moe", "--log", log, *args], capture_output=True, text=True,
                       env=env, timeout=600)
    if p.returncode != want:
        failures.append(f"{name}: exit {p.returncode}, expected {want}\n{p.stdout}\n{p.stderr}")
        return {}, p.stdout + p.stderr
    if want != 0:
        return {}, p.stdout + p.stderr
    return {r["step"]: r for r in map(json.loads, open(log)) if "loss" in r}, p.stdout



if not through_transformers:
    # 1. It learns.
    learn, out = run("learn", ["--steps", "30", "--batch", "16", "--data", "2", "--tensor", "1", "--expert", "2",
                               "--eval-every", "0", "--router", "sigmoid", "--expert-bias", "1e-2"])
    if len(learn) == 30:
        first = sum(learn[s]["loss"] for s in range(1, 6)) / 5
        last = sum(learn[s]["loss"] for s in range(21, 31)) / 10
        load = [sum(learn[s]["expert_load"] for s in r) / len(r) for r in (range(1, 6), range(21, 31))]
        print(f"30 steps on data 2 x expert 2 with --router sigmoid --expert-bias 1e-2: mean loss of the first 5 "
              f"{first:.4f}, of the last 10 {last:.4f}; mean expert load {load[0]:.3f}, then {load[1]:.3f}")
        if not last < 0.8 * first:
            failures.append(f"the loss went from {first} to {last}:\n{out}")
        if not all(1 <= r.get("aux_loss", float("nan")) <= 8 and r.get("expert_load", float("nan")) >= 1
                   for r in learn.values()):
            failures.append(f"the routers' records: {learn[30]}")
    # 2. Layouts against one rank.
    steps = ["--steps", "4", "--batch", "16", "--eval-every", "0", "--lr", "3e-3"]
    one, _ = run("one", steps + ["--data", "1", "--tensor", "1"])
    for name, args in [("data 2 x tensor 2 x expert 2, zero1-sp", ["--data", "2", "--tensor", "2", "--expert", "2",
                                                                   "--strategy", "zero1-sp"]),
                       ("pipe 2 x data 2 x expert 2", ["--data", "2", "--tensor", "1", "--pipe", "2", "--expert",
                                                       "2"])]:
        got, _ = run(re.sub(r"[^a-z0-9]+", "_", name), steps + args)
        worst = max((abs(got[s]["loss"] - one[s]["loss"]) if s in got else float("inf") for s in one),
                    default=float("inf"))
        print(f"{name}: losses within {worst:.3g} of one rank's")
        if not (one and worst <= 2e-5):
            failures.append(f"{name}: {got} against {one}")

# 3. In from a transformers directory, out to one: every layer sparse on data 2 x expert 2, and with
# a dense layer on pipe 3 (its middle stage the dense layer alone).
exports = []  # (the export, the fixture's directory, weft's logits)
for name, where, layout, want in [
        ("from_hf", fixture, ["--data", "2", "--tensor", "1", "--expert", "2"],
         "heads 4 of 8 (2 key-value, QK norm), width 16, 4 experts of width 8 (top 2), aux coef 0.001, seq 8, "
         "vocab 32"),
        ("from_hf_dense", os.path.join(fixture, "dense"), ["--data", "1", "--tensor", "1", "--pipe", "3"],
         "layers 3, heads 4 of 8 (2 key-value, QK norm), width 16, 4 experts of width 8 (top 2), dense layers 1 "
         "of width 24, aux coef 0.001")]:
    exported = os.path.join(work, name + "_export")
    ref = safetensors(os.path.join(where, "reference.safetensors"))
    (rows, cols), tokens = ref["tokens"]
    ck = os.path.join(work, name)
    losses, out = run(name, ["--init-from", os.path.join(where, "hf"), "--steps", "1", "--lr", "1e-30", "--min-lr",
                             "0", "--warmup", "0", "--clip", "0", "--eval-every", "0", "--seq", str(cols), "--batch",
                             "4", "--save-dir", ck] + layout)
    if losses and want not in out:
        failures.append(f"{name}: --init-from without --preset: wanted '{want}' in:\n{out}")
    logits_f = os.path.join(work, name + ".f32")
    p = subprocess.run([export_bin, "--checkpoint", ck, "--out", exported, "--tokens",
                        ",".join(str(int(t)) for t in tokens[:cols]), "--logits", logits_f], capture_output=True,
                       text=True, env=env, timeout=300)
    if p.returncode != 0:
        failures.append(f"weft-export of {name}: exit {p.returncode}\n{p.stdout}{p.stderr}")
        continue
    raw = open(logits_f, "rb").read()
    weft_logits = struct.unpack(f"<{len(raw) // 4}f", raw)
    exports.append((exported, os.path.join(where, "hf"), weft_logits, tokens[:cols]))
    err = relative(weft_logits, ref["logits"][1][:cols * 32])
    print(f"{name}: --init-from the transformers directory on {' '.join(layout)}, saved and exported: logits within "
          f"{err:.3g} of transformers' (relative to the largest)")
    if not err <= 1e-5:  # f32 weights and sums against float64
        failures.append(f"{name}: logits off transformers' by {err}")
if not through_transformers:
    # The dense layer's model trained on pipe 3 against one rank.
    dense = ["--init-from", os.path.join(fixture, "dense", "hf"), "--steps", "4", "--lr", "3e-3", "--seq", "8",
             "--batch", "8", "--eval-every", "0", "--tensor", "1", "--data", "1"]
    one, _ = run("dense_one", dense)
    got, _ = run("dense_pipe3", dense + ["--pipe", "3"])
    worst = max((max(abs(got[s]["loss"] - one[s]["loss"]), abs(got[s]["aux_loss"] - one[s]["aux_loss"]))
                 if s in got else float("inf") for s in one), default=float("inf"))
    print(f"a dense layer, pipe 3 (a stage without a router): losses and aux losses within {worst:.3g} of one rank's")
    if not (one and worst <= 2e-5):
        failures.append(f"dense layer on pipe 3: {got} against {one}")
if not through_transformers:
    bad = os.path.join(work, "bad_hf")
    os.makedirs(bad, exist_ok=True)
    cfg = json.load(open(os.path.join(fixture, "hf", "config.json")))
    cfg["mlp_only_layers"] = [1]
    json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    os.symlink(os.path.join(os.path.abspath(fixture), "hf", "model.safetensors"), os.path.join(bad, "model.safetensors"))
    _, err = run("bad_hf", ["--init-from", bad, "--seq", "8", "--batch", "4", "--data", "1", "--tensor", "1"], want=2)
    print(f"refused (mlp_only_layers [1] over a router): {err.strip().splitlines()[-1] if err else ''}")
    if "has model.layers.1.mlp.gate.weight, a router in layer 1, which config.json makes dense" not in err:
        failures.append(f"a config.json that makes a layer with a router dense: {err}")

# 4. The exports read back by transformers.
for exported, source, weft_logits, tokens in exports if through_transformers else []:
    theirs = Qwen3MoeForCausalLM.from_pretrained(exported, dtype=torch.float32)
    first = Qwen3MoeForCausalLM.from_pretrained(source, dtype=torch.float64)
    a, b = theirs.state_dict(), first.state_dict()
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)
    print(f"from_pretrained of {exported}: weights {'the fixture' if same else 'NOT the fixture'}'s rounded to f32")
    if not same:
        failures.append(f"{exported}: weights not the fixture's rounded to f32")
    with torch.no_grad():
        logits = theirs(input_ids=torch.tensor([[int(t) for t in tokens]])).logits.reshape(-1).tolist()
    err = relative(logits, list(weft_logits))
    print(f"from_pretrained of {exported}: logits within {err:.3g} of weft's (relative to the largest)")
    if not err <= 1e-5:  # f32 sums in other orders
        failures.append(f"{exported}: transformers' logits off weft's by {err}")

if failures:
    print("\n".join(["FAILED:"] + failures))
    sys.exit(1)
print("weft-train --model qwen3-moe: all checks passed")
