"""The chunked loss's soft cap on CPU: one chunk's loss and gradient (gpt.model.chunked_ce._chunk_loss)
with the cap written as tanh (its form before commit 'soft cap through sigmoid') and as
sigmoid (today's), alternating in one process, glibc's reuse on as in the trainer.

    PYTHONPATH=. python benchmarks/chunked_loss/softcap_chunk.py REPEATS > OUT.json

A chunk as the tokens bench makes it: 585 rows (4,096 rows in 7 equal chunks) of 50,304."""
import json, platform, statistics, subprocess, sys, time

import torch

from gpt.model import chunked_ce
from gpt.runtime.device import reuse_freed_memory


def tanh_chunk_loss(z, targets, softcap, grads):
    """_chunk_loss as it was: the cap through tanh, its slope as 1 - tanh^2."""
    z = z.div_(softcap).tanh_()
    slope = 1.0 - z.square()
    z = z.mul_(softcap)
    loss, g = chunked_ce._chunk_loss(z, targets, 0.0, grads)
    return loss, g.mul_(slope)


reuse_freed_memory()
torch.manual_seed(0)
rows, vocab, cap = 585, 50304, 15.0
logits = torch.randn(rows, vocab) * 3
targets = torch.randint(0, vocab, (rows,))
variants = {"none": lambda z: chunked_ce._chunk_loss(z, targets, 0.0, True),
            "tanh": lambda z: tanh_chunk_loss(z, targets, cap, True),
            "sigmoid": lambda z: chunked_ce._chunk_loss(z, targets, cap, True)}
ref = variants["tanh"](logits.clone())
got = variants["sigmoid"](logits.clone())
times = {k: [] for k in variants}
for i in range(int(sys.argv[1])):
    for name, fn in variants.items():
        z = logits.clone()
        t0 = time.perf_counter()
        fn(z)
        times[name].append(time.perf_counter() - t0)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
out = {"command": " ".join(sys.argv), "commit": commit, "torch": torch.__version__,
       "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
       "rows": rows, "vocab": vocab, "softcap": cap,
       "loss_rel_diff": abs((got[0] - ref[0]) / ref[0]).item(),
       "grad_rel_diff": ((got[1] - ref[1]).norm() / ref[1].norm()).item()}
for name, v in times.items():  # the first two of each left out (warm-up)
    out[name] = {"median_ms": round(1000 * statistics.median(v[2:]), 2),
                 "min_ms": round(1000 * min(v[2:]), 2), "max_ms": round(1000 * max(v[2:]), 2)}
out["tanh_over_sigmoid"] = round(out["tanh"]["median_ms"] / out["sigmoid"]["median_ms"], 3)
print(json.dumps(out, indent=1))
