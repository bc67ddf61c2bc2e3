#!/usr/bin/env python3
"""Llama against transformers, regenerated: where PyTorch and transformers are installed, writes a
fresh reference (tools/reference/llama_reference.py: a random LlamaForCausalLM in float64), runs
weft's check against it (the llama test binary's transformers case: logits, loss and every gradient
within 1e-10 in f64, the export's exact round trip), then loads weft's f32 exports of it with
LlamaForCausalLM.from_pretrained, one file and sharded (files of at most 20000 bytes, with
model.safetensors.index.json, as save_pretrained shards), and compares their logits with the
reference's (1e-5 of the largest: the exports are f32). A fresh tied reference (--tied:
tie_word_embeddings) through the tied case the same way (1e-10 in f64). Where they are not installed it says so and is skipped (exit 77).

Usage: transformers_check.py LLAMA_TEST_BINARY
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
except ImportError as e:  # noqa: BLE001
    print(f"skipped: PyTorch, transformers and safetensors are needed ({e}); "
          "tests/fixtures/llama_hf is checked by the llama tests without them")
    sys.exit(77)


def main():
    binary = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "..", "tools", "reference", "llama_reference.py")
    with tempfile.TemporaryDirectory() as d:
        ref, exports = os.path.join(d, "ref"), os.path.join(d, "exports")
        tied = os.path.join(d, "tied")
        subprocess.run([sys.executable, script, "--out", ref, "--seed", "11"], check=True)
        subprocess.run([sys.executable, script, "--out", tied, "--seed", "17", "--tied"], check=True)
        env = dict(os.environ, WEFT_LLAMA_REFERENCE=ref, WEFT_LLAMA_REFERENCE_TIED=tied, WEFT_LLAMA_EXPORT_TO=exports)
        subprocess.run([binary, "-tc=*imported from transformers*"], check=True, env=env)
        r = load_file(os.path.join(ref, "reference.safetensors"))
        want = r["logits"]
        for form in ("one-file", "sharded"):
            export = os.path.join(exports, form)
            files = sorted(f for f in os.listdir(export) if f.endswith(".safetensors"))
            if (len(files) > 1) != (form == "sharded"):
                print(f"FAIL: the {form} export wrote {files}")
                return 1
            model = LlamaForCausalLM.from_pretrained(export)
            model.eval()
            with torch.no_grad():
                logits = model(input_ids=r["tokens"]).logits.double()
            err = ((logits - want).abs().max() / want.abs().max()).item()
            print(f"weft's export ({form}, {len(files)} safetensors file(s)) through LlamaForCausalLM.from_pretrained "
                  f"(f32): logits within {err:.3g} of the largest")
            if not err <= 1e-5:
                print("FAIL: the exported model computes other logits")
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
