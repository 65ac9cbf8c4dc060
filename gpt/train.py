"""The training loop: accumulate micro-batches, clip, step, log, evaluate, sample, checkpoint.

Run it as `python train_gpt2.py [flags]` (or `gpt2-train`); `--help` lists every flag.
The same file runs one process or one rank under torchrun.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from gpt import checkpoint, hellaswag, parallel, pretrained
from gpt.checkpoint import CheckpointError
from gpt.config import (Config, ConfigError, describe, grad_accum_steps, parse_args,
                        to_dict, to_toml)
from gpt.data import DataError, ShardLoader, find_shards
from gpt.dist import (DTYPE_NAMES, Runtime, all_reduce_mean, any_rank, autocast,
                      broadcast_object, device_name, gather_objects, init_runtime, resolve_dtype, shutdown,
                      synchronize)
from gpt.evaluate import val_loss
from gpt.generate import sample
from gpt.metrics import MetricsLog, flops_per_token, mfu, peak_tflops
from gpt.model import GPT
from gpt.optim import lr_at
from gpt.profiling import CudaProfilerWindow, MemorySnapshot, TorchProfile, nvtx_range
from gpt.tokenizer import GPT2_VOCAB, gpt2_tokenizer



class TrainingDiverged(RuntimeError):
    """Too many non-finite steps in a row."""


@dataclass
class LoopState:
    """What the loop carries from step to step, and a checkpoint restores."""

    step: int = 0  # optimizer steps completed
    last_val: float | None = None
    best_val: float = math.inf
    best_checkpoint: str | None = None
    bad_in_row: int = 0
    skipped: int = 0


@dataclass
class Run:
    """Everything one training run is made of, built once by build_run()."""

    cfg: Config
    runtime: Runtime
    out_dir: Path
    model: GPT  # the bare model (sharded in place under FSDP)
    train_model: nn.Module  # what the loop calls: compiled and/or DDP-wrapped
    optimizer: torch.optim.Optimizer
    fused: bool
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype
    accum: int
    compiled: bool
    train_loader: ShardLoader
    val_loader: ShardLoader | None
    tokenizer: Any
    hellaswag_examples: list[Any] = field(default_factory=list)
    state: LoopState = field(default_factory=LoopState)
    resumed_from: Path | None = None

    def say(self, *args: Any) -> None:
        """Print on rank 0 only."""
        if self.runtime.is_master:
            print(*args, flush=True)


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

    def reset(self) -> None:
        synchronize(self.runtime.device)
        self.start = time.perf_counter()
        self.steps = 0

    def lap(self) -> float:
        """Seconds per step since the last lap/reset."""
        synchronize(self.runtime.device)
        now = time.perf_counter()
        per_step = (now - self.start) / max(1, self.steps)
        self.start, self.steps = now, 0
        return per_step


class StopSignal:
    """SIGTERM/SIGINT set a flag; the loop finishes its step, checkpoints and exits.
    A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignal":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------
# one optimizer step


def forward_backward(
    model: nn.Module,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    loader: ShardLoader,
    accum_steps: int,
    grad_clip: float,
    device_type: str,
    autocast_dtype: torch.dtype,
    nvtx: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the mean loss over `accum_steps` micro-batches, unscaled and clipped.

    Returns (mean loss of this rank, global gradient norm before clipping) as device
    tensors, so the caller decides when to pay for reading them.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum: torch.Tensor | None = None
    for micro in range(accum_steps):
        parallel.set_grad_sync(model, micro == accum_steps - 1)
        x, y = loader.next_batch()
        with nvtx_range("forward", nvtx), autocast(device_type, autocast_dtype):
            _, loss = model(x, y)
        # Each micro-batch's mean loss is divided by the number of micro-batches, so the
        # summed gradients are those of the mean loss over the whole batch.
        loss = loss / accum_steps
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        with nvtx_range("backward", nvtx):
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # no-op unless fp16; clipping must see the true gradients
    max_norm = grad_clip if grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    assert loss_sum is not None  # accum_steps >= 1
    return loss_sum, parallel.full_tensor(norm)


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, lr: float,
                   nvtx: bool = False) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    with nvtx_range("optimizer", nvtx):
        scaler.step(optimizer)  # skips the update itself if fp16 gradients overflowed
        scaler.update()


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
    """forward_backward then the optimizer update, unconditionally (no non-finite guard)."""
    loss, norm = forward_backward(model, scaler, optimizer, loader, accum_steps, grad_clip,
                                  device_type, autocast_dtype)
    optimizer_step(optimizer, scaler, lr)
    return loss, norm


# ---------------------------------------------------------------------------------------
# building a run, resuming, checkpointing


def resolve_resume(cfg: Config, out_dir: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """Which checkpoint to start from (rank 0 decides): (path, its contents, warnings), or
    (None, None, warnings) for a fresh start. The contents are returned because checking
    the file meant loading it (memory-mapped), and rank 0 need not do that twice."""
    resume = cfg.train.resume
    existing = checkpoint.list_checkpoints(out_dir)
    if resume == "none":
        if existing:
            raise ConfigError(
                f"--out-dir {out_dir} already holds checkpoints ({existing[-1][1].name} is the "
                f"newest); continue it with --resume auto, or pick a new --out-dir"
            )
        return None, None, []
    if resume == "auto":
        path, ckpt, warnings = checkpoint.find_latest(out_dir)
        if path is None and existing:
            raise CheckpointError(
                f"--resume auto: no checkpoint in {out_dir} could be read: "
                + "; ".join(warnings)
            )
        return path, ckpt, warnings
    path = Path(resume)
    return path, checkpoint.load(path), []  # a clear CheckpointError if missing or damaged


def check_resume_config(ckpt: dict[str, Any], cfg: Config, path: Path) -> list[str]:
    """Refuse a checkpoint of another model; return notes on other settings that changed."""
    saved, current = ckpt["config"], to_dict(cfg)
    diffs = checkpoint.model_differences(saved.get("model", {}), current["model"])
    if diffs:
        raise CheckpointError(
            f"{path}: the checkpoint's model differs from this config: " + "; ".join(diffs)
        )
    notes = []
    for section in ("data", "optim", "train"):
        for key, value in current[section].items():
            old = saved.get(section, {}).get(key)
            if old != value and key not in ("resume",):
                notes.append(f"{key}: {old!r} -> {value!r}")
    return notes


def build_run(cfg: Config, runtime: Runtime) -> Run:
    d, t = cfg.data, cfg.train
    parallel.check_mode(t.parallel, runtime)
    accum = grad_accum_steps(d.total_batch_tokens, d.batch_size, d.seq_len, runtime.world_size)
    autocast_dtype = resolve_dtype(t.dtype, runtime.device)
    out_dir = prepare_out_dir(t.out_dir) if runtime.is_master else Path(t.out_dir)

    # Rank 0 decides where to start; every rank then reads that file (the run folder is
    # on storage every node sees, as multi-node training needs anyway).
    decision: tuple[str | None, list[str], str | None] = (None, [], None)
    ckpt: dict[str, Any] | None = None
    if runtime.is_master:
        try:
            path, ckpt, warnings = resolve_resume(cfg, out_dir)
            decision = (str(path) if path else None, warnings, None)
        except (ConfigError, CheckpointError) as e:
            decision = (None, [], f"{type(e).__name__}:{e}")
    resume_path, warnings, error = broadcast_object(decision, runtime)
    if error:
        kind, message = error.split(":", 1)
        raise (ConfigError if kind == "ConfigError" else CheckpointError)(message)
    for w in warnings:
        if runtime.is_master:
            print(f"warning: {w}", file=sys.stderr)
    if resume_path and ckpt is None:
        ckpt = checkpoint.load(resume_path)

    seed_everything(t.seed)
    set_matmul_precision(runtime, t.tf32)
    # The train and val loaders differ only in split and shuffling.
    make_loader = functools.partial(
        ShardLoader, d.data_dir, batch_size=d.batch_size, seq_len=d.seq_len, rank=runtime.rank,
        world_size=runtime.world_size, seed=t.seed, device=runtime.device,
        vocab_size=cfg.model.vocab_size if d.check_tokens else None,
        max_token=cfg.model.vocab_size - 1)
    train_loader = make_loader("train", shuffle=d.shuffle)
    val_loader = None
    if t.val_every > 0:
        try:
            find_shards(d.data_dir, "val")
        except DataError:
            if runtime.is_master:
                print(f"note: {d.data_dir} has no val_* shards; validation is off")
        else:
            val_loader = make_loader("val")
    # Under FSDP the forward pass is a collective, so every rank samples (the same text);
    # otherwise rank 0 samples alone.
    samples_here = runtime.is_master or t.parallel == "fsdp"
    tokenizer = gpt2_tokenizer() if t.sample_every > 0 and samples_here else None
    examples: list[Any] = []
    if t.hellaswag_every > 0:  # every rank scores its share; rank 0 downloads, once
        examples = hellaswag.load_examples(t.hellaswag_file, None, runtime.rank, None,
                                           t.hellaswag_max_examples)

    model = GPT(cfg.model)
    notes: list[str] = []
    if ckpt is not None:
        assert resume_path is not None
        notes = check_resume_config(ckpt, cfg, Path(resume_path))
        model.load_state_dict(ckpt["model"])  # before any sharding: every rank has it all
    elif t.init_from:
        pre = pretrained.load_pretrained(t.init_from, vocab_size=cfg.model.vocab_size,
                                         block_size=cfg.model.block_size, dropout=cfg.model.dropout)
        model.load_state_dict(pre.state_dict())
        del pre
        if runtime.is_master:
            print(f"initialised from {t.init_from}")
    model.to(runtime.device)
    if t.activation_checkpointing:
        parallel.apply_activation_checkpointing(model)
    compiled = t.compile if t.compile is not None else runtime.device_type == "cuda"
    train_model = parallel.wrap_model(model, t.parallel, runtime, compiled)
    optimizer, fused = parallel.make_optimizer(model, t.parallel, cfg.optim, runtime)
    scaler = torch.amp.GradScaler(runtime.device_type, enabled=autocast_dtype == torch.float16)

    run = Run(cfg=cfg, runtime=runtime, out_dir=out_dir, model=model, train_model=train_model,
              optimizer=optimizer, fused=fused, scaler=scaler, autocast_dtype=autocast_dtype,
              accum=accum, compiled=compiled, train_loader=train_loader, val_loader=val_loader,
              tokenizer=tokenizer, hellaswag_examples=examples)
    if ckpt is not None:
        restore(run, ckpt)
        run.resumed_from = Path(resume_path)
        run.say(f"resumed from {resume_path} at step {run.state.step}")
        for note in notes:
            run.say(f"note: setting changed since the checkpoint: {note}")
    return run


def restore(run: Run, ckpt: dict[str, Any]) -> None:
    """Load optimizer, scaler, loader, RNG and loop state (the model is already loaded)."""
    parallel.load_optimizer_state(run.model, run.optimizer, ckpt["optimizer"])
    if ckpt.get("scaler"):
        run.scaler.load_state_dict(ckpt["scaler"])
    rt = run.runtime
    loaders = ckpt["loader"]
    same_world = len(loaders) == rt.world_size
    # In lockstep every rank is at the same position; a new world size re-splits it
    # (the loader checks that the split is exact, or refuses).
    try:
        run.train_loader.load_state_dict(loaders[rt.rank] if same_world else loaders[0])
    except ValueError as e:
        raise CheckpointError(f"cannot continue the data where the checkpoint left it: {e}") from None
    rngs = ckpt.get("rng") or []
    if rngs:
        checkpoint.set_rng_state(rngs[rt.rank] if len(rngs) == rt.world_size else rngs[0])
    s = run.state
    s.step = int(ckpt["step"])
    s.last_val = ckpt.get("val_loss")
    best = ckpt.get("best_val_loss")
    s.best_val = math.inf if best is None else float(best)
    s.best_checkpoint = ckpt.get("best_checkpoint")
    s.skipped = int(ckpt.get("skipped_steps", 0))


def save_checkpoint(run: Run) -> Path:
    """Write a checkpoint of the current step (a collective: every rank calls it)."""
    rt, s = run.runtime, run.state
    model_sd = parallel.model_state(run.model)
    optim_sd = parallel.optimizer_state(run.model, run.optimizer, rt)
    loaders = gather_objects(run.train_loader.state_dict(), rt)
    rngs = gather_objects(checkpoint.rng_state(), rt)
    path = checkpoint.checkpoint_path(run.out_dir, s.step)
    error = None
    if rt.is_master:
        is_best = s.last_val is not None and s.last_val < s.best_val
        state = {
            "model": model_sd, "optimizer": optim_sd, "scaler": run.scaler.state_dict(),
            "loader": loaders, "rng": rngs, "config": to_dict(run.cfg), "step": s.step,
            "val_loss": s.last_val,
            "best_val_loss": s.last_val if is_best else (None if math.isinf(s.best_val) else s.best_val),
            "best_checkpoint": path.name if is_best else s.best_checkpoint,
            "skipped_steps": s.skipped,
        }
        try:
            checkpoint.save_atomic(state, path)
        except CheckpointError as e:
            error = str(e)
        else:
            if is_best:
                s.best_val, s.best_checkpoint = s.last_val, path.name  # type: ignore[assignment]
            protect = {s.best_checkpoint} if s.best_checkpoint else set()
            checkpoint.rotate(run.out_dir, run.cfg.train.keep_checkpoints, protect)
    # Every rank learns whether rank 0's write worked, so all fail together if not.
    error = broadcast_object(error, rt)
    if error:
        raise CheckpointError(error)
    return path


# ---------------------------------------------------------------------------------------
# the loop


def log_samples(run: Run, log: MetricsLog | None) -> None:
    cfg, tok = run.cfg, run.tokenizer
    gen = torch.Generator().manual_seed(cfg.train.seed + run.state.step)
    ids = sample(
        run.model,
        tok.encode_ordinary(cfg.train.sample_prompt),
        max_new_tokens=cfg.train.sample_tokens,
        num_samples=cfg.train.num_samples,
        top_k=50,
        valid_vocab=tok.n_vocab,
        generator=gen,
        autocast_dtype=run.autocast_dtype,
    )
    texts = [tok.decode(row.tolist()) for row in ids]
    for i, text in enumerate(texts):
        run.say(f"sample {i}: {text!r}")
    if log:
        log.write({"type": "sample", "step": run.state.step, "samples": texts})


def banner(run: Run, device_name: str, flops_tok: float, peak: float | None) -> dict[str, Any]:
    cfg, rt, d = run.cfg, run.runtime, run.cfg.data
    run.say(describe(cfg))
    run.say(
        f"device {rt.device} ({device_name}) x {rt.world_size} | parallel {cfg.train.parallel}"
        f" | precision {DTYPE_NAMES[run.autocast_dtype]}"
        f"{' + tf32' if cfg.train.tf32 and rt.device_type == 'cuda' else ''}"
        f" | compile {run.compiled} | fused AdamW {run.fused} | params {run.model.num_params():,}"
        f" | grad accum {run.accum} x {d.batch_size} x {d.seq_len} tokens"
        f" | train tokens {run.train_loader.num_tokens:,}"
    )
    if peak is None:
        run.say("note: peak FLOP/s of this device unknown; MFU not reported (set --peak-tflops)")
    return {
        "type": "run", "config": to_dict(cfg), "device": str(rt.device),
        "device_name": device_name, "world_size": rt.world_size, "torch": torch.__version__,
        "dtype": DTYPE_NAMES[run.autocast_dtype], "compile": run.compiled,
        "fused_adamw": run.fused, "params": run.model.num_params(), "grad_accum": run.accum,
        "flops_per_token": flops_tok, "peak_tflops": peak, "start_step": run.state.step,
        "resumed_from": str(run.resumed_from) if run.resumed_from else None, "time": time.time(),
    }


def run_loop(run: Run) -> dict[str, Any]:
    cfg, rt, s = run.cfg, run.runtime, run.state
    t, d = cfg.train, cfg.data
    flops_tok = flops_per_token(cfg.model, d.seq_len)
    name = device_name(rt.device)
    peak = t.peak_tflops or peak_tflops(name)
    header = banner(run, name, flops_tok, peak)
    log: MetricsLog | None = None
    if rt.is_master:
        (run.out_dir / "config.toml").write_text(to_toml(cfg))
        log = MetricsLog(run.out_dir / "metrics.jsonl")  # appended to, also on resume
        log.write(header)

    end = min(t.max_steps, t.stop_at_step) if t.stop_at_step else t.max_steps
    start = s.step
    timer = StepTimer(rt)
    ckpt_path: Path | None = None
    last_loss: float | None = None
    stopped_by: int | None = None
    profiled = range(t.profile_start, t.profile_start + max(1, t.profile_steps))
    try:
        with StopSignal() as stop, \
                MemorySnapshot(t.memory_snapshot, enabled=bool(t.memory_snapshot) and rt.is_master), \
                CudaProfilerWindow(t.profile_start, max(1, t.profile_steps),
                                   enabled=t.profile_steps > 0) as window, \
                TorchProfile(t.torch_profile, enabled=bool(t.torch_profile),
                             wait=max(0, t.profile_start - start - 1), warmup=1,
                             active=len(profiled), name=f"rank{rt.rank}") as tprof:
            timer.reset()
            while True:
                at_end = s.step >= end
                if run.val_loader is not None and (s.step % t.val_every == 0 or at_end):
                    # Every rank scores its own disjoint slice; the mean is over all of them.
                    s.last_val = all_reduce_mean(
                        val_loss(run.train_model, run.val_loader, t.val_steps, rt.device_type,
                                 run.autocast_dtype), rt).item()
                    run.say(f"step {s.step:6d} | val loss {s.last_val:.4f}")
                    if log:
                        log.write({"type": "val", "step": s.step, "val_loss": s.last_val})
                    timer.reset()  # evaluation time is not training time
                if run.hellaswag_examples and (s.step % t.hellaswag_every == 0 or at_end):
                    # GPT-2's ids only: a padded vocabulary's extra rows are masked out.
                    hs = hellaswag.evaluate(run.train_model, run.hellaswag_examples, rt.device,
                                            run.autocast_dtype, rt.rank, rt.world_size,
                                            valid_vocab=GPT2_VOCAB)
                    run.say(f"step {s.step:6d} | hellaswag acc_norm {hs['acc_norm']:.4f} "
                            f"(acc {hs['acc']:.4f}, {hs['total']} examples)")
                    if log:
                        log.write({"type": "hellaswag", "step": s.step, **hs})
                    timer.reset()
                periodic = t.checkpoint_every and s.step % t.checkpoint_every == 0
                if s.step > start and (at_end or periodic):
                    ckpt_path = checkpoint_and_log(run, log)
                    run.say(f"saved checkpoint {ckpt_path}")
                    timer.reset()
                if run.tokenizer is not None and s.step > start and (
                        s.step % t.sample_every == 0 or at_end):
                    log_samples(run, log)
                    timer.reset()
                if at_end:
                    break

                step = s.step
                window.step(step)
                lr = lr_at(step, cfg.optim.max_lr, cfg.optim.min_lr_ratio,
                           cfg.optim.warmup_steps, t.max_steps)
                with nvtx_range(f"step {step}", t.nvtx):
                    loss, norm = forward_backward(run.train_model, run.scaler, run.optimizer,
                                                  run.train_loader, run.accum, cfg.optim.grad_clip,
                                                  rt.device_type, run.autocast_dtype, t.nvtx)
                    if not run.scaler.is_enabled() and not math.isfinite(norm.item()):
                        # The norm is global (gradients are reduced), so every rank agrees.
                        skip_step(run, step, log)
                    else:
                        optimizer_step(run.optimizer, run.scaler, lr, t.nvtx)
                        s.bad_in_row = 0
                s.step += 1
                timer.steps += 1
                tprof.step()

                if step % t.log_every == 0 or s.step == end:
                    loss = all_reduce_mean(loss, rt)  # every rank joins, only on log steps
                    sec = timer.lap()
                    last_loss, grad_norm = loss.item(), norm.item()
                    tok_s = d.total_batch_tokens / sec
                    util = mfu(tok_s / rt.world_size, flops_tok, peak)  # per-device MFU
                    run.say(
                        f"step {step:6d} | loss {last_loss:.6f} | lr {lr:.4e} | norm "
                        f"{grad_norm:.4f} | {sec * 1000:.1f} ms | {tok_s:,.0f} tok/s"
                        + (f" | MFU {util * 100:.1f}%" if util is not None else "")
                    )
                    if log:
                        log.write({"type": "train", "step": step, "loss": last_loss, "lr": lr,
                                   "grad_norm": grad_norm, "ms": sec * 1000,
                                   "tokens_per_s": tok_s, "mfu": util})

                if any_rank(stop.signum is not None, rt):  # all ranks stop at the same step
                    stopped_by = stop.signum or signal.SIGTERM
                    signame = signal.Signals(stopped_by).name
                    ckpt_path = checkpoint_and_log(run, log, reason=signame)
                    run.say(f"{signame} received: saved checkpoint {ckpt_path} at step {s.step}; "
                            f"continue with --resume auto")
                    break
    finally:
        if log:
            log.close()
    return {"loss": last_loss, "val_loss": s.last_val, "checkpoint": ckpt_path,
            "steps": s.step, "skipped": s.skipped, "stopped_by": stopped_by}


def checkpoint_and_log(run: Run, log: MetricsLog | None, reason: str | None = None) -> Path:
    """save_checkpoint, and record it in the metrics log (with why, if not periodic)."""
    path = save_checkpoint(run)
    if log:
        record = {"type": "checkpoint", "step": run.state.step, "path": str(path)}
        log.write(record if reason is None else {**record, "reason": reason})
    return path


def skip_step(run: Run, step: int, log: MetricsLog | None) -> None:
    """Drop a step whose loss or gradients are not finite; stop after too many in a row."""
    s = run.state
    run.optimizer.zero_grad(set_to_none=True)
    s.bad_in_row += 1
    s.skipped += 1
    run.say(f"step {step:6d} | non-finite loss or gradient: step skipped "
            f"({s.bad_in_row} in a row, {s.skipped} in all)")
    if log:
        log.write({"type": "skipped", "step": step, "in_a_row": s.bad_in_row, "total": s.skipped})
    if s.bad_in_row >= run.cfg.train.max_bad_steps:
        newest = checkpoint.list_checkpoints(run.out_dir)
        last = f"the last good checkpoint is {newest[-1][1]}" if newest else "no checkpoint was written"
        raise TrainingDiverged(
            f"{s.bad_in_row} steps in a row had a non-finite loss or gradient (step {step}); "
            f"stopping. {last}. Lower --max-lr or check the data, then --resume auto"
        )


def with_pretrained_shape(cfg: Config) -> Config:
    """--init-from decides the model's depth and width (its config.json is read; the weights
    are loaded later, in build_run, unless a checkpoint is resumed instead)."""
    if not cfg.train.init_from:
        return cfg
    folder = pretrained.resolve(cfg.train.init_from)
    pre = pretrained.model_config_from_hf(pretrained.read_hf_config(folder), str(folder),
                                          cfg.model.vocab_size, cfg.model.block_size)
    shape = {k: getattr(pre, k) for k in ("n_layer", "n_head", "n_embd")}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **shape))


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured (one process, or one rank under torchrun)."""
    cfg = with_pretrained_shape(cfg)
    runtime = init_runtime(cfg.train.device, cfg.train.dist_timeout)
    clean = False
    try:
        result = run_loop(build_run(cfg, runtime))
        clean = True
        return result
    finally:
        shutdown(runtime, clean)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)  # exits with status 2 and a message on a bad flag or value
    prefix = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    try:
        result = train(cfg)
    except ConfigError as e:
        print(f"{prefix}error: {e}", file=sys.stderr)
        return 2
    except (DataError, CheckpointError, TrainingDiverged, pretrained.PretrainedError,
            hellaswag.HellaSwagError) as e:
        print(f"{prefix}error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prefix}interrupted", file=sys.stderr)
        return 130
    if result["stopped_by"] is not None:
        return 128 + int(result["stopped_by"])  # the conventional status of that signal
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
