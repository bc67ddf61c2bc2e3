#!/usr/bin/env bash
# The trainer under mpirun, one rank per process: every strategy (and a pipeline, and bf16) logs
# bit for bit the losses, learning rates and gradient norms of the thread run of the same mesh; only
# rank 0 prints and logs; a checkpoint that MPI processes save resumes in a thread run with the
# losses the MPI run went on to log; a rank started with another option, or the wrong process count,
# makes every rank refuse to start; SIGUSR1 to mpirun stops every rank cleanly after the same step.
# usage: weft_train_mpi.sh TRAIN_GPT MPIRUN [ARGS...]   (MPIRUN without -np)
set -u
# The checks below are Python asserts: PYTHONOPTIMIZE in the environment would strip them all.
unset PYTHONOPTIMIZE
bin=$(realpath "$1")  # absolute: some runs start in other working directories
shift
mpirun=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--device host --steps 3 --eval-every 0 --batch 8 --layers 2 --width 32 --seq 32)

same() {  # same(name, a.jsonl, b.jsonl): step, loss, lr, grad_norm and skipped equal as JSON numbers
  python3 - "$@" <<'PY' || exit 1
import json, sys
name, a, b = sys.argv[1:4]
keys = ("step", "loss", "lr", "grad_norm", "skipped", "eval_loss")
ra = [{k: r[k] for k in keys if k in r} for r in map(json.loads, open(a))]
rb = [{k: r[k] for k in keys if k in r} for r in map(json.loads, open(b))]
assert len(ra) == 3 and ra == rb, f"{name}: threads {ra} vs mpi {rb}"
print(f"{name}: threads and MPI logs equal bit for bit ({len(ra)} steps, last loss {ra[-1]['loss']!r})")
PY
}

cases=("ddp" "ddp-sp" "zero1" "zero1-sp" "zero2" "zero2-sp" "fsdp" "fsdp-sp" "ddp bf16" "pipe")
for c in "${cases[@]}"; do
  set -- $c
  args=(--strategy "$1")
  [ "${2:-}" = bf16 ] && args+=(--dtype bf16)
  if [ "$1" = pipe ]; then args=(--strategy ddp --pipe 2 --tensor 2 --data 1 --micro-batch 4); else args+=(--data 2 --tensor 2); fi
  "$bin" "${common[@]}" "${args[@]}" --launcher threads --log "$work/t.jsonl" >/dev/null || fail "$c: thread run failed"
  "${mpirun[@]}" -np 4 "$bin" "${common[@]}" "${args[@]}" --log "$work/m.jsonl" >"$work/m.out" 2>&1 ||
    { cat "$work/m.out"; fail "$c: mpirun run failed"; }
  same "$c" "$work/t.jsonl" "$work/m.jsonl"
  steps=$(grep -c "^step " "$work/m.out")
  [ "$steps" = 3 ] || fail "$c: expected 3 step lines from rank 0 only, got $steps"
done

# A checkpoint written by 4 MPI processes at step 2 resumes in a thread run: its step 3 is the MPI run's.
"${mpirun[@]}" -np 4 "$bin" "${common[@]}" --data 2 --tensor 2 --save-dir "$work/ck" --save-every 2 \
  --log "$work/m.jsonl" >/dev/null 2>&1 || fail "MPI run with checkpoints failed"
"$bin" "${common[@]}" --data 2 --tensor 2 --launcher threads --resume "$work/ck/step_00000002" --log "$work/r.jsonl" >/dev/null ||
  fail "thread resume of the MPI checkpoint failed"
python3 - "$work/m.jsonl" "$work/r.jsonl" <<'PY' || exit 1
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
r = [json.loads(l) for l in open(sys.argv[2])]
assert len(r) == 1 and r[0]["step"] == 3 and r[0]["loss"] == m[2]["loss"], (m[2], r)
print(f"a checkpoint of 4 MPI processes resumed on threads: step 3 loss {r[0]['loss']!r} as in the MPI run")
PY

# Ranks started in two working directories, each with a copy of the checkpoint under one relative
# path: every rank refuses to start, naming the two directories (before, each loaded its own copy).
mkdir -p "$work/cwd_a" "$work/cwd_b"
cp -r "$work/ck" "$work/cwd_a/ck" && cp -r "$work/ck" "$work/cwd_b/ck"
"${mpirun[@]}" -np 2 -wdir "$work/cwd_a" "$bin" "${common[@]}" --data 2 --tensor 2 --resume ck/step_00000002 : \
  -np 2 -wdir "$work/cwd_b" "$bin" "${common[@]}" --data 2 --tensor 2 --resume ck/step_00000002 >"$work/w.out" 2>&1 &&
  fail "ranks resuming from different directories started"
n=$(grep -c "start-up fingerprint: world rank 2 differs from world rank 0 in checkpoints: .*$work/cwd_b/ck/step_00000002" "$work/w.out")
[ "$n" = 4 ] || { cat "$work/w.out"; fail "expected the refusal naming both directories on 4 ranks, got $n"; }
grep -q "^step " "$work/w.out" && fail "a step ran with ranks on different checkpoints"
echo "working directories: all 4 ranks refused to resume from two copies under one relative path"

# One rank with another learning rate: every rank refuses, naming it and the field.
"${mpirun[@]}" -np 3 "$bin" "${common[@]}" --data 2 --tensor 2 : -np 1 "$bin" "${common[@]}" --data 2 --tensor 2 \
  --lr 0.002 >"$work/f.out" 2>&1 && fail "ranks with different options started"
n=$(grep -c "start-up fingerprint: world rank 3 differs from world rank 0 in optimization" "$work/f.out")
[ "$n" = 4 ] || { cat "$work/f.out"; fail "expected the fingerprint refusal on 4 ranks, got $n"; }
grep -q "^step " "$work/f.out" && fail "a step ran despite the fingerprint"
echo "fingerprint: all 4 ranks refused a rank started with --lr 0.002"

# SIGUSR1 to mpirun (which forwards it; SIGINT and SIGTERM make it kill the job): every rank stops
# after the same step, rank 0 logs it and why, the checkpoint is written, and the job exits 128 + 10.
long=(--device host --steps 100000 --eval-every 0 --batch 8 --layers 2 --width 32 --seq 32)
"${mpirun[@]}" -np 4 "$bin" "${long[@]}" --data 2 --tensor 2 --save-dir "$work/usr1" \
  --log "$work/u.jsonl" >"$work/u.out" 2>&1 &
job=$!
for _ in $(seq 600); do
  kill -0 "$job" 2>/dev/null || break
  [ -f "$work/u.jsonl" ] && [ "$(wc -l < "$work/u.jsonl")" -ge 2 ] && break
  sleep 0.1
done
kill -USR1 "$job"
wait "$job"
rc=$?
python3 - "$work/u.jsonl" "$rc" "$work/usr1" <<'PY' || { cat "$work/u.out"; exit 1; }
import json, os, sys
records = [json.loads(l) for l in open(sys.argv[1])]
last = records[-1]
rc = int(sys.argv[2])
saved = sorted(os.listdir(sys.argv[3]))
assert rc == 138 and last.get("stopped") == "SIGUSR1" and last["step"] == records[-2]["step"], (rc, records[-2:])
assert saved and saved[-1] == f"step_{last['step']:08d}", saved
print(f"SIGUSR1 to mpirun: every rank stopped after step {last['step']}, exit {rc}, checkpoint {saved[-1]}")
PY

# A long step under mpirun: SIGUSR1 during step 2 abandons it on every process at the same point
# (train/stop.hpp's agreed poll over MPI); the checkpoint is step 1's. The signal goes as soon as step
# 1's record is in the log (the processes agreed on step 1's end before it was written, so step 2's
# first polled point sees it wherever it lands: no sleep guesses where step 2 is). The log shows the
# step unfinished (step 1's record and the stop, no step 2); the script times, on its own clock, the
# signal to the "abandoned" line reaching mpirun's output, and holds it within the poll spacing
# (0.25 s), the checkpoint's write and a scheduling margin (2 s). The step is sized from one measured
# on the same mesh as thread ranks: its batch doubled until a step takes 1 s or more.
batch=32
while :; do
  rm -f "$work/probe.jsonl"
  "$bin" --device host --steps 1 --eval-every 0 --width 128 --seq 128 --batch $batch --micro-batch 8 --data 2 --tensor 2 \
    --log "$work/probe.jsonl" > /dev/null 2>&1
  long_enough=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(int(not r or $batch * 128 / r[0]['tokens_per_s'] >= 1.0))" \
    "$work/probe.jsonl" 2>/dev/null || echo 1)
  [ "$long_enough" = 1 ] || [ $batch -ge 512 ] && break
  batch=$((batch * 2))
done
long=(--device host --steps 100000 --eval-every 0 --width 128 --seq 128 --batch $batch --micro-batch 8)
"${mpirun[@]}" -np 4 "$bin" "${long[@]}" --data 2 --tensor 2 --save-dir "$work/abandon" \
  --log "$work/a.jsonl" >"$work/a.out" 2>&1 &
job=$!
for _ in $(seq 1200); do
  kill -0 "$job" 2>/dev/null || break
  [ -f "$work/a.jsonl" ] && [ "$(wc -l < "$work/a.jsonl")" -ge 1 ] && break
  sleep 0.1
done
sent=$(date +%s.%N)
kill -USR1 "$job"
seen=
for _ in $(seq 6000); do
  grep -q "^abandoned step" "$work/a.out" && { seen=$(date +%s.%N); break; }
  kill -0 "$job" 2>/dev/null || break
  sleep 0.01
done
wait "$job"
rc=$?
python3 - "$work/a.jsonl" "$rc" "$work/abandon" "$work/a.out" "$sent" "$seen" "$batch" <<'PY' || { cat "$work/a.out"; exit 1; }
import json, os, sys
records = [json.loads(l) for l in open(sys.argv[1])]
last, rc, saved, out = records[-1], int(sys.argv[2]), sorted(os.listdir(sys.argv[3])), open(sys.argv[4]).read()
step1 = int(sys.argv[7]) * 128 / records[0]["tokens_per_s"]
after = float(sys.argv[6]) - float(sys.argv[5]) if sys.argv[6] else float("inf")
assert step1 >= 0.5, f"step 1 took {step1:.3f} s at batch {sys.argv[7]}, under the 0.5 s after which a step is polled"
assert rc == 138 and last.get("abandoned_step") == 2 and last["step"] == 1 and len(records) == 2, (rc, records)
assert "abandoned step 2 on SIGUSR1" in out and after < 0.25 + 2.0, (after, step1, out[-500:])
assert saved and saved[-1] == "step_00000001", saved
print(f"a long step under mpirun: abandoned {after:.3f} s after SIGUSR1 (the script's clock; step 1 took {step1:.2f} s) "
      f"on every process, exit {rc}, checkpoint {saved[-1]}")
PY

# The wrong number of processes.
"${mpirun[@]}" -np 2 "$bin" "${common[@]}" --data 2 --tensor 2 >"$work/n.out" 2>&1
[ $? = 2 ] || fail "2 processes for 4 ranks did not exit with 2"
grep -q "mpirun started 2 processes but data 2 x pipe 1 x tensor 2 = 4 ranks; run mpirun -np 4" "$work/n.out" ||
  { cat "$work/n.out"; fail "no message for the wrong process count"; }
echo "wrong process count: refused with exit status 2"
