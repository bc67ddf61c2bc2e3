#!/usr/bin/env python3
"""Checkpoints as a hostile user and an unlucky operator would try them, through the trainer and
weft-export (docs/checkpoints.md):

  hostile.py TRAIN_GPT WEFT_EXPORT

Each case prepares a checkpoint (or a directory, a file, a held lock), runs a command, and checks
its exit status and a fragment of its message; a table of every case and what it printed ends the
run. A case that hangs fails at its timeout (60 s: a refusal takes well under a second of that, the
rest is the trainer's start-up on a loaded machine under ASan).
"""
import fcntl, json, os, shutil, subprocess, sys, tempfile, time

train, export = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="weft_hostile_")
env = dict(os.environ, ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=0")
SIZES = {"eval-every": 0, "batch": 4, "layers": 2, "width": 32, "seq": 16, "heads": 4, "data": 2, "tensor": 1}
def sized(**changes):
    """The small run's options, with some changed (layers=1)."""
    return [x for k, v in {**SIZES, **changes}.items() for x in (f"--{k.replace('_', '-')}", str(v))]
small = sized()
results, failures = [], 0


def run(args, timeout=60, extra_env=None, binary=None):
    e = dict(env, **(extra_env or {}))
    t0 = time.monotonic()
    try:
        p = subprocess.run([binary or train, *args], capture_output=True, text=True, env=e, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s", time.monotonic() - t0


def case(name, status, fragment, args, absent=None, **kw):
    """Runs args; the case passes when it exits with `status`, prints `fragment`, and not `absent`."""
    global failures
    rc, out, took = run(args, **kw)
    ok = rc == status and fragment in out and (absent is None or absent not in out)
    if not ok:
        failures += 1
        print(f"FAIL: {name}: exit {rc} (expected {status}), expected {fragment!r}" +
              (f" and not {absent!r}" if absent else "") + f"; printed:\n{out[-1500:]}")
    line = next((l for l in out.splitlines() if fragment in l), out.strip().splitlines()[-1] if out.strip() else "")
    results.append((name, rc, took, line.strip()[:160]))
    return ok, out


def copy(src, name):
    dst = os.path.join(work, name)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def edit_manifest(step_dir, f):
    path = os.path.join(step_dir, "manifest.json")
    j = json.load(open(path))
    f(j)
    open(path, "w").write(json.dumps(j))


# A run of 10 steps that saves at 5 and 10 (2 layers, 4 heads), and its Hugging Face export.
base = os.path.join(work, "base")
rc, out, _ = run([*small, "--steps", "10", "--save-dir", base, "--save-every", "5"], timeout=300)
if rc != 0: sys.exit(f"the base run failed (exit {rc}):\n{out}")
step5 = os.path.join(base, "step_00000005")
hf = os.path.join(work, "hf")
os.mkdir(hf)
rc, out, _ = run(["--checkpoint", base, "--out", os.path.join(hf, "model.safetensors")], binary=export)
if rc != 0: sys.exit(f"the export failed (exit {rc}):\n{out}")

# 1. Pruning after a rollback: resumed from step 5 of a run that reached 10, saving every step and
#    keeping 1. Before: each new checkpoint was removed right after it was published, latest was
#    left on a deleted step 8, and the run said "saved".
roll = copy(base, "rollback")
ok, out = case("rollback: --keep 1 after --resume step_5", 0, "is past the resumed step 5; it is kept",
               [*small, "--steps", "8", "--save-dir", roll, "--save-every", "1", "--keep", "1",
                "--resume", os.path.join(roll, "step_00000005")])
kept = sorted(n for n in os.listdir(roll) if n.startswith("step_"))
latest = open(os.path.join(roll, "latest")).read().strip()
if kept != ["step_00000008", "step_00000010"] or latest != "step_00000008":
    failures += 1
    print(f"FAIL: rollback: kept {kept}, latest {latest!r}; expected step 8 (latest) and step 10")
results.append(("rollback: what is left", 0, 0.0, f"{' '.join(kept)}; latest -> {latest}"))
case("rollback: latest resumes", 0, f"resumed from {os.path.join(roll, 'step_00000008')} at step 8",
     [*small, "--steps", "9", "--save-dir", roll, "--resume", "latest"])

# A `latest` that moves while a run resumes from it (another trainer saving into the directory):
# every thread rank of the process loads the step resolved once, so none reads another (before: each
# rank resolved it, and a rank that read the other step failed the fingerprint, "start every rank from
# the same build"). `latest` flips between steps 5 and 10 as fast as a rename goes, 5 resumes.
import threading
flip = copy(base, "flipping")
stop_flipping = threading.Event()
def flipper():
    k = 0
    while not stop_flipping.is_set():
        tmp = os.path.join(flip, "latest.flip")
        open(tmp, "w").write("step_00000005\n" if k % 2 else "step_00000010\n")
        os.replace(tmp, os.path.join(flip, "latest"))
        k += 1
flipping = threading.Thread(target=flipper)
flipping.start()
try:
    for attempt in range(5):
        case(f"a resume while latest moves, on 4 thread ranks ({attempt + 1} of 5)", 0, "resumed from ",
             [*sized(tensor=2), "--steps", "12", "--resume", flip])
finally:
    stop_flipping.set()
    flipping.join()

# 2. Nesting and size, refused before parsing (before: SIGSEGV in the JSON library; OOM at 22 GB).
deep = copy(step5, "deep")
text = open(os.path.join(deep, "manifest.json")).read()
at = text.index('"run": {') + len('"run": {')  # a value the parser's caller copies (and printed when refused)
open(os.path.join(deep, "manifest.json"), "w").write(text[:at] + '"deep": ' + "[" * 200000 + "]" * 200000 + ", " + text[at:])
case("manifest nested 200000 deep: --resume", 1, "nests JSON arrays and objects 33 or more deep, over the limit of 32",
     [*small, "--steps", "6", "--resume", deep])
case("manifest nested 200000 deep: weft-export", 1, "nests JSON arrays and objects 33 or more deep",
     ["--checkpoint", deep, "--out", os.path.join(work, "x.safetensors")], binary=export)
huge = copy(step5, "huge")
os.truncate(os.path.join(huge, "manifest.json"), 300 << 20)  # sparse: nothing is read
case("manifest of 300 MB", 1, f"is {300 << 20} bytes, over the limit of 268435456", [*small, "--steps", "6", "--resume", huge])
many = copy(step5, "many_files")
edit_manifest(many, lambda j: j["files"].extend({"name": f"extra_{i}", "bytes": 8, "xxh3": "0" * 16} for i in range(100000)))
case("100000 extra file entries (linear checks; before: 255 s)", 1, "extra_0): is missing",
     [*small, "--steps", "6", "--resume", many])
fifo = copy(step5, "fifo")
os.remove(os.path.join(fifo, "manifest.json"))
os.mkfifo(os.path.join(fifo, "manifest.json"))
case("manifest.json a FIFO (no hang)", 1, "manifest.json): is not a regular file", [*small, "--steps", "6", "--resume", fifo])
hdr = os.path.join(work, "deep_header")
os.mkdir(hdr)
shutil.copy(os.path.join(hf, "config.json"), hdr)
header = ('{"x": {"dtype": ' + "[" * 100000 + "]" * 100000 + ', "shape": [], "data_offsets": [0, 0]}}').encode()
open(os.path.join(hdr, "model.safetensors"), "wb").write(len(header).to_bytes(8, "little") + header)
case("safetensors header nested 100000 deep: --init-from", 1, "nests JSON arrays and objects 9 or more deep",
     [*small, "--steps", "1", "--init-from", os.path.join(hdr, "model.safetensors")])

# 3. Loads that trusted the manifest beyond the hashes.
swap = copy(step5, "swapped")
def swapped(j):
    t = j["tensors"]
    t["param/h0.ln1.weight"]["pieces"], t["param/h0.ln1.bias"]["pieces"] = t["param/h0.ln1.bias"]["pieces"], t["param/h0.ln1.weight"]["pieces"]
edit_manifest(swap, swapped)
case("two same-shaped tensors' pieces swapped: --resume", 1, "differs from the file's record of it in its tensor",
     [*small, "--steps", "6", "--resume", swap])
case("two same-shaped tensors' pieces swapped: weft-export", 1, "differs from the file's record of it in its tensor",
     ["--checkpoint", swap, "--out", os.path.join(work, "y.safetensors")], binary=export)
# Another model's checkpoint: refused before anything is built (exit 2, train/checks.hpp
# check_resume_model), by the field that differs.
case("a 2-layer checkpoint into a 1-layer model", 2, "was saved from a model with layers = 2; this model has layers = 1",
     [*sized(layers=1), "--steps", "6", "--resume", step5], absent="the previous checkpoint is unchanged")
case("a 4-head checkpoint into a 2-head model", 2, "was saved from a model with heads = 4; this model has heads = 2",
     [*sized(heads=2), "--steps", "6", "--resume", step5])
case("a 2-layer export into a 1-layer model: --init-from", 1, "that a GPT-2 of 1 layers, 4 heads and width 32 does not have",
     [*sized(layers=1), "--steps", "1", "--init-from", os.path.join(hf, "model.safetensors")])
case("a 4-head export into a 2-head model: --init-from", 1, "config.json): has n_head 4; this model has 2",
     [*sized(heads=2), "--steps", "1", "--init-from", os.path.join(hf, "model.safetensors")])
for name, edit, fragment in [
        ("run.step -1", lambda j: j["run"].update(step=-1), "has run.step -1; expected an integer in [0, 9007199254740992]"),
        ("step 2^60", lambda j: (j.update(step=1 << 60), j["run"].update(step=1 << 60)), "has step 1152921504606846976; expected"),
        ("optimizer.steps -3", lambda j: j["optimizer"].update(steps=-3), "has optimizer.steps -3"),
        ("run.loader_position 2^60", lambda j: j["run"].update(loader_position=1 << 60), "has run.loader_position 1152921504606846976"),
        ("run.seed -1", lambda j: j["run"].update(seed=-1), "has run.seed -1")]:
    d = copy(step5, name.replace(" ", "_").replace("^", ""))
    edit_manifest(d, edit)
    case(name, 1, fragment, [*small, "--steps", "6", "--resume", d])
case("resume past --steps (before: 'final loss 0.0000', exit 0)", 2, "is at step 5, at or past --steps 5; pass --steps above 5",
     [*small, "--steps", "5", "--resume", step5])
link = copy(step5, "link")
outside = os.path.join(work, "outside.safetensors")
shutil.move(os.path.join(link, "rank_00001.safetensors"), outside)
os.symlink(outside, os.path.join(link, "rank_00001.safetensors"))
case("a rank file that is a link out of the checkpoint", 1, "rank_00001.safetensors): is a symbolic link",
     [*small, "--steps", "6", "--resume", link])
renamed = os.path.join(work, "renamed", "step_00000007")
shutil.copytree(step5, renamed)
case("step_00000007 holding the manifest of step 5", 1, "is named for step 7 but holds the manifest of step 5",
     [*small, "--steps", "9", "--resume", renamed])
neg = copy(step5, "negative_layers")
edit_manifest(neg, lambda j: j["model"].update(layers=-2))
case("weft-export of a model record with layers -2", 1, "include one below 1",
     ["--checkpoint", neg, "--out", os.path.join(work, "z.safetensors")], binary=export)
lroot = copy(base, "latest_link")
os.remove(os.path.join(lroot, "latest"))
os.symlink(os.path.join(lroot, "step_00000010"), os.path.join(lroot, "latest"))
case("latest a link", 1, "has a latest pointer that is not a regular file", [*small, "--steps", "11", "--resume", lroot])

# 4. Causes shown, promises kept.
r0 = os.path.join(work, "rank0_fails")
os.makedirs(os.path.join(r0, "latest.tmp", "x"))
case("rank 0 cannot move latest (4 thread ranks): its cause printed", 1,
     "publishing the checkpoint failed on world rank 0: checkpoint(" + r0 + "/latest.tmp): cannot open (Is a directory)",
     [*sized(tensor=2), "--steps", "1", "--save-dir", r0])
case("a save directory that cannot be written: refused at start-up", 2, "cannot create its lock file .weft.lock",
     [*small, "--steps", "1", "--save-dir", "/proc"], absent="step     1/")
held = os.path.join(work, "held")
os.mkdir(held)
dir_fd = os.open(held, os.O_RDONLY)  # a trainer's lock: on the directory, its holder in .weft.lock
fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
open(os.path.join(held, ".weft.lock"), "w").write(f"pid {os.getpid()} on the test\n")
case("a second trainer on the same --save-dir", 2, f"is in use by another trainer (pid {os.getpid()} on the test)",
     [*small, "--steps", "1", "--save-dir", held])
os.close(dir_fd)
# A running trainer whose .weft.lock someone deleted still holds the directory (before: the lock was
# the file's, and a second trainer locked a new one and wrote beside the first).
running = os.path.join(work, "running")
first = subprocess.Popen([train, *small, "--steps", "100000", "--save-dir", running, "--log", os.path.join(work, "running.jsonl")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
for _ in range(600):  # its first step logged: the lock is taken before the first step
    if os.path.exists(os.path.join(work, "running.jsonl")) and open(os.path.join(work, "running.jsonl")).read().count("\n") >= 1:
        break
    time.sleep(0.1)
os.remove(os.path.join(running, ".weft.lock"))
case("a second trainer after .weft.lock was deleted", 2, "is in use by another trainer (another process)",
     [*small, "--steps", "1", "--save-dir", running])
first.kill(); first.wait()
case("--log to a full device (before: exit 0)", 1, "writing '/dev/full' failed (No space left on device)",
     [*small, "--steps", "1", "--log", "/dev/full"])
case("--trace to a full device", 1, "writing the trace file /dev/full failed", [*small, "--steps", "1", "--trace", "/dev/full"])
tmp = os.path.join(work, "tmpdir")
os.mkdir(tmp)
case("a refused --init-from", 1, "has no tensor transformer.wte.weight; export a GPT-2 of 2 layers, or choose the sizes of this file", [*small, "--steps", "1", "--init-from", os.path.join(base, "step_00000005", "rank_00000.safetensors")],
     extra_env={"TMPDIR": tmp})
if os.listdir(tmp):
    failures += 1
    print(f"FAIL: a refused --init-from left {os.listdir(tmp)} in TMPDIR")
gone = subprocess.Popen(["true"]); gone.wait()  # a pid that no longer runs
stale = os.path.join(tmp, f"weft_init_{gone.pid}_AbCdEf")
os.makedirs(os.path.join(stale, "inner"))
case("--init-from after a killed one", 0, f"initial weights: {os.path.join(hf, 'model.safetensors')} (Hugging Face layout)",
     [*small, "--steps", "1", "--init-from", os.path.join(hf, "model.safetensors")],
     extra_env={"TMPDIR": tmp})
if os.listdir(tmp):
    failures += 1
    print(f"FAIL: the killed run's {os.listdir(tmp)} was not removed from TMPDIR")
results.append(("TMPDIR after both", 0, 0.0, f"holds {os.listdir(tmp)}"))

print(f"{'case':<62} {'exit':>4} {'s':>6}  message")
for name, rc, took, line in results:
    print(f"{name:<62} {str(rc):>4} {took:6.2f}  {line}")
shutil.rmtree(work, ignore_errors=True)
print(f"{len(results) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
