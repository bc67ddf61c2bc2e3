#!/usr/bin/env python3
"""weft-train --model mixtral (a mixture of experts through weft's trainer, --expert N sharding its
experts over groups of the data ranks), checked by what it computes:

  weft_train_mixtral.py WEFT_TRAIN [WEFT_EXPORT] [--through-transformers]

1. mixtral-tiny (4 experts, top 2) on the built-in corpus, data 2 x expert 2, 30 steps: the mean
   loss of the last 10 steps is below 0.75 of the first 5's; every step's record carries the
   routers' aux loss (finite, between 1 and E k: a router's E sum f_e P_e is k when balanced, at
   most E k), z-loss (positive), expert load (at least 1: the busiest expert over the mean) and no
   dropped tokens (dropless); the progress line shows them.
2. The same 4 steps on one rank and on data 2 x expert 2, data 4 x expert 4 under FSDP, data 2 x
   tensor 2 x expert 2 with SP under ZeRO-1, pipe 2 x data 2 x expert 2 and pipe 2 x data 2 x
   tensor 2 x expert 2 with SP under ZeRO-1 (weft-train's experts split over the tensor ranks:
   nn::ExpertTensor::sharded): every logged loss and aux loss within 2e-5 of one rank's (f32 sums
   in other orders; tests/nn/moe.cpp and tests/models/mixtral hold the layouts to 1e-12 in f64).
3. A checkpoint of data 4 x expert 4 at step 2, resumed on data 2 x expert 2: steps 3 and 4 equal
   the uninterrupted run's within 2e-5 (each expert's weights and optimizer state found under
   another expert degree); resuming it as --model llama is refused naming the family (exit 2).
4. --plan on data 2 x expert 2 counts the expert axis's all-to-alls: per layer and micro-batch the
   counts' all-to-all and dispatch and combine forward, combine's and dispatch's adjoints backward
   (5 calls), and its step peak is within 10% of the run's logged peak (the plan routes every
   expert the same share of the tokens; a run's routing is uneven).
5. Refused before anything is built (exit 2, naming the values): an expert degree that does not
   divide the data ranks, experts that the expert degree does not divide, a top-k above the
   experts, a negative capacity factor, --expert for a dense family, --experts for GPT-2,
   --router for GPT-2.
6. Aux-loss-free balancing (--router sigmoid --expert-bias RATE; weft_train_qwen3_moe.py's learning
   run trains with it): no z-loss, and the summary names the router; 4 steps on data 2 x tensor 2 x
   expert 2 (ZeRO-1, SP) equal one rank within 2e-5; a
   checkpoint of data 4 x expert 4 resumed on data 2 x expert 2 equals the whole run (the biases
   saved and resharded), and resumed without --expert-bias is refused naming the field (before
   anything is built: exit 2); weft-export refuses it (transformers' Mixtral has no such router).
   Group-limited routing (--expert-groups 4 --top-groups 2 over 8 experts) on data 2 x expert 2
   equals one rank within 2e-5; groups that do not divide the experts, and top groups too few for
   the top k, are refused (exit 2).
"""
import json, os, re, struct, subprocess, sys, tempfile

from hf_checks import relative, safetensors  # tests/examples/hf_checks.py

through_transformers = "--through-transformers" in sys.argv
sys.argv = [a for a in sys.argv if a != "--through-transformers"]
if through_transformers:
    try:
        import torch
        from transformers import MixtralForCausalLM
    except ImportError as e:
        print(f"SKIPPED: the export through transformers needs PyTorch and transformers ({e})")
        sys.exit(77)
bin_ = sys.argv[1]
export_bin = sys.argv[2] if len(sys.argv) > 2 else None
fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "mixtral")
work = tempfile.mkdtemp(prefix="weft_mixtral_train_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []


def run(name, args, want=0, model="mixtral"):
    log = os.path.join(work, name + ".jsonl")
    p = subprocess.run([bin_, "--model", model, "--log", log, *args], capture_output=True, text=True, env=env,
                       timeout=600)
    if p.returncode != want:
        failures.append(f"{name}: exit {p.returncode}, expected {want}\n{p.stdout}\n{p.stderr}")
        return {}, p.stdout + p.stderr
    if want != 0 or "--plan" in args:
        return {}, p.stdout + p.stderr
    recs = [json.loads(line) for line in open(log)]
    return {r["step"]: r for r in recs if "loss" in r}, p.stdout


def within(got, ref, what, field="loss", tol=2e-5, steps=None):
    keys = steps or sorted(ref)
    worst = max((abs(got[s][field] - ref[s][field]) if s in got else float("inf") for s in keys),
                default=float("inf"))
    print(f"{what}: {field} within {worst:.3g} of the reference's")
    if not (ref and worst <= tol):
        failures.append(f"{what}: {field} {[got.get(s, {}).get(field) for s in keys]} against "
                        f"{[ref[s][field] for s in keys]}")


if not through_transformers:  # parts 1 to 5
    # 1. It learns, and says what its routers did.
    learn, out = run("learn", ["--steps", "30", "--batch", "16", "--data", "2", "--tensor", "1", "--expert", "2",
                               "--eval-every", "0"])
    if len(learn) == 30:
        first = sum(learn[s]["loss"] for s in range(1, 6)) / 5
        last = sum(learn[s]["loss"] for s in range(21, 31)) / 10
        print(f"30 steps on data 2 x expert 2: mean loss of the first 5 {first:.4f}, of the last 10 {last:.4f}")
        if not last < 0.75 * first:
            failures.append(f"the loss went from {first} to {last}:\n{out}")
        E, k = 4, 2
        for s, r in learn.items():
            ok = (1 <= r.get("aux_loss", float("nan")) <= E * k and r.get("z_loss", float("nan")) > 0
                  and r.get("expert_load", float("nan")) >= 1 and r.get("dropped_tokens") == 0)
            if not ok:
                failures.append(f"step {s}'s record: {r}")
                break
        print(f"step 30's routers: aux {learn[30]['aux_loss']:.4f}, z {learn[30]['z_loss']:.4f}, "
              f"load {learn[30]['expert_load']:.3f}, dropped {learn[30]['dropped_tokens']}")
        if not re.search(r"step +30/30 \| loss [0-9.]+ \(floor [-+0-9.]+\) \| aux [0-9.]+ load [0-9.]+ dropped 0 \|", out):
            failures.append(f"the progress line does not show the routers:\n{out[-600:]}")

    # 2. Every layout equals one rank.
    steps = ["--steps", "4", "--batch", "16", "--eval-every", "0", "--lr", "1e-2"]
    one, _ = run("one", steps + ["--data", "1", "--tensor", "1"])
    for name, args in [("data 2 x expert 2", ["--data", "2", "--tensor", "1", "--expert", "2"]),
                       ("data 4 x expert 4, fsdp", ["--data", "4", "--tensor", "1", "--expert", "4",
                                                    "--strategy", "fsdp"]),
                       ("data 2 x tensor 2 x expert 2, zero1-sp", ["--data", "2", "--tensor", "2", "--expert", "2",
                                                                   "--strategy", "zero1-sp"]),
                       ("pipe 2 x data 2 x expert 2", ["--data", "2", "--tensor", "1", "--pipe", "2", "--expert", "2"]),
                       ("pipe 2 x data 2 x tensor 2 x expert 2, zero1-sp",
                        ["--data", "2", "--tensor", "2", "--pipe", "2", "--expert", "2", "--strategy", "zero1-sp"])]:
        got, _ = run(re.sub(r"[^a-z0-9]+", "_", name), steps + args)
        within(got, one, name)
        within(got, one, name, field="aux_loss")

    # 3. A checkpoint resharded across expert degrees.
    ck = os.path.join(work, "ck")
    whole, _ = run("save", steps + ["--data", "4", "--tensor", "1", "--expert", "4", "--save-dir", ck, "--save-every",
                                    "2"])  # saved at step 2, and on to step 4: the uninterrupted run
    resumed, _ = run("resumed", steps + ["--data", "2", "--tensor", "1", "--expert", "2", "--resume",
                                         os.path.join(ck, "step_00000002")])
    within(resumed, whole, "resumed on data 2 x expert 2 from data 4 x expert 4 at step 2", steps=[3, 4])
    _, err = run("resume_dense", steps + ["--data", "1", "--tensor", "1", "--resume", os.path.join(ck, "step_00000002")],
                 want=2, model="llama")
    if "holds a model of the family 'mixtral'" not in err:
        failures.append(f"a Mixtral checkpoint resumed as Llama: {err}")

    # 4. The plan counts the exchange.
    _, plan = run("plan", ["--data", "2", "--tensor", "1", "--expert", "2", "--plan"])
    m = re.search(r"expert all_to_all (\d+) calls (\d+) bytes", plan)
    layers = 2
    print(f"--plan on data 2 x expert 2: {m.group(0) if m else 'no expert all-to-all'}")
    if not m or int(m.group(1)) != 5 * layers:
        failures.append(f"--plan's expert collectives:\n{plan}")
    peak = re.search(r"step peak (\d+) bytes", plan)
    learn_peak = max(r["peak_bytes"] for r in learn.values()) if learn else None
    if peak and learn_peak:
        print(f"step peak: planned {peak.group(1)} bytes, the run's largest {learn_peak}")
        if not abs(int(peak.group(1)) - learn_peak) <= 0.1 * learn_peak:
            failures.append(f"planned peak {peak.group(1)} against the run's {learn_peak}")
    else:
        failures.append(f"no step peak in the plan or the run:\n{plan}")

    # 5. Refusals.
    for name, args, model, text in [
        ("expert 3 of data 2", ["--data", "2", "--tensor", "1", "--expert", "3"], "mixtral", "which 3 does not divide"),
        ("3 experts over expert 2", ["--data", "2", "--tensor", "1", "--expert", "2", "--experts", "3"], "mixtral",
         "3 experts, top 2, over an expert degree of 2"),
        ("top 5 of 4", ["--data", "1", "--tensor", "1", "--top-k", "5"], "mixtral", "4 experts, top 5"),
        ("capacity -1", ["--data", "1", "--tensor", "1", "--capacity-factor", "-1"], "mixtral", "capacity factor -1"),
        ("llama with --expert", ["--data", "2", "--tensor", "1", "--expert", "2"], "llama", "has no experts to shard"),
        ("gpt2 with --experts", ["--data", "1", "--tensor", "1", "--experts", "4"], "gpt2", "has no experts"),
        ("gpt2 with --router", ["--data", "1", "--tensor", "1", "--router", "sigmoid"], "gpt2", "has no experts"),
        ("4 experts in 3 groups", ["--data", "1", "--tensor", "1", "--expert-groups", "3"], "mixtral",
         "Mixtral: 4 experts in 3 groups (--expert-groups)"),
        ("top 3 from 1 of 4 groups", ["--data", "1", "--tensor", "1", "--experts", "8", "--top-k", "3",
                                      "--expert-groups", "4", "--top-groups", "1"], "mixtral",
         "Mixtral: top 3 from 1 of 4 groups of 2 experts (--top-groups)"),
        ("gpt2 with --expert-groups", ["--data", "1", "--tensor", "1", "--expert-groups", "2"], "gpt2",
         "has no experts"),
    ]:
        _, err = run("refused", ["--steps", "2", *args], want=2, model=model)
        print(f"refused ({name}): {err.strip().splitlines()[-1] if err.strip() else ''}")
        if text not in err:
            failures.append(f"{name}: expected '{text}' in:\n{err}")




    # 6. Aux-loss-free balancing: sigmoid scores and an expert bias.
    balance = ["--router", "sigmoid", "--expert-bias", "1e-2"]
    one_b, out = run("one_balanced", steps + ["--data", "1", "--tensor", "1", *balance])
    if any(r.get("z_loss") != 0 for r in one_b.values()) or "by sigmoid scores, an expert bias at rate 0.01" not in out:
        failures.append(f"sigmoid router: z losses {[r.get('z_loss') for r in one_b.values()]}, summary:\n{out[:600]}")
    got, _ = run("balanced_zero1_sp", steps + ["--data", "2", "--tensor", "2", "--expert", "2", "--strategy",
                                               "zero1-sp", *balance])
    within(got, one_b, "balanced: data 2 x tensor 2 x expert 2, zero1-sp")
    ckb = os.path.join(work, "ck_balanced")
    whole_b, _ = run("save_balanced", steps + ["--data", "4", "--tensor", "1", "--expert", "4", "--save-dir", ckb,
                                               "--save-every", "2", *balance])
    resumed_b, _ = run("resumed_balanced", steps + ["--data", "2", "--tensor", "1", "--expert", "2", "--resume",
                                                    os.path.join(ckb, "step_00000002"), *balance])
    within(resumed_b, whole_b, "balanced, resumed on data 2 x expert 2 from data 4 x expert 4 at step 2", steps=[3, 4])
    # Group-limited routing (DeepSeek-V3's): 8 experts in 4 groups, each token's top 2 from its best 2
    # groups, on data 2 x expert 2 equal to one rank.
    grouped = balance + ["--experts", "8", "--expert-groups", "4", "--top-groups", "2"]
    one_g, out = run("one_grouped", steps + ["--data", "1", "--tensor", "1", *grouped])
    if "from 2 of 4 groups" not in out:
        failures.append(f"grouped router: summary:\n{out[:600]}")
    got, _ = run("grouped_expert", steps + ["--data", "2", "--tensor", "1", "--expert", "2", *grouped])
    within(got, one_g, "group-limited (top 2 from 2 of 4 groups): data 2 x expert 2")
    _, err = run("resume_unbalanced", steps + ["--data", "1", "--tensor", "1", "--router", "sigmoid", "--resume",
                                               os.path.join(ckb, "step_00000002")], want=2)
    print(f"refused (resumed without --expert-bias): {err.strip().splitlines()[-1] if err.strip() else ''}")
    if "expert_bias" not in err:
        failures.append(f"a checkpoint with expert biases resumed without them: {err}")
    if export_bin:
        p = subprocess.run([export_bin, "--checkpoint", os.path.join(ckb, "step_00000002"), "--out",
                            os.path.join(work, "balanced_hf")], capture_output=True, text=True, env=env, timeout=300)
        print(f"refused (weft-export of it): exit {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
        if p.returncode == 0 or "routers are softmax, unscaled, without a bias" not in p.stderr:
            failures.append(f"weft-export of a sigmoid router with a bias: exit {p.returncode}\n{p.stderr}")


# 7. In from a transformers directory, out to one.
exported = os.path.join(work, "exported_hf")
weft_logits = None
if export_bin:
    ref = safetensors(os.path.join(fixture, "reference.safetensors"))
    (rows, cols), tokens = ref["tokens"]
    vocab = 32
    ck = os.path.join(work, "from_hf")
    losses, out = run("from_hf", ["--init-from", os.path.join(fixture, "hf"), "--steps", "1", "--lr", "1e-30",
                                  "--min-lr", "0", "--warmup", "0", "--clip", "0", "--eval-every", "0", "--seq",
                                  str(cols), "--batch", "4", "--data", "2", "--tensor", "1", "--expert", "2",
                                  "--save-dir", ck])
    want = "4 experts of width 8 (top 2), aux coef 0.001, seq 8, vocab 32"
    if losses and want not in out:
        failures.append(f"--init-from without --preset: wanted '{want}' in:\n{out}")
    logits_f = os.path.join(work, "from_hf.f32")
    p = subprocess.run([export_bin, "--checkpoint", ck, "--out", exported, "--tokens",
                        ",".join(str(int(t)) for t in tokens[:cols]), "--logits", logits_f], capture_output=True,
                       text=True, env=env, timeout=300)
    if p.returncode != 0:
        failures.append(f"weft-export of the --init-from run: exit {p.returncode}\n{p.stdout}{p.stderr}")
    else:
        raw = open(logits_f, "rb").read()
        weft_logits = struct.unpack(f"<{len(raw) // 4}f", raw)
        err = relative(weft_logits, ref["logits"][1][:cols * vocab])
        print(f"--init-from the transformers directory on data 2 x expert 2, saved and exported: logits within "
              f"{err:.3g} of transformers' (relative to the largest)")
        if not err <= 1e-5:  # f32 weights and sums against float64
            failures.append(f"--init-from mixtral/hf: logits off transformers' by {err}")
    if not through_transformers:
        bad = os.path.join(work, "bad_hf")
        os.makedirs(bad, exist_ok=True)
        cfg = json.load(open(os.path.join(fixture, "hf", "config.json")))
        cfg["num_local_experts"] = 8
        json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
        os.symlink(os.path.join(os.path.abspath(fixture), "hf", "model.safetensors"),
                   os.path.join(bad, "model.safetensors"))
        _, err = run("bad_hf", ["--init-from", bad, "--seq", "8", "--batch", "4", "--data", "1", "--tensor", "1"],
                     want=2)
        print(f"refused (num_local_experts 8 for 4 experts' tensors): {err.strip().splitlines()[-1] if err else ''}")
        if "4 experts, where config.json's num_local_experts is 8" not in err:
            failures.append(f"a config.json disagreeing with its tensors: {err}")

# 8. The export read back by transformers.
if through_transformers:
    if not export_bin:
        sys.exit("weft_train_mixtral.py --through-transformers needs WEFT_TRAIN and WEFT_EXPORT")
    if weft_logits is not None:
        theirs = MixtralForCausalLM.from_pretrained(exported, dtype=torch.float32)
        fixture_model = MixtralForCausalLM.from_pretrained(os.path.join(fixture, "hf"), dtype=torch.float64)
        a, b = theirs.state_dict(), fixture_model.state_dict()
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)
        print(f"from_pretrained of the export: weights {'the fixture' if same else 'NOT the fixture'}'s rounded to f32")
        if not same:
            failures.append("the export's weights are not the fixture's rounded to f32")
        ids = torch.tensor([list(int(t) for t in safetensors(os.path.join(fixture, "reference.safetensors"))["tokens"][1][:8])])
        with torch.no_grad():
            logits = theirs(input_ids=ids).logits.reshape(-1).tolist()
        err = relative(logits, list(weft_logits))
        print(f"from_pretrained of the export: logits within {err:.3g} of weft's (relative to the largest)")
        if not err <= 1e-5:  # f32 sums in other orders
            failures.append(f"transformers' logits of the export off weft's by {err}")

if failures:
    print("\n".join(["FAILED:"] + failures))
    sys.exit(1)
print("weft-train --model mixtral: all checks passed")
