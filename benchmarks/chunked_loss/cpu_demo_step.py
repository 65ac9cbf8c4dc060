"""The CPU demo recipe's optimizer step with and without the chunked loss, alternating step
by step in one process (so both see the same machine load): PYTHONPATH=. python
benchmarks/chunked_loss/cpu_demo_step.py STEPS. Random tokens (the data folder is not read)."""
import torch, time, statistics, sys, json
from gpt.core.cli import parse_args
from gpt.engine import parallel
from gpt.engine.step import forward_backward, optimizer_step
from gpt.model.transformer import GPT
from gpt.runtime.device import reuse_freed_memory
from gpt.runtime.world import Runtime
reuse_freed_memory()
cfg = parse_args(["--config", "configs/cpu-demo.toml", "--data-dir", "unused"])
torch.manual_seed(0)
model = GPT(cfg.model)
par = parallel.parallelize(model, cfg.train, cfg.optim, Runtime(device=torch.device("cpu")), torch.float32)
class B:
    def next_batch(self):
        return torch.randint(0, 50257, (8, 128)), torch.randint(0, 50257, (8, 128))
times = {True: [], False: []}
for i in range(int(sys.argv[1])):
    for on in ((True, False) if i % 2 == 0 else (False, True)):
        model.chunked_loss = on
        t0 = time.perf_counter()
        _, norm = forward_backward(par.train_model, par.scaler, par.optimizer, B(), 2, 1.0, "cpu", torch.float32)
        optimizer_step(par.optimizer, par.scaler, 1e-4, norm)
        times[on].append(time.perf_counter() - t0)
r = {("chunked" if k else "unchunked"): {"median_ms": round(1000 * statistics.median(v[2:]), 1), "ms": [round(1000 * x, 1) for x in v]} for k, v in times.items()}
r["unchunked_over_chunked"] = round(r["unchunked"]["median_ms"] / r["chunked"]["median_ms"], 3)
print(json.dumps(r, indent=1))
