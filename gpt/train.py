"""The training loop: accumulate micro-batches, clip, step, log, evaluate, sample, checkpoint.

Run it as `python train_gpt2.py [flags]` (or `gpt2-train`); `--help` lists every flag.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt import checkpoint
from gpt.config import Config, ConfigError, describe, grad_accum_steps, parse_args, to_dict, to_toml
from gpt.data import DataError, ShardError, ShardLoader, find_shards
from gpt.dist import Runtime, all_reduce_mean, init_runtime, resolve_dtype, shutdown
from gpt.evaluate import val_loss
from gpt.generate import sample
from gpt.tokenizer import gpt2_tokenizer
from gpt.metrics import MetricsLog, flops_per_token, mfu, peak_tflops
from gpt.model import GPT
from gpt.optim import build_optimizer, lr_at

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def prepare_out_dir(path: str) -> Path:
    """Create the run folder and prove it is writable before any work is done."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--out-dir {out}: cannot write there ({e.strerror or e})") from None
    return out


def set_matmul_precision(runtime: Runtime, tf32: bool) -> None:
    if runtime.device_type == "cuda":
        # TF32 runs fp32 matmuls on tensor cores (10-bit mantissa inputs, fp32 accumulate).
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


@dataclass
class StepTimer:
    """Wall time between log points; the device is synchronised only at those points, so
    steps in between queue up without host stalls."""

    runtime: Runtime
    start: float = 0.0
    steps: int = 0

    def sync(self) -> None:
        if self.runtime.device_type == "cuda":
            torch.cuda.synchronize(self.runtime.device)
        elif self.runtime.device_type == "mps":
            torch.mps.synchronize()

    def reset(self) -> None:
        self.sync()
        self.start = time.perf_counter()
        self.steps = 0

    def lap(self) -> float:
        """Seconds per step since the last lap/reset."""
        self.sync()
        now = time.perf_counter()
        per_step = (now - self.start) / max(1, self.steps)
        self.start, self.steps = now, 0
        return per_step


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loader: ShardLoader,
    accum_steps: int,
    lr: float,
    grad_clip: float,
    device_type: str,
    autocast_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over `accum_steps` micro-batches.

    Returns (mean loss, gradient norm) as device tensors, so the caller decides when to
    pay for the host sync of reading them.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum: torch.Tensor | None = None
    use_autocast = autocast_dtype != torch.float32
    is_ddp = isinstance(model, DDP)
    for micro in range(accum_steps):
        if is_ddp:
            # All-reduce gradients only on the last micro-step; set before the forward,
            # which is where DDP reads the flag.
            model.require_backward_grad_sync = micro == accum_steps - 1
        x, y = loader.next_batch()
        with torch.autocast(device_type, dtype=autocast_dtype, enabled=use_autocast):
            _, loss = model(x, y)
        # Each micro-batch's mean loss is divided by the number of micro-batches, so the
        # summed gradients are those of the mean loss over the whole batch.
        loss = loss / accum_steps
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # no-op unless fp16; clipping must see the true gradients
    max_norm = grad_clip if grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for group in optimizer.param_groups:
        group["lr"] = lr
    scaler.step(optimizer)
    scaler.update()
    assert loss_sum is not None  # accum_steps >= 1
    return loss_sum, norm


def log_samples(model: GPT, tokenizer: Any, cfg: Config, step: int, runtime: Runtime,
                autocast_dtype: torch.dtype, log: MetricsLog) -> None:
    gen = torch.Generator().manual_seed(cfg.train.seed + step)
    ids = sample(
        model,
        tokenizer.encode_ordinary(cfg.train.sample_prompt),
        max_new_tokens=cfg.train.sample_tokens,
        num_samples=cfg.train.num_samples,
        top_k=50,
        valid_vocab=tokenizer.n_vocab,
        generator=gen,
        autocast_dtype=autocast_dtype,
    )
    texts = [tokenizer.decode(row.tolist()) for row in ids]
    for i, text in enumerate(texts):
        print(f"sample {i}: {text!r}")
    log.write({"type": "sample", "step": step, "samples": texts})


def save_checkpoint(out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler, loader: ShardLoader, cfg: Config, step: int,
                    last_val: float | None) -> Path:
    state = {
        "model": checkpoint.clean_state_dict(model),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "loader": loader.state_dict(),
        "config": to_dict(cfg),
        "step": step,  # optimizer steps completed
        "val_loss": last_val,
    }
    return checkpoint.save_atomic(state, out_dir / f"ckpt_{step:06d}.pt")


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured (one process, or one rank under torchrun)."""
    runtime = init_runtime(cfg.train.device)
    try:
        return _train(cfg, runtime)
    finally:
        shutdown(runtime)


def _train(cfg: Config, runtime: Runtime) -> dict[str, Any]:
    d, t = cfg.data, cfg.train
    master = runtime.is_master
    say = print if master else (lambda *a, **k: None)  # only rank 0 talks and writes
    accum = grad_accum_steps(d.total_batch_tokens, d.batch_size, d.seq_len, runtime.world_size)
    autocast_dtype = resolve_dtype(t.dtype, runtime.device)
    out_dir = prepare_out_dir(t.out_dir) if master else Path(t.out_dir)
    seed_everything(t.seed)
    set_matmul_precision(runtime, t.tf32)

    vocab_check = cfg.model.vocab_size if d.check_tokens else None
    train_loader = ShardLoader(d.data_dir, "train", d.batch_size, d.seq_len,
                               rank=runtime.rank, world_size=runtime.world_size, seed=t.seed,
                               shuffle=d.shuffle, device=runtime.device, vocab_size=vocab_check)
    val_loader = None
    if t.val_every > 0:
        try:
            find_shards(d.data_dir, "val")
        except DataError:
            say(f"note: {d.data_dir} has no val_* shards; validation is off")
        else:
            val_loader = ShardLoader(d.data_dir, "val", d.batch_size, d.seq_len,
                                     rank=runtime.rank, world_size=runtime.world_size,
                                     seed=t.seed, device=runtime.device, vocab_size=vocab_check)
    tokenizer = gpt2_tokenizer() if t.sample_every > 0 and master else None

    model = GPT(cfg.model).to(runtime.device)
    use_compile = t.compile if t.compile is not None else runtime.device_type == "cuda"
    train_model: nn.Module = torch.compile(model) if use_compile else model
    if runtime.world_size > 1:
        device_ids = [runtime.local_rank] if runtime.device_type == "cuda" else None
        train_model = DDP(train_model, device_ids=device_ids)
    optimizer, fused = build_optimizer(model, cfg.optim, runtime.device)
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=autocast_dtype == torch.float16)

    n_params = model.num_params()
    flops_tok = flops_per_token(cfg.model, d.seq_len)
    device_name = (torch.cuda.get_device_name(runtime.device) if runtime.device_type == "cuda"
                   else platform.processor() or runtime.device_type)
    peak = t.peak_tflops or peak_tflops(device_name)

    say(describe(cfg))
    say(
        f"device {runtime.device} ({device_name}) x {runtime.world_size} | precision "
        f"{DTYPE_NAMES[autocast_dtype]}{' + tf32' if t.tf32 and runtime.device_type == 'cuda' else ''}"
        f" | compile {use_compile} | fused AdamW {fused} | params {n_params:,} | grad accum "
        f"{accum} x {d.batch_size} x {d.seq_len} tokens | train tokens {train_loader.num_tokens:,}"
    )
    if peak is None:
        say("note: peak FLOP/s of this device unknown; MFU not reported (set --peak-tflops)")
    log = None
    if master:
        (out_dir / "config.toml").write_text(to_toml(cfg))
        log = MetricsLog(out_dir / "metrics.jsonl")
        log.write({
            "type": "run", "config": to_dict(cfg), "device": str(runtime.device),
            "device_name": device_name, "world_size": runtime.world_size,
            "torch": torch.__version__, "dtype": DTYPE_NAMES[autocast_dtype],
            "compile": use_compile, "fused_adamw": fused, "params": n_params,
            "grad_accum": accum, "flops_per_token": flops_tok, "peak_tflops": peak,
            "time": time.time(),
        })

    timer = StepTimer(runtime)
    last_val: float | None = None
    last_loss: float | None = None
    ckpt_path: Path | None = None
    with contextlib.closing(log) if log else contextlib.nullcontext():
        timer.reset()
        for step in range(t.max_steps):
            last_step = step == t.max_steps - 1
            if val_loader is not None and (step % t.val_every == 0 or last_step):
                # Every rank scores its own disjoint slice; the mean is over all of them.
                last_val = all_reduce_mean(
                    val_loss(train_model, val_loader, t.val_steps, runtime.device_type,
                             autocast_dtype), runtime).item()
                say(f"step {step:6d} | val loss {last_val:.4f}")
                if log:
                    log.write({"type": "val", "step": step, "val_loss": last_val})
                timer.reset()  # evaluation time is not training time
            if tokenizer is not None and log and step > 0 and (step % t.sample_every == 0 or last_step):
                log_samples(model, tokenizer, cfg, step, runtime, autocast_dtype, log)
                timer.reset()

            lr = lr_at(step, cfg.optim.max_lr, cfg.optim.min_lr_ratio,
                       cfg.optim.warmup_steps, t.max_steps)
            loss, norm = train_step(train_model, optimizer, scaler, train_loader, accum, lr,
                                    cfg.optim.grad_clip, runtime.device_type, autocast_dtype)
            timer.steps += 1

            if step % t.log_every == 0 or last_step:
                loss = all_reduce_mean(loss, runtime)  # every rank joins, only on log steps
                sec = timer.lap()
                last_loss = loss.item()
                tok_s = d.total_batch_tokens / sec
                util = mfu(tok_s / runtime.world_size, flops_tok, peak)  # per-device MFU
                say(
                    f"step {step:6d} | loss {last_loss:.6f} | lr {lr:.4e} | norm {norm.item():.4f} | "
                    f"{sec * 1000:.1f} ms | {tok_s:,.0f} tok/s"
                    + (f" | MFU {util * 100:.1f}%" if util is not None else "")
                )
                if log:
                    log.write({"type": "train", "step": step, "loss": last_loss, "lr": lr,
                               "grad_norm": norm.item(), "ms": sec * 1000,
                               "tokens_per_s": tok_s, "mfu": util})

            done = step + 1
            if master and (last_step or (t.checkpoint_every and done % t.checkpoint_every == 0)):
                ckpt_path = save_checkpoint(out_dir, model, optimizer, scaler, train_loader,
                                            cfg, done, last_val)
                say(f"saved checkpoint {ckpt_path}")
                if log:
                    log.write({"type": "checkpoint", "step": done, "path": str(ckpt_path)})
                timer.reset()
    return {"loss": last_loss, "val_loss": last_val, "checkpoint": ckpt_path, "steps": t.max_steps}


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)  # exits with status 2 and a message on a bad flag or value
    try:
        train(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (DataError, ShardError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
