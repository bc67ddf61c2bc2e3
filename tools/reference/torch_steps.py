"""The timed training steps of the PyTorch references (torch_gpt.py, torch_llama.py): AdamW (foreach,
the default; fused with --fused), gradient clipping at 1.0, random tokens; 2 warm-up steps, then the
median of --steps steps; one JSON line with the sizes, the step time and tokens/s."""
import json
import statistics
import time

import torch


def timed_steps(model, a, sizes):
    """Trains `model(x, y) -> loss` on a.threads threads for 2 + a.steps steps and prints the record:
    `sizes` (the model's options) with the implementation, the step's median seconds and tokens/s."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=a.fused or None)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(json.dumps({"impl": "pytorch" + (" fused" if a.fused else ""), "torch": torch.__version__, "threads": a.threads,
                      **sizes, "batch": a.batch, "step_s": s, "tokens_per_s": a.batch * a.seq / s}))
