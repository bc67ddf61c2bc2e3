#!/usr/bin/env python3
"""weft-export's GPT-2 read by transformers' GPT2LMHeadModel:

  gpt2_transformers.py TRAIN_GPT WEFT_EXPORT

The tiny GPT-2 trained 3 steps on data 2 x tensor 2 and saved; weft-export writes it as a Hugging
Face GPT-2 safetensors file with the logits weft computes for the model's sequence length of tokens;
tools/reference/hf_compare.py loads the file into GPT2LMHeadModel (every tensor by name, the LM head
tied) and compares its logits with weft's (within 1e-4 of the largest: f32 on both sides, sums in
other orders). Skipped (exit 77) where PyTorch, transformers, safetensors or numpy is missing.
"""
import importlib.util, os, subprocess, sys, tempfile

missing = [m for m in ("torch", "transformers", "safetensors", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    print(f"SKIPPED: the GPT-2 export through transformers needs {', '.join(missing)}")
    sys.exit(77)
train, export = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp(prefix="weft_gpt2_hf_")
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
ck = os.path.join(work, "ck")
p = subprocess.run([train, "--steps", "3", "--eval-every", "0", "--save-dir", ck], capture_output=True, text=True, env=env,
                   timeout=600)
if p.returncode != 0:
    sys.exit(f"weft-train failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
p = subprocess.run([sys.executable, os.path.join(here, "..", "..", "tools", "reference", "hf_compare.py"), "--export", export,
                    "--checkpoint", ck], env=env, timeout=600)
sys.exit(p.returncode)
