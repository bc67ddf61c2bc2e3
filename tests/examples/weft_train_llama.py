#!/usr/bin/env python3
"""weft-train --model llama (the Llama family through weft's trainer library), checked by what it
computes:

  weft_train_llama.py TRAIN_GPT [WEFT_EXPORT]

1. llama-tiny on the built-in Markov corpus, data 2 x tensor 2 (the tensor degree divides its 2
   key-value heads): the held-out loss ends near the corpus's entropy rate (within 0.25 nats after
   120 steps, in f32); bf16 mixed precision's losses follow f32's (the mean of steps 31 to 40
   within 0.05 nats; tests/models/llama holds 300 steps to the same bound).
2. The same 4 steps on one rank, on data 2 x tensor 2 with SP under ZeRO-1, on pipe 2 under ZB-H1,
   on context 2 (ring attention), on data 2 x context 2 (all-gather attention, FSDP), on pipe 2
   (ZB-H1) x context 2 and, with 4 layers, on pipe 2 (interleaved) x context 2: every logged loss
   within 2e-5 of one rank's (f32 sums in other orders; the f64 tests in
   tests/models/llama and tests/context hold the layouts to 1e-12).
   A checkpoint saved on context 2 x tensor 2 with sequence parallelism inside it (ZeRO-1) resumes on
   data 2: all 4 steps of the first run and steps 3 and 4 of the second the same way.
   With the LM head tied to the embedding table (--tie-embeddings true, Llama's tied variant): pipe 2
   under 1F1B (the table on both pipe ranks, their gradients summed) and data 2 x tensor 2 with SP
   within 2e-5 of one rank's tied run, whose losses are not the untied run's (another model).
3. --plan prints the step peak that the run then logs, to the byte (data 2 x tensor 2 with SP;
   tensor 2 and context 2 x tensor 2; the tied head on pipe 2 x tensor 2), and describe's rows walked over Llama's layers (the grouped
   attention, the SwiGLU MLP; the attention over the context axis, whose sends --plan counts).
4. Refused before anything is built (exit 2, naming the values): a tensor degree that does not
   divide the key-value heads, a precision the family does not compile, --init-from a transformers
   directory whose config.json describes another model than --preset's (tests/fixtures/llama_hf: its
   rotary base), --init-from without --preset and a size or tie that contradicts config.json,
   a tied head with --context (the context-parallel model unties it), --tie-embeddings for GPT-2;
   and with --context: a sequence its chunks do not divide, sequence parallelism whose tensor degree
   does not divide a context rank's rows, bf16, --attention without --context (a family without
   context-parallel attention: tests/examples/custom_model_train.py).
5. With WEFT_EXPORT: a checkpoint saved on data 2 x tensor 2 through weft-export into a
   LlamaForCausalLM directory, sharded (files of at most 200000 bytes), with weft's logits for 8
   tokens; where PyTorch and transformers are installed, from_pretrained loads it and computes
   those logits (within 1e-5 of the largest: f32 sums in other orders). The export imported again
   by weft-train --init-from, whose config.json must match the run's model field by field. A tied
   run's export the same way: tie_word_embeddings true, no lm_head.weight, and the same logits.
6. With WEFT_EXPORT: --init-from without --preset trains the model config.json describes (the
   fixtures' sizes, which no preset has, and llama3-scaled rotary positions; the tied fixture's
   tied head): one step at a learning rate of 1e-30, saved and exported, gives transformers' logits
   of the fixture's tokens within 1e-5.
"""
import json, os, re, struct, subprocess, sys, tempfile

from hf_checks import relative, safetensors  # tests/examples/hf_checks.py

# --through-transformers: part 5's export read back by transformers alone, a CTest test of its own
# that exits 77 (skipped) where PyTorch and transformers are not installed.
through_transformers = "--through-transformers" in sys.argv
sys.argv = [a for a in sys.argv if a != "--through-transformers"]
if through_transformers:
    try:
        import struct
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as e:
        print(f"SKIPPED: the export through transformers needs PyTorch and transformers ({e})")
        sys.exit(77)
    if len(sys.argv) < 3:
        sys.exit("weft_train_llama.py --through-transformers needs TRAIN_GPT and WEFT_EXPORT")
bin_ = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp(prefix="weft_llama_train_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
failures = []

def run(name, args):
    log = os.path.join(work, name + ".jsonl")
    p = subprocess.run([bin_, "--model", "llama", "--log", log, *args], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        failures.append(f"{name}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        return {}, p.stdout
    return {r["step"]: r["loss"] for r in map(json.loads, open(log)) if "loss" in r}, p.stdout

def held_out(out):
    m = re.search(r"held-out loss ([\d.]+) \(floor ([\d.]+);", out)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)

short = ["--steps", "4", "--batch", "8", "--micro-batch", "4", "--eval-every", "0", "--seq", "32", "--seed", "3"]
tied = ["--tie-embeddings", "true"]

if not through_transformers:  # parts 1 to 4
    train = ["--steps", "120", "--eval-every", "120", "--batch", "8", "--lr", "3e-3"]
    _, out32 = run("f32", train)
    l32, floor = held_out(out32)
    # The floor is the corpus's entropy rate, not the trainer's word for it: the built-in corpus of
    # llama-tiny's 64 tokens at seed 1 has 1.04309 nats (tests/data/synthetic.cpp checks that value
    # against sampled sequences). The held-out loss (16 micro-batches: a standard error of about
    # 0.01 nats) may not go below it by more than 0.05, which only a leak of the targets would do.
    FLOOR = 1.04309
    print(f"llama-tiny, 120 steps: held-out f32 {l32}, floor {FLOOR} (the trainer says {floor})")
    if floor is None or abs(floor - FLOOR) > 1e-4: failures.append(f"the trainer's floor {floor} is not the corpus's {FLOOR}")
    if l32 is None or not -0.05 <= l32 - FLOOR <= 0.25: failures.append(f"f32 ended at {l32}, floor {FLOOR}:\n{out32}")
    brief = ["--steps", "40", "--eval-every", "0", "--batch", "8", "--lr", "3e-3"]
    a32, _ = run("f32_40", brief)
    a16, _ = run("bf16_40", [*brief, "--dtype", "bf16"])
    tail = lambda l: sum(l[s] for s in range(31, 41)) / 10 if len(l) == 40 else None
    t32, t16 = tail(a32), tail(a16)
    print(f"40 steps, mean of the last 10 losses: f32 {t32}, bf16 {t16}")
    if t32 is None or t16 is None or not abs(t16 - t32) <= 0.05: failures.append(f"bf16 at {t16} against f32 at {t32}")

    one, _ = run("one", [*short, "--data", "1", "--tensor", "1"])
    for name, args in (("data 2 x tensor 2, zero1-sp", ["--data", "2", "--tensor", "2", "--strategy", "zero1-sp"]),
                       ("pipe 2, zb", ["--data", "1", "--tensor", "1", "--pipe", "2", "--schedule", "zb"]),
                       ("context 2, ring", ["--data", "1", "--tensor", "1", "--context", "2"]),
                       ("data 2 x context 2, all-gather, fsdp",
                        ["--data", "2", "--tensor", "1", "--context", "2", "--attention", "all-gather", "--strategy", "fsdp"]),
                       ("pipe 2 x context 2, zb", ["--data", "1", "--tensor", "1", "--pipe", "2", "--schedule", "zb", "--context", "2"])):
        got, _ = run(name.replace(" ", "_"), [*short, *args])
        worst = max((abs(got.get(s, float("inf")) - one[s]) for s in one), default=float("inf"))
        print(f"{name}: losses within {worst:.3g} of one rank's")
        if not (one and worst <= 2e-5): failures.append(f"{name}: {got} against {one}")

    # Interleaved 1F1B beside context 2 (4 layers: 2 virtual stages of one layer on each pipe rank).
    one4, _ = run("one_layers4", [*short, "--data", "1", "--tensor", "1", "--layers", "4"])
    got, _ = run("interleaved_context", [*short, "--data", "1", "--tensor", "1", "--layers", "4", "--pipe", "2", "--schedule",
                                         "interleaved", "--virtual-stages", "2", "--context", "2", "--attention", "all-gather"])
    worst = max((abs(got.get(s, float("inf")) - one4[s]) for s in one4), default=float("inf"))
    print(f"pipe 2 (interleaved, 2 virtual stages) x context 2, all-gather: losses within {worst:.3g} of one rank's")
    if not (one4 and worst <= 2e-5): failures.append(f"interleaved x context 2: {got} against {one4}")

    # A checkpoint of a context-parallel run resumes on a mesh without a context axis: 4 steps on data 1
    # x context 2 x tensor 2 (all-gather, ZeRO-1, sequence parallelism inside each context rank's rows)
    # saving at step 2, then steps 3 and 4 from it on data 2: the losses of both within 2e-5 of the
    # uninterrupted run's on one rank.
    cp_ck = os.path.join(work, "cp_ck")
    saved, _ = run("cp_save", [*short, "--data", "1", "--tensor", "2", "--context", "2", "--attention", "all-gather", "--strategy", "zero1-sp",
                    "--save-dir", cp_ck, "--save-every", "2"])
    resumed, _ = run("cp_resume", [*short, "--data", "2", "--tensor", "1", "--resume", os.path.join(cp_ck, "step_00000002")])
    worst_sp = max((abs(saved.get(s, float("inf")) - one[s]) for s in one), default=float("inf"))
    print(f"context 2 x tensor 2 with sequence parallelism, all-gather, zero1-sp: losses within {worst_sp:.3g} of one rank's")
    if not (one and worst_sp <= 2e-5): failures.append(f"context 2 x tensor 2, zero1-sp: {saved} against {one}")
    worst = max((abs(resumed[s] - one[s]) for s in (3, 4) if s in resumed), default=float("inf"))
    print(f"saved on context 2 x tensor 2, resumed on data 2: steps {sorted(resumed)} within {worst:.3g} of one rank's")
    if not (one and sorted(resumed) == [3, 4] and worst <= 2e-5): failures.append(f"context checkpoint: {resumed} against {one}")

    # A tied head: another model than the untied one (its first loss differs), the same on every layout.
    one_tied, out_tied = run("tied_one", [*short, *tied, "--data", "1", "--tensor", "1"])
    if "head tied" not in out_tied or not one_tied or abs(one_tied[1] - one[1]) <= 1e-3:
        failures.append(f"--tie-embeddings true: header or first loss {one_tied.get(1)} against untied {one.get(1)}\n{out_tied}")
    for name, args in (("tied, pipe 2, 1f1b", ["--data", "1", "--tensor", "1", "--pipe", "2"]),
                       ("tied, data 2 x tensor 2, zero1-sp", ["--data", "2", "--tensor", "2", "--strategy", "zero1-sp"])):
        got, _ = run(name.replace(" ", "_").replace(",", ""), [*short, *tied, *args])
        worst = max((abs(got.get(s, float("inf")) - one_tied[s]) for s in one_tied), default=float("inf"))
        print(f"{name}: losses within {worst:.3g} of one rank's tied run")
        if not (one_tied and worst <= 2e-5): failures.append(f"{name}: {got} against {one_tied}")

    def plan_equals_run(name, args, rows):
        """--plan's step peak equals the peak the same run logs, to the byte; describe's rows appear."""
        p = subprocess.run([bin_, "--model", "llama", "--plan", *args], capture_output=True, text=True, env=env, timeout=120)
        totals = [int(x) for x in re.findall(r"(?:step peak|pipe rank \d+:) (\d+) bytes", p.stdout)]
        run(name, [*args, "--steps", "2", "--eval-every", "0"])
        log = os.path.join(work, name + ".jsonl")
        peaks = [json.loads(l)["peak_bytes"] for l in open(log) if '"peak_bytes"' in l] if os.path.exists(log) else []
        ok = p.returncode == 0 and totals and peaks and all(x == max(totals) for x in peaks)
        ok = ok and all(re.search(r, p.stdout) for r in rows)
        print(f"--plan {' '.join(args)}: step peak {max(totals) if totals else None} bytes, the run's {peaks}{'' if ok else ' (FAIL)'}")
        if not ok: failures.append(f"--plan {args}: exit {p.returncode}, planned {totals}, measured {peaks}\n{p.stdout}{p.stderr}")
        return p.stdout

    plan_equals_run("plan", ["--data", "2", "--tensor", "2", "--strategy", "zero1-sp", "--batch", "8", "--micro-batch", "4"],
                    [r"layers\.0\.attn\.qkv \(ColumnParallel\)", r"layers\.1\.gate_up"])
    # Context 2 x tensor 2: the attention's blocks travel on the context axis, the gradients reduce
    # over data x context. A rank keeps its rows' activations, (B, T/2, ...): half of tensor 2's,
    # less the attention probabilities (B, H/2, T, T) f32 per layer that tensor 2 alone keeps and the
    # context-parallel attention does not (tests/context/plan.cpp holds the context model to the byte
    # against its own one rank). Here through the table's MiB rounded to 0.1, at a sequence of 256:
    # 2 layers x 2 sequences x 2 heads x 256^2 x 4 bytes = 2 MiB of probabilities.
    ctx_args = ["--data", "1", "--tensor", "2", "--batch", "4", "--micro-batch", "2", "--seq", "256"]
    whole = plan_equals_run("plan_tensor", ctx_args, [])
    halved = plan_equals_run("plan_context", [*ctx_args, "--context", "2"],
                             [r"layers\.0\.attn\.core \(causal, local heads, over context: ring\)", r"context send \d+ calls"])
    # The tied table's copy on the last pipe rank is planned as the run holds it.
    plan_equals_run("plan_tied", [*ctx_args, "--pipe", "2", *tied], [r"head tied"])
    act = lambda out: [float(m) for m in re.findall(r"^\d+\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+\s+\S+ \S+\s+(\S+) MiB", out, re.M)]
    a_whole, a_halved = act(whole), act(halved)
    # Each printed value is within 0.05 MiB of its bytes: 2 x halved - (whole - probabilities) within 0.15 MiB.
    probs = 2 * 2 * 2 * 256 * 256 * 4 / 2 ** 20
    ok = len(a_whole) == len(a_halved) == 1 and a_whole[0] >= 2 and abs(2 * a_halved[0] - (a_whole[0] - probs)) <= 0.15
    print(f"activations per rank (MiB): tensor 2 {a_whole}, context 2 x tensor 2 {a_halved}: "
          f"{'half, less the probabilities' if ok else 'NOT half of the rest (FAIL)'}")
    if not ok:
        failures.append(f"context 2 x tensor 2's activations {a_halved} MiB are not half of tensor 2's {a_whole} less {probs} MiB")

    # Llama 3.1 8B's sizes (vocabulary 128256, seq 8192) plan without a corpus: 4 pipe ranks' peaks.
    p = subprocess.run([bin_, "--model", "llama", "--preset", "llama-3.1-8b", "--plan", "--data", "8", "--tensor", "8", "--pipe", "4",
                        "--strategy", "zero1-sp", "--batch", "64", "--micro-batch", "8", "--dtype", "bf16"],
                       capture_output=True, text=True, env=env, timeout=300)
    ranks = re.findall(r"pipe rank \d+: (\d+) bytes", p.stdout)
    ok = p.returncode == 0 and "vocab 128256" in p.stdout and len(ranks) == 3
    print(f"--plan llama-3.1-8b on data 8 x pipe 4 x tensor 8: exit {p.returncode}{'' if ok else ' (FAIL)'}")
    if not ok: failures.append(f"--plan llama-3.1-8b: exit {p.returncode}\n{p.stdout}{p.stderr}")

    fixture = os.path.join(here, "..", "fixtures", "llama_hf")
    for args, message in ((["--tensor", "4", "--data", "1"], "tensor degree 4 does not divide 2 key-value heads"),
                          (["--dtype", "f64"], "precision 'f64' is not compiled for the model family 'llama'; use one of: f32, bf16"),
                          (["--init-from", fixture, "--preset", "tiny", "--vocab", "61", "--width", "32", "--hidden", "48", "--steps", "1"],
                           "its config.json has rope_theta_x1e6 500000000; the run's model has 10000000000"),
                          (["--init-from", fixture, "--layers", "3"],
                           f"--layers 3: the model in {fixture} has layers 2 (its config.json); leave out --layers"),
                          (["--init-from", fixture, "--kv-heads", "4"], f"--kv-heads 4: the model in {fixture} has kv_heads 2"),
                          (["--init-from", fixture + "_tied", "--tie-embeddings", "false"],
                           f"--tie-embeddings false: the model in {fixture}_tied has tied true"),
                          (["--context", "2", "--seq", "30"],
                           "--context 2: a sequence of 30 tokens does not split into 2 x 2 = 4 equal chunks (each context rank holds "
                           "two); use --seq a multiple of 4, or another --context"),
                          (["--context", "2", "--strategy", "ddp-sp", "--data", "1", "--tensor", "4", "--heads", "4", "--kv-heads", "4",
                            "--seq", "4"],
                           "sequence parallelism inside context parallelism needs the tensor degree 4 to divide each context rank's 2 "
                           "rows (a sequence of 4 over 2 context ranks)"),
                          (["--context", "2", "--dtype", "bf16"], "precision 'bf16' is not compiled for the model family 'llama'; use one of: f32"),
                          (["--attention", "all-gather"], "--attention all-gather without --context"),
                          ([*tied, "--context", "2"],
                           "a tied LM head (the preset's, or --tie-embeddings) in the model family 'llama' with --context, whose "
                           "context-parallel model unties it; give --tie-embeddings false, or leave out --context"),
                          (["--model", "gpt2", "--tie-embeddings", "false"], "the model family 'gpt2' has no choice of a tied head")):
        model = [] if "--model" in args else ["--model", "llama"]
        p = subprocess.run([bin_, *model, *args], capture_output=True, text=True, env=env, timeout=120)
        ok = p.returncode in (1, 2) and message in p.stdout + p.stderr
        print(f"{' '.join(args)}: exit {p.returncode}{'' if ok else ' (FAIL)'}")
        if not ok: failures.append(f"{args}: exit {p.returncode}, wanted '{message}':\n{p.stdout}{p.stderr}")

if len(sys.argv) > 2:
    export_bin, ck, hf = sys.argv[2], os.path.join(work, "ck"), os.path.join(work, "hf")
    run("save", [*short, "--data", "2", "--tensor", "2", "--save-dir", ck])
    logits_file, ids = os.path.join(work, "logits.f32"), [1, 5, 2, 7, 3, 0, 4, 6]
    p = subprocess.run([export_bin, "--checkpoint", ck, "--out", hf, "--max-shard-bytes", "200000",
                        "--tokens", ",".join(map(str, ids)), "--logits", logits_file],
                       capture_output=True, text=True, env=env, timeout=300)
    shards = sorted(f for f in os.listdir(hf) if f.endswith(".safetensors")) if os.path.isdir(hf) else []
    ok = p.returncode == 0 and len(shards) > 1 and os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
    print(f"weft-export of the llama checkpoint: exit {p.returncode}, {len(shards)} safetensors files{'' if ok else ' (FAIL)'}")
    if not ok: failures.append(f"weft-export: exit {p.returncode}, files {shards}\n{p.stdout}{p.stderr}")
    p = subprocess.run([bin_, "--model", "llama", "--init-from", hf, "--seq", "32", "--steps", "1", "--eval-every", "0",
                        "--batch", "8"], capture_output=True, text=True, env=env, timeout=300)
    print(f"weft-train --init-from the export: exit {p.returncode}")
    if p.returncode != 0: failures.append(f"--init-from the export: exit {p.returncode}\n{p.stdout}{p.stderr}")
    # The tied run's checkpoint (saved on pipe 2: the table on both pipe ranks) exported the same way.
    ck_t, hf_t, logits_t = os.path.join(work, "ck_tied"), os.path.join(work, "hf_tied"), os.path.join(work, "logits_tied.f32")
    run("save_tied", [*short, *tied, "--data", "1", "--tensor", "1", "--pipe", "2", "--save-dir", ck_t])
    p = subprocess.run([export_bin, "--checkpoint", ck_t, "--out", hf_t, "--tokens", ",".join(map(str, ids)), "--logits", logits_t],
                       capture_output=True, text=True, env=env, timeout=300)
    cfg_t = json.load(open(os.path.join(hf_t, "config.json"))) if p.returncode == 0 else {}
    names_t = []
    if p.returncode == 0:
        raw = open(os.path.join(hf_t, "model.safetensors"), "rb").read()
        names_t = [k for k in json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")]) if k != "__metadata__"]
    ok_t = p.returncode == 0 and cfg_t.get("tie_word_embeddings") is True and "lm_head.weight" not in names_t \
        and "model.embed_tokens.weight" in names_t
    print(f"weft-export of the tied checkpoint: exit {p.returncode}, tie_word_embeddings {cfg_t.get('tie_word_embeddings')}, "
          f"{len(names_t)} tensors, lm_head.weight {'present' if 'lm_head.weight' in names_t else 'absent'}{'' if ok_t else ' (FAIL)'}")
    if not ok_t: failures.append(f"weft-export tied: exit {p.returncode}, {cfg_t}, {names_t}\n{p.stdout}{p.stderr}")
    if not through_transformers:
        print("the export through transformers: the CTest test 'examples: weft-train --model llama through transformers' reads it")
    else:
        for what, ok_x, directory, file in (("the trainer's checkpoint", ok, hf, logits_file),
                                            ("the tied run's checkpoint", ok_t, hf_t, logits_t)):
            if not ok_x: continue
            model = LlamaForCausalLM.from_pretrained(directory)
            model.eval()
            with torch.no_grad():
                theirs = model(input_ids=torch.tensor([ids])).logits[0].double()
            raw = open(file, "rb").read()
            ours = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw), dtype=torch.float64).reshape(len(ids), -1)
            err = ((theirs - ours).abs().max() / ours.abs().max()).item()
            print(f"{what} through weft-export and LlamaForCausalLM.from_pretrained: logits within {err:.3g} "
                  "of weft's (relative to the largest)")
            if not err <= 1e-5: failures.append(f"{what}: transformers' logits off weft's by {err}")

# --init-from a transformers directory and no --preset: the model is the one its config.json
# describes (tests/fixtures/llama_hf: sizes of no preset, rope theta 500 with the llama3 scaling),
# and the tied fixture's run takes the tied model. One step at a learning rate of 1e-30 leaves the
# weights as imported (an update of about 1e-30 to values of about 0.1), so weft-export's logits of
# the checkpoint are the fixture's model's: transformers' logits of the fixture's tokens
# (reference.safetensors, f64) within 1e-5 of the largest (f32 weights and sums, as tests/models/llama/hf.cpp).
if len(sys.argv) > 2 and not through_transformers:
    ref = safetensors(os.path.join(fixture, "reference.safetensors"))
    (rows, cols), tokens = ref["tokens"]
    for name, directory, head in (("llama_hf", fixture, "head untied"), ("llama_hf_tied", fixture + "_tied", "head tied")):
        ck = os.path.join(work, f"from_{name}")
        losses, out = run(f"from_{name}", ["--init-from", directory, "--steps", "1", "--lr", "1e-30", "--min-lr", "0", "--warmup", "0",
                                           "--clip", "0", "--eval-every", "0", "--seq", str(cols), "--batch", "2", "--data", "1",
                                           "--tensor", "1", "--save-dir", ck])
        want = f"layers 2, heads 4 (2 key-value), width 32, hidden 48, seq {cols}, vocab 61, rope theta 500 (llama3 scaling x4), {head}"
        ok = bool(losses) and want in out
        print(f"--init-from {name} without --preset: {'the model of its config.json' if ok else 'NOT config.json model (FAIL)'}")
        if not ok:
            failures.append(f"--init-from {name}: wanted '{want}' in:\n{out}")
            continue
        if name != "llama_hf": continue
        logits_f, hf_f = os.path.join(work, "from_fixture.f32"), os.path.join(work, "from_fixture_hf")
        p = subprocess.run([export_bin, "--checkpoint", ck, "--out", hf_f, "--tokens", ",".join(map(str, tokens[:cols])),
                            "--logits", logits_f], capture_output=True, text=True, env=env, timeout=300)
        if p.returncode != 0:
            failures.append(f"weft-export of the --init-from run: exit {p.returncode}\n{p.stdout}{p.stderr}")
            continue
        raw = open(logits_f, "rb").read()
        ours = struct.unpack(f"<{len(raw) // 4}f", raw)
        err = relative(ours, ref["logits"][1][:cols * 61])  # NaN and a size mismatch fail
        print(f"--init-from llama_hf without --preset, saved and exported: logits within {err:.3g} of transformers' (relative)")
        if not err <= 1e-5: failures.append(f"--init-from llama_hf: logits off transformers' by {err}")

if failures:
    print("FAIL:\n" + "\n".join(failures))
    sys.exit(1)
print("weft-train --model llama: every check passed")
