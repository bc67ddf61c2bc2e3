"""What the trainer scripts that check against transformers' fixtures (weft_train_llama.py,
weft_train_mixtral.py, weft_train_qwen3_moe.py) share: reading a safetensors file without PyTorch,
and the error metric they hold logits to."""
import json
import struct


def safetensors(path):
    """Every tensor of a safetensors file: name -> (shape, values), for F64, I64 and F32."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    head, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        fmt = {"F64": "d", "I64": "q", "F32": "f"}[v["dtype"]]
        out[k] = (v["shape"], struct.unpack(f"<{(hi - lo) // struct.calcsize(fmt)}{fmt}", body[lo:hi]))
    return out


def relative(ours, theirs):
    """max |ours - theirs| / max |theirs|: infinite for sizes that differ, nothing to compare, or NaN."""
    if len(ours) != len(theirs) or not theirs:
        return float("inf")
    err = max(abs(a - b) for a, b in zip(ours, theirs)) / max(abs(x) for x in theirs)
    return err if err == err else float("inf")
