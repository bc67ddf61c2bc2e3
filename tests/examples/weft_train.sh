#!/usr/bin/env bash
# The trainer as a user runs it: every strategy name gives the same losses, the JSON log has its
# keys, bad options exit with 2 and a message, a bad data file exits non-zero with the loader's
# message, and text training samples text.
set -u
# The checks below are Python asserts: PYTHONOPTIMIZE in the environment would strip them all.
unset PYTHONOPTIMIZE
bin="$1"
export_bin="${2:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# One held-out evaluation, at the last step (16 micro-batches' forwards: as long as the steps here).
run() { "$bin" --steps 12 --eval-every 12 --batch 8 --layers 1 --width 32 --seq 32 "$@"; }

# Same losses under ddp and ddp-sp, on 1 and 4 ranks, in f32 (1e-5 relative).
run --strategy ddp --log "$work/a.jsonl" >/dev/null || fail "ddp run failed"
run --strategy ddp-sp --log "$work/b.jsonl" >/dev/null || fail "ddp-sp run failed"
run --strategy ddp --data 1 --tensor 1 --log "$work/c.jsonl" >/dev/null || fail "one-rank run failed"
run --strategy zero1 --log "$work/d.jsonl" >/dev/null || fail "zero1 run failed"
run --strategy zero2-sp --log "$work/e.jsonl" >/dev/null || fail "zero2-sp run failed"
run --strategy fsdp --log "$work/f.jsonl" >/dev/null || fail "fsdp run failed"
run --strategy fsdp-sp --micro-batch 4 --log "$work/g.jsonl" >/dev/null || fail "fsdp-sp with accumulation failed"
python3 - "$work" <<'PY' || exit 1
import json, sys
def losses(name):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl")]
    for r in rows:
        if "loss" in r:
            for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_bytes", "skipped"):
                assert k in r, f"log record lacks {k}: {r}"
    assert any("eval_loss" in r for r in rows), "no eval records"
    return [r["loss"] for r in rows if "loss" in r]
a = losses("a")
assert len(a) == 12, len(a)
for other in ("b", "c", "d", "e", "f", "g"):
    for x, y in zip(a, losses(other)):
        assert abs(x - y) <= 1e-5 * abs(x), (other, x, y)
print(f"losses agree across ddp, ddp-sp, one rank, zero1, zero2-sp, fsdp and fsdp-sp (2 micro-batches): "
      f"first {a[0]:.6f}, last {a[-1]:.6f}")
PY

# Checkpoints: save every 6 steps; resume from step 6 on the same mesh (bit for bit the losses of
# the straight run) and on another mesh and strategy (1e-5: the tensor degree reorders sums); an
# asynchronous save every 3 steps keeping 2 leaves step 9 and 12, latest on 12, and the same losses.
run --strategy ddp --save-dir "$work/ck" --save-every 6 --log "$work/s.jsonl" >/dev/null || fail "run with saves failed"
[ "$(cat "$work/ck/latest")" = "step_00000012" ] || fail "latest: $(cat "$work/ck/latest")"
out=$(run --strategy ddp --resume "$work/ck/step_00000006" --log "$work/r1.jsonl" 2>&1) || fail "resume: $out"
echo "$out" | grep -q "resumed from $work/ck/step_00000006 at step 6" || fail "no resume line: $out"
run --strategy fsdp --data 4 --tensor 1 --resume "$work/ck/step_00000006" --log "$work/r2.jsonl" >/dev/null || fail "reshard resume failed"
run --strategy zero1 --save-dir "$work/ak" --save-every 3 --keep 2 --async-save --log "$work/r3.jsonl" >/dev/null || fail "async run failed"
[ "$(ls "$work/ak" | tr '\n' ' ')" = "latest step_00000009 step_00000012 " ] || fail "async keep 2: $(ls "$work/ak")"
python3 - "$work" <<'PY' || exit 1
import json, sys
rows = lambda n: [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl") if '"loss"' in l]
a, s, r1, r2, r3 = rows("a"), rows("s"), rows("r1"), rows("r2"), rows("r3")
assert [x["loss"] for x in s] == [x["loss"] for x in a], "saving changed the losses"
assert [x["step"] for x in r1] == list(range(7, 13)), [x["step"] for x in r1]
assert [x["loss"] for x in r1] == [x["loss"] for x in a[6:]], ("same-mesh resume", r1, a[6:])
for x, y in zip(a[6:], r2):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"]), ("fsdp data 4 resume", x, y)
assert len(r2) == 6
for x, y in zip(a, r3):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"]), ("async zero1", x, y)
print(f"resume: steps 7-12 bit for bit on the same mesh ({r1[-1]['loss']:.6f}), within 1e-5 under fsdp on data 4; "
      f"async saves leave the losses as they were")
PY
out=$("$bin" --resume latest --steps 2 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "resume latest without --save-dir" || fail "--resume latest alone: $rc $out"
mkdir -p "$work/partial/step_00000003.tmp"
out=$(run --resume "$work/partial/step_00000003.tmp" 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "is an unfinished save" || fail "resume from a .tmp: $rc $out"
out=$(run --resume "$work/partial" 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "has no manifest.json and no latest pointer" || fail "resume from no checkpoint: $rc $out"
out=$("$bin" --steps 13 --eval-every 6 --batch 8 --layers 1 --width 32 --seq 32 --resume "$work/ck" --heads 2 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "was saved from a model with heads = 4; this model has heads = 2" ||
  fail "resume into other sizes: $rc $out"
out=$(run --resume "$work/ck" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "is at step 12, at or past --steps 12; pass --steps above 12" ||
  fail "resume at --steps: $rc $out"

# Hugging Face GPT-2: weft-export writes the checkpoint of step 12 with config.json; a run from
# --init-from that file starts from those weights (its first loss is below a fresh run's first,
# 4.17: the weights have trained 12 steps); a file of other sizes is refused.
if [ -n "$export_bin" ]; then
  mkdir -p "$work/hf"
  "$export_bin" --checkpoint "$work/ck" --out "$work/hf/model.safetensors" >/dev/null || fail "weft-export failed"
  grep -q '"n_layer": 1' "$work/hf/config.json" || fail "config.json: $(cat "$work/hf/config.json")"
  run --strategy zero2 --init-from "$work/hf/model.safetensors" --log "$work/i.jsonl" >/dev/null || fail "--init-from failed"
  python3 - "$work" <<'PY' || exit 1
import json, sys
rows = lambda n: [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl") if '"loss"' in l]
a, i = rows("a"), rows("i")
assert i[0]["loss"] < a[0]["loss"] - 0.2, (i[0], a[0])
print(f"--init-from a 12-step export: first loss {i[0]['loss']:.4f} (fresh weights: {a[0]['loss']:.4f})")
PY
  out=$("$bin" --steps 2 --layers 1 --width 64 --seq 32 --init-from "$work/hf/model.safetensors" 2>&1); rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -q "transformer.wte.weight has the shape 64x32; a GPT-2 of these sizes has 64x64" ||
    fail "--init-from other sizes: $rc $out"
  out=$("$export_bin" --checkpoint "$work/nothing" --out "$work/hf/x.safetensors" 2>&1); rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q "is not a directory" || fail "weft-export of nothing: $rc $out"
fi

# bf16 mixed precision on the host: the same start as f32 (the weights are the f32 draws rounded to
# bf16: 0.02 nats) and, 12 steps on, within 0.05 nats of it; no step skipped.
run --strategy ddp --dtype bf16 --device host --log "$work/h.jsonl" >/dev/null || fail "bf16 run failed"
python3 - "$work" <<'PY' || exit 1
import json, sys
rows = lambda n: [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl") if '"loss"' in l]
a, h = rows("a"), rows("h")
assert len(h) == 12 and not any(r["skipped"] for r in h), h
assert abs(a[0]["loss"] - h[0]["loss"]) < 0.02, (a[0], h[0])
assert abs(a[-1]["loss"] - h[-1]["loss"]) < 0.05, (a[-1], h[-1])
print(f"bf16 on the host: first loss {h[0]['loss']:.4f} (f32 {a[0]['loss']:.4f}), last {h[-1]['loss']:.4f} (f32 {a[-1]['loss']:.4f})")
PY

# FP8 on the host (--dtype fp8-rowwise: the linear layers' GEMMs on float8 casts, tensor 2 x data 2,
# the casts' amaxes reduced over the tensor ranks), against the bf16 run above: the same start
# within 0.05 nats (the casts' error on top of bf16's), 12 steps on within 0.1, no step skipped; a
# recipe this build did not compile, and FP8 for another family, refused by name.
run --strategy ddp-sp --dtype fp8-rowwise --device host --log "$work/q.jsonl" >/dev/null || fail "fp8-rowwise run failed"
# Its plan: the step peak the run logs (the float8 casts are a GEMM's scratch, outside the counts,
# as bf16's), and describe's rows with the amaxes' all-reduces (none in bf16's).
run --strategy ddp-sp --dtype fp8-rowwise --device host --plan > "$work/q_plan.txt" || fail "fp8-rowwise --plan failed"
run --strategy ddp-sp --dtype bf16 --device host --plan > "$work/h_plan.txt" || fail "bf16 --plan failed"
python3 - "$work" <<'PY' || exit 1
import json, re, sys
w = sys.argv[1]
rows = lambda n: [json.loads(l) for l in open(f"{w}/{n}.jsonl") if '"loss"' in l]
h, q = rows("h"), rows("q")
assert len(q) == 12 and not any(r["skipped"] for r in q), q
assert abs(h[0]["loss"] - q[0]["loss"]) < 0.05, (h[0], q[0])
assert abs(h[-1]["loss"] - q[-1]["loss"]) < 0.1, (h[-1], q[-1])
print(f"fp8-rowwise on the host: first loss {q[0]['loss']:.4f} (bf16 {h[0]['loss']:.4f}), last {q[-1]['loss']:.4f} (bf16 {h[-1]['loss']:.4f})")
plan, bplan = open(f"{w}/q_plan.txt").read(), open(f"{w}/h_plan.txt").read()
planned = [int(x) for x in re.findall(r"step peak (\d+) bytes", plan)]
peaks = [r["peak_bytes"] for r in q]
assert planned and all(p == max(planned) for p in peaks), (planned, peaks)
fc = lambda text: next(l for l in text.splitlines() if l.strip().startswith("h0.mlp.fc "))
# ColumnParallel fc, rowwise: dgrad's dy (a float a token) and W^T (a float an input feature) reduced.
assert fc(plan).count("all_reduce(tensor)") == 2 and "all_reduce" not in fc(bplan), (fc(plan), fc(bplan))
print(f"fp8-rowwise --plan: step peak {max(planned)} bytes, the run's; h0.mlp.fc's backward: {fc(plan).split('-')[-1].strip()}")
PY
# (A build with every recipe trains tensorwise, and refuses blockwise's 128-wide blocks at width 64.)
for d in fp8-tensorwise fp8-blockwise; do
  out=$("$bin" --steps 1 --dtype $d 2>&1); rc=$?
  if echo "$out" | grep -q "precision '$d' is not compiled for the model family 'gpt2'"; then
    [ $rc -eq 2 ] || fail "--dtype $d not compiled, exit $rc"
  elif [ $d = fp8-blockwise ]; then
    [ $rc -ne 0 ] && echo "$out" | grep -q "does not tile into 1x128 blocks" || fail "--dtype $d: $rc $out"
  else
    [ $rc -eq 0 ] || fail "--dtype $d exited $rc: $out"
  fi
done
out=$("$bin" --steps 1 --model llama --dtype fp8-rowwise 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "precision 'fp8-rowwise' is not compiled for the model family 'llama'" ||
  fail "--model llama --dtype fp8-rowwise: $rc $out"

# Pipelines: --pipe 2 with every schedule (tensor 2, or data 2 for the interleaved one) logs the
# losses of a one-rank run of the same batch and micro-batch, within 1e-5 relative in f32.
# The held-out loss at the last step through each layout too (its forwards on the pipeline's stages and
# the context ranks), within the same bound.
common="--steps 6 --eval-every 6 --batch 8 --micro-batch 4 --width 32 --seq 32 --layers 4"
"$bin" $common --data 1 --tensor 1 --log "$work/r1.jsonl" >/dev/null || fail "one-rank reference failed"
for s in gpipe 1f1b zb; do
  "$bin" $common --pipe 2 --tensor 2 --data 1 --schedule $s --log "$work/p_$s.jsonl" >/dev/null || fail "--pipe 2 --schedule $s failed"
done
"$bin" $common --pipe 2 --tensor 1 --data 2 --schedule interleaved --virtual-stages 2 --log "$work/p_interleaved.jsonl" \
  >/dev/null || fail "--schedule interleaved failed"
python3 - "$work" <<'PY' || exit 1
import json, sys
rows = lambda n: [json.loads(l) for l in open(f"{sys.argv[1]}/{n}.jsonl")]
L = lambda n: [r["loss"] for r in rows(n) if "loss" in r] + [r["eval_loss"] for r in rows(n) if "eval_loss" in r]
ref = L("r1")
for s in ("gpipe", "1f1b", "zb", "interleaved"):
    got = L(f"p_{s}")
    assert len(got) == len(ref) == 7, (s, len(got))
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
    assert worst <= 1e-5, (s, worst)
    print(f"--pipe 2 --schedule {s}: losses and the held-out loss within {worst:.1e} of one rank")
PY
# Context parallelism (--context): the sequence over 2 context ranks, ring or all-gather attention,
# alone and beside tensor 2 with sequence parallelism inside it, pipe 2 and data 2: the losses of the
# one-rank run above within 1e-5 relative (f32 sums in other orders; tests/context holds GPT-2's
# layouts to 1e-12 in double). --plan of context 2 x tensor 2 prints the step peak the run logs.
"$bin" $common --context 2 --tensor 1 --data 1 --log "$work/c_ring.jsonl" >/dev/null || fail "--context 2 failed"
"$bin" $common --context 2 --tensor 2 --data 1 --attention all-gather --strategy zero1-sp --log "$work/c_tp_sp.jsonl" \
  >/dev/null || fail "--context 2 --tensor 2 --strategy zero1-sp failed"
"$bin" $common --context 2 --pipe 2 --tensor 1 --data 1 --schedule 1f1b --log "$work/c_pipe.jsonl" >/dev/null \
  || fail "--context 2 --pipe 2 failed"
"$bin" $common --context 2 --tensor 1 --data 2 --attention all-gather --strategy fsdp --log "$work/c_fsdp.jsonl" >/dev/null \
  || fail "--context 2 --data 2 --strategy fsdp failed"
"$bin" $common --context 2 --tensor 2 --data 1 --attention all-gather --strategy zero1-sp --plan > "$work/c_plan.txt" \
  || fail "--plan --context 2 failed"
python3 - "$work" <<'PY' || exit 1
import json, re, sys
w = sys.argv[1]
rows = lambda n: [json.loads(l) for l in open(f"{w}/{n}.jsonl")]
L = lambda n: [r["loss"] for r in rows(n) if "loss" in r] + [r["eval_loss"] for r in rows(n) if "eval_loss" in r]
ref = L("r1")
for n, what in (("c_ring", "context 2, ring"), ("c_tp_sp", "context 2 x tensor 2, all-gather, zero1-sp"),
                ("c_pipe", "pipe 2 (1f1b) x context 2, ring"), ("c_fsdp", "data 2 x context 2, all-gather, fsdp")):
    got = L(n)
    assert len(got) == len(ref) == 7, (n, len(got))
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
    assert worst <= 1e-5, (what, worst, got, ref)
    print(f"--model gpt2 {what}: losses and the held-out loss within {worst:.1e} of one rank")
plan = open(f"{w}/c_plan.txt").read()
planned = [int(x) for x in re.findall(r"step peak (\d+) bytes", plan)]
peaks = [json.loads(l)["peak_bytes"] for l in open(f"{w}/c_tp_sp.jsonl") if '"peak_bytes"' in l]
assert planned and peaks and all(p == max(planned) for p in peaks), (planned, peaks, plan)
assert re.search(r"h0\.attn\.core \(causal, local heads, over context: all-gather\)", plan) and "context all_gather" in plan, plan
print(f"--plan --context 2 --tensor 2 (all-gather, zero1-sp): step peak {max(planned)} bytes, the run's {sorted(set(peaks))}")
PY
# --trace: one track per rank, each with its computes, receive waits and optimizer steps.
"$bin" --steps 2 --eval-every 0 --batch 8 --micro-batch 4 --width 32 --seq 32 --layers 4 --pipe 2 --tensor 2 --data 1 \
  --trace "$work/trace.json" >/dev/null || fail "--trace failed"
python3 - "$work/trace.json" <<'PY' || exit 1
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for r in range(4):
    mine = [e for e in ev if e["tid"] == r]
    kinds = {e["name"] for e in mine}
    assert {"forward", "backward", "optimizer step", "recv wait"} <= kinds, (r, kinds)
    assert sum(e["name"] == "forward" for e in mine) == 4, r  # 2 steps x 2 micro-batches
print("trace: 4 tracks, each with its forwards, backwards, receive waits and optimizer steps")
PY
out=$("$bin" --pipe 2 --schedule interleaved 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "the interleaved schedule needs >= 2 virtual stages per rank" || fail "interleaved V 1: $rc $out"
out=$("$bin" --pipe 3 --layers 2 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "2 layers do not split evenly over pipe 3 x 1 virtual stages" || fail "pipe 3: $rc $out"

# --device cuda where there is no GPU: exit 2, saying so (or that the binary has no CUDA).
if ! nvidia-smi -L >/dev/null 2>&1; then
  out=$("$bin" --device cuda --steps 1 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -Eq "no GPU was found|built without CUDA" || fail "--device cuda without a GPU: $rc $out"
fi
out=$("$bin" --device host --dtype f16 2>&1); rc=$?
[ $rc -eq 2 ] || fail "--dtype f16 exited $rc"

# Bad options: exit code 2 and a message.
out=$("$bin" --strategy zero9 2>&1); rc=$?
[ $rc -eq 2 ] || fail "unknown strategy exited $rc"
echo "$out" | grep -q "strategy 'zero9' is not available; use one of: ddp, ddp-sp, zero1, zero1-sp, zero2, zero2-sp, fsdp, fsdp-sp" || fail "message: $out"
out=$("$bin" --heads 3 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "width 64 is not divisible by 3 heads" || fail "heads 3: $rc $out"
out=$("$bin" --steps -4 2>&1); rc=$?
[ $rc -eq 2 ] || fail "negative steps exited $rc"

# A bad data file: the loader's message, non-zero exit.
printf 'not a token file' > "$work/bad.bin"
out=$("$bin" --data-file "$work/bad.bin" 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "TokenFile($work/bad.bin): the file has 16 bytes, fewer than the 1024-byte header" ||
  fail "bad data file: $rc $out"

# Text: trains on bytes and prints a sample.
for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog. "; done > "$work/text.txt"
out=$("$bin" --text "$work/text.txt" --seq 32 --layers 1 --width 32 --steps 10 --sample 10 --eval-every 5 2>&1) || fail "text run: $out"
echo "$out" | grep -q "^sample:" || fail "no sample: $out"
echo "weft-train: all checks passed"
