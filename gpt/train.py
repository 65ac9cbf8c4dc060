"""The training loop: build a run, then step (gpt/step.py), log, evaluate, sample and
checkpoint, each when its interval comes.

Run it as `python train_gpt2.py [flags]` (or `gpt2-train`); `--help` lists every flag.
The same file runs one process or one rank under torchrun.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from gpt import hellaswag, parallel, pretrained
from gpt.checkpoint import Checkpointer, LoopState, Parts, model_weights
from gpt.cli import parse_args, to_toml
from gpt.compat import old_torch_note
from gpt.config import Config, ConfigError, describe, grad_accum_steps, to_dict
from gpt.data import ShardLoader
from gpt.dist import (DTYPE_NAMES, Runtime, all_reduce_mean, any_rank, device_name,
                      init_runtime, is_oom, resolve_dtype, reuse_freed_memory,
                      set_matmul_precision, shutdown)
from gpt.errors import UserError
from gpt.evaluate import val_loss
from gpt.fileio import atomic_write
from gpt.generate import sample
from gpt.metrics import (MetricsLog, Progress, StepTimer, check_tracking, close_trackers,
                         flops_per_token, mfu, open_trackers, peak_memory, peak_tflops)
from gpt.model import GPT
from gpt.optim import lr_at
from gpt.profiling import Profiler
from gpt.signals import StopSignal
from gpt.rng import seed_everything
from gpt.shards import DataError, find_shards
from gpt.step import TrainingDiverged, forward_backward, nonfinite_tensors, optimizer_step
from gpt.tokenizer import GPT2_VOCAB, gpt2_tokenizer

class OutOfMemory(UserError):
    """The device (or host) ran out of memory; the message says which flag to lower."""


@dataclass
class Run:
    """Everything one training run is made of, built once by build_run()."""

    cfg: Config
    runtime: Runtime
    out_dir: Path
    model: GPT  # the bare model (sharded in place under FSDP)
    par: parallel.Parallelized  # the module the loop calls, and its optimizer
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype
    accum: int
    train_loader: ShardLoader
    val_loader: ShardLoader | None
    checkpointer: Checkpointer
    tokenizer: Any
    hellaswag_examples: list[Any] = field(default_factory=list)
    trackers: list[Any] = field(default_factory=list)  # TensorBoard / W&B, rank 0 only
    state: LoopState = field(default_factory=LoopState)
    log: MetricsLog | None = None  # opened by the loop
    progress: Progress | None = None  # started by the loop

    def say(self, *args: Any) -> None:
        """Print on rank 0 only."""
        if self.runtime.is_master:
            print(*args, flush=True)

    @property
    def end_step(self) -> int:
        """The step this run stops at: --max-steps, or --stop-at-step if sooner."""
        c = self.cfg
        return min(c.train.max_steps, c.checkpoint.stop_at_step or c.train.max_steps)

    def parts(self) -> Parts:
        """What a checkpoint of this run is made of."""
        return Parts(self.model, self.par.optimizer, self.scaler, self.train_loader, self.state,
                     self.cfg)


# ---------------------------------------------------------------------------------------
# building a run


def build_loaders(cfg: Config, runtime: Runtime) -> tuple[ShardLoader, ShardLoader | None]:
    """The train loader, and the val loader if validation is on and val_* shards exist."""
    d = cfg.data

    def loader(split: str, shuffle: bool = False) -> ShardLoader:
        return ShardLoader(d.data_dir, split, batch_size=d.batch_size, seq_len=d.seq_len,
                           rank=runtime.rank, world_size=runtime.world_size, seed=cfg.train.seed,
                           shuffle=shuffle, device=runtime.device,
                           vocab_size=cfg.model.vocab_size if d.check_tokens else None,
                           max_token=cfg.model.vocab_size - 1)

    train = loader("train", shuffle=d.shuffle)
    if cfg.eval.val_every == 0:
        return train, None
    try:
        find_shards(d.data_dir, "val")
    except DataError:
        if runtime.is_master:
            print(f"note: {d.data_dir} has no val_* shards; validation is off")
        return train, None
    return train, loader("val")


def build_model(cfg: Config, ckpt: dict[str, Any] | None, runtime: Runtime) -> GPT:
    """The model with its starting weights (the checkpoint's, GPT-2's or fresh), on its
    device and not yet sharded: every rank holds it all."""
    model = GPT(cfg.model)
    if ckpt is not None:
        model.load_state_dict(model_weights(ckpt, "checkpoint")[1])
    elif cfg.train.init_from:
        pre = pretrained.load_pretrained(cfg.train.init_from, vocab_size=cfg.model.vocab_size,
                                         block_size=cfg.model.block_size, dropout=cfg.model.dropout)
        model.load_state_dict(pre.state_dict())
        if runtime.is_master:
            print(f"initialised from {cfg.train.init_from}")
    return model.to(runtime.device)


def build_run(cfg: Config, runtime: Runtime) -> Run:
    t, e = cfg.train, cfg.eval
    if runtime.is_master and (note := old_torch_note()):
        print(note)
    parallel.check_mode(t.parallel, runtime)
    accum = grad_accum_steps(cfg.data.total_batch_tokens, cfg.data.batch_size, cfg.data.seq_len,
                             runtime.world_size)
    autocast_dtype = resolve_dtype(t.dtype, runtime.device)
    seed_everything(t.seed)
    set_matmul_precision(runtime, t.tf32)
    train_loader, val_loader = build_loaders(cfg, runtime)  # bad data stops before any file is written
    checkpointer = Checkpointer(Path(t.out_dir), cfg.checkpoint, runtime)
    resume_path, ckpt = checkpointer.open(cfg)  # the run folder is this run's from here on
    try:
        samples = e.sample_every > 0 and parallel.samples_on_this_rank(t.parallel, runtime)
        examples: list[Any] = []
        if e.hellaswag_every > 0:  # every rank scores its share; rank 0 downloads, once
            examples = hellaswag.load_examples(e.hellaswag_file, None, runtime.rank, None,
                                               e.hellaswag_max_examples)
        model = build_model(cfg, ckpt, runtime)
        run = Run(cfg=cfg, runtime=runtime, out_dir=checkpointer.out_dir, model=model,
                  par=parallel.parallelize(model, t, cfg.optim, runtime),
                  scaler=torch.amp.GradScaler(runtime.device_type,
                                              enabled=autocast_dtype == torch.float16),
                  autocast_dtype=autocast_dtype, accum=accum, train_loader=train_loader,
                  val_loader=val_loader, checkpointer=checkpointer,
                  tokenizer=gpt2_tokenizer() if samples else None, hellaswag_examples=examples)
        if ckpt is not None:
            checkpointer.restore(run.parts(), ckpt)
            run.say(f"resumed from {resume_path} at step {run.state.step}")
        if runtime.is_master:  # last: W&B can fail to start (no login)
            run.trackers = open_trackers(t.tensorboard, t.wandb_project, run.out_dir, to_dict(cfg))
    except BaseException:
        checkpointer.close(failed_at_start=True)
        raise
    return run


# ---------------------------------------------------------------------------------------
# the loop, and the periodic work it calls


def run_loop(run: Run) -> dict[str, Any]:
    cfg, rt, s = run.cfg, run.runtime, run.state
    end = run.end_step
    start, stopped_by, last_loss = s.step, None, None
    if already_done(run):
        return outcome(run)
    run.progress = Progress(cfg.data.total_batch_tokens, cfg.train.max_steps)
    timer = StepTimer(rt)
    with open_log(run), StopSignal() as stop, Profiler(cfg.profile, rt, start) as profiler:
        timer.reset()
        while True:
            at_end = s.step >= end
            with stop_at_bad_data(run):  # a val shard can fail too
                if periodic_work(run, at_end, first=s.step == start):
                    timer.reset()  # evaluation and checkpoint time is not training time
            if at_end:
                break

            step = s.step
            lr = lr_at(step, cfg.optim.max_lr, cfg.optim.min_lr_ratio,
                       cfg.optim.warmup_steps, cfg.train.max_steps)
            with profiler.step(step), stop_at_bad_data(run):
                loss, norm = forward_backward(run.par.train_model, run.scaler, run.par.optimizer,
                                              run.train_loader, run.accum, cfg.optim.grad_clip,
                                              rt.device_type, run.autocast_dtype, cfg.profile.nvtx)
                update_or_skip(run, step, norm, lr)
            s.step += 1
            timer.steps += 1

            if step % cfg.train.log_every == 0 or s.step == end:
                last_loss = log_step(run, step, loss, norm, lr, timer.lap())
            if any_rank(stop.signum is not None, rt):  # all ranks stop at the same step
                stopped_by = stop.signum or signal.SIGTERM
                name = signal.Signals(stopped_by).name
                path = save_checkpoint(run, reason=name)
                run.say(f"{name} received: " + (
                    f"saved checkpoint {path} at step {s.step}" if path else
                    f"stopped at step {s.step} without a checkpoint; "
                    f"{run.checkpointer.last_good()}") + "; continue with --resume auto")
                break
    return outcome(run, last_loss, stopped_by)


def already_done(run: Run) -> bool:
    """A resumed run at or past its last step says so, and leaves its record as it is."""
    if run.state.step < run.end_step:
        return False
    which = "--stop-at-step" if run.end_step < run.cfg.train.max_steps else "--max-steps"
    run.say(f"nothing to do: the run is already at step {run.state.step} and {which} is "
            f"{run.end_step}; raise {which} to train further")
    return True


def outcome(run: Run, loss: float | None = None, stopped_by: int | None = None) -> dict[str, Any]:
    s = run.state
    return {"loss": loss, "val_loss": s.last_val, "checkpoint": run.checkpointer.last_saved,
            "steps": s.step, "skipped": s.skipped, "stopped_by": stopped_by}


def periodic_work(run: Run, at_end: bool, first: bool) -> bool:
    """Validation, HellaSwag, checkpoint and samples, each when its interval (or the end)
    comes; the last two not on the step a run starts at. Returns whether any ran."""
    s, e = run.state, run.cfg.eval

    def due(every: int) -> bool:
        return every > 0 and (s.step % every == 0 or at_end)

    jobs = [
        (run.val_loader is not None and due(e.val_every), validate),
        (bool(run.hellaswag_examples) and due(e.hellaswag_every), score_hellaswag),
        (not first and (at_end or due(run.cfg.checkpoint.checkpoint_every)), save_checkpoint),
        (run.tokenizer is not None and not first and due(e.sample_every), log_samples),
    ]
    for wanted, job in jobs:
        if wanted:
            job(run)
    return any(wanted for wanted, _ in jobs)


@contextlib.contextmanager
def stop_at_bad_data(run: Run) -> Iterator[None]:
    """A shard that fails mid-step or in validation (truncated or replaced under the run)
    stops the run with its name. In one process the weights are still those of the last
    whole step, so they are saved with the loader wound back to the step's start; under
    torchrun the other ranks are inside a collective, so the error alone ends the job."""
    position = run.train_loader.position()
    try:
        yield
    except DataError as e:
        if run.runtime.distributed:
            raise
        run.par.optimizer.zero_grad(set_to_none=True)
        run.train_loader.seek(position)
        path = save_checkpoint(run, reason="data error")
        saved = (f"saved {path} at step {run.state.step}" if path else
                 f"no checkpoint saved ({run.checkpointer.last_good()})")
        raise DataError(f"{e}; {saved}: restore the data, then --resume auto") from None


def update_or_skip(run: Run, step: int, norm: torch.Tensor, lr: float) -> None:
    """The optimizer update, unless the gradient is not finite (bf16/fp32; fp16's scaler
    skips such updates itself). The norm is global, so every rank decides the same."""
    if not run.scaler.is_enabled() and not math.isfinite(norm.item()):
        skip_step(run, step)
    else:
        optimizer_step(run.par.optimizer, run.scaler, lr, run.cfg.profile.nvtx)
        run.state.bad_in_row = 0


def log_step(run: Run, step: int, loss: torch.Tensor, norm: torch.Tensor, lr: float,
             sec: float) -> float:
    """The step's line and metrics record, and the check that the weights and optimizer
    state are still finite; returns the loss (mean over ranks)."""
    rt, flops_tok = run.runtime, flops_per_token(run.cfg.model, run.cfg.data.seq_len)
    # One collective (every rank joins, only on log steps) and one read-back for the loss,
    # the count of non-finite weight and state tensors, and the (already global) norm.
    bad = nonfinite_tensors(run.model, run.par.optimizer)
    reduced = all_reduce_mean(torch.stack([loss.float(), bad]), rt)
    mean_loss, bad_mean, grad_norm = torch.cat([reduced, norm.float().reshape(1)]).tolist()
    if bad_mean > 0:
        raise TrainingDiverged(
            f"the weights or optimizer state hold NaN, inf or values beyond 1e19 after step "
            f"{step}, though the gradient was finite (the update itself overflowed: lower "
            f"--max-lr); {run.checkpointer.last_good()}; then --resume auto")
    tok_s = run.cfg.data.total_batch_tokens / sec
    util = mfu(tok_s / rt.world_size, flops_tok, run_peak(run))  # per-device MFU
    mem_gb = peak_memory(rt.device)[0] / 2**30  # this rank's; the header says what it measures
    progress = run.progress.update(step, sec)
    run.say(f"step {step:6d} | loss {mean_loss:.6f} | lr {lr:.4e} | norm {grad_norm:.4f} | "
            f"{sec * 1000:.1f} ms | {tok_s:,.0f} tok/s"
            + (f" | MFU {util * 100:.1f}%" if util is not None else "")
            + f" | mem {mem_gb:.2f} GiB | {progress.line()}")
    run.log.write({"type": "train", "step": step, "loss": mean_loss, "lr": lr,
                   "grad_norm": grad_norm, "ms": sec * 1000, "tokens_per_s": tok_s, "mfu": util,
                   "peak_mem_gb": mem_gb, **progress.record()})
    return mean_loss


def validate(run: Run) -> None:
    # Every rank scores its own disjoint slice; the mean is over all of them.
    rt, s = run.runtime, run.state
    s.last_val = all_reduce_mean(
        val_loss(run.par.train_model, run.val_loader, run.cfg.eval.val_steps, rt.device_type,
                 run.autocast_dtype), rt).item()
    run.say(f"step {s.step:6d} | val loss {s.last_val:.4f}")
    run.log.write({"type": "val", "step": s.step, "val_loss": s.last_val})


def score_hellaswag(run: Run) -> None:
    rt = run.runtime
    # GPT-2's ids only: a padded vocabulary's extra rows are masked out.
    hs = hellaswag.evaluate(run.par.train_model, run.hellaswag_examples, rt.device,
                            run.autocast_dtype, rt.rank, rt.world_size, valid_vocab=GPT2_VOCAB)
    run.say(f"step {run.state.step:6d} | hellaswag acc_norm {hs['acc_norm']:.4f} "
            f"(acc {hs['acc']:.4f}, {hs['total']} examples)")
    run.log.write({"type": "hellaswag", "step": run.state.step, **hs})


def save_checkpoint(run: Run, reason: str | None = None) -> Path | None:
    """Write a checkpoint (a collective) and record it, with why if not periodic. None
    during a streak of skipped steps: weights whose loss is not finite are no place to go
    back to (every rank knows the streak: the norm that starts it is global)."""
    s = run.state
    if s.bad_in_row:
        run.say(f"step {s.step:6d} | no checkpoint: the last {s.bad_in_row} step(s) had a "
                f"non-finite loss or gradient")
        run.log.write({"type": "checkpoint", "step": s.step, "path": None,
                       "reason": f"not saved: {s.bad_in_row} skipped step(s) in a row"})
        return None
    path = run.checkpointer.save(run.parts())
    record = {"type": "checkpoint", "step": run.state.step, "path": str(path)}
    run.log.write(record if reason is None else {**record, "reason": reason})
    if reason is None:
        run.say(f"saved checkpoint {path}")
    return path


def log_samples(run: Run) -> None:
    e, tok = run.cfg.eval, run.tokenizer
    gen = torch.Generator().manual_seed(run.cfg.train.seed + run.state.step)
    ids = sample(run.model, tok.encode_ordinary(e.sample_prompt), max_new_tokens=e.sample_tokens,
                 num_samples=e.num_samples, top_k=50, valid_vocab=tok.n_vocab, generator=gen,
                 autocast_dtype=run.autocast_dtype)
    texts = [tok.decode(row.tolist()) for row in ids]
    for i, text in enumerate(texts):
        run.say(f"--- sample {i} at step {run.state.step}:\n{text}")
    run.log.write({"type": "sample", "step": run.state.step, "samples": texts})


def skip_step(run: Run, step: int) -> None:
    """Drop a step whose loss or gradients are not finite; stop after too many in a row."""
    s = run.state
    run.par.optimizer.zero_grad(set_to_none=True)
    s.bad_in_row += 1
    s.skipped += 1
    run.say(f"step {step:6d} | non-finite loss or gradient: step skipped "
            f"({s.bad_in_row} in a row, {s.skipped} in all)")
    run.log.write({"type": "skipped", "step": step, "in_a_row": s.bad_in_row, "total": s.skipped})
    if s.bad_in_row >= run.cfg.train.max_bad_steps:
        raise TrainingDiverged(
            f"{s.bad_in_row} steps in a row had a non-finite loss or gradient (step {step}); "
            f"stopping. {run.checkpointer.last_good()}. Lower --max-lr or check the data, "
            f"then --resume auto"
        )


def run_peak(run: Run) -> float | None:
    """The device's bf16 peak TFLOP/s for MFU: --peak-tflops, else looked up by name."""
    return run.cfg.profile.peak_tflops or peak_tflops(device_name(run.runtime.device))


@contextlib.contextmanager
def open_log(run: Run) -> Iterator[MetricsLog]:
    """For the loop's life: config.toml written, the metrics log open on rank 0 (a no-op
    log elsewhere) with the run's header record, and the banner printed."""
    if run.runtime.is_master:
        # The recipe of the run, to repeat it with --config: without the job controls that
        # would make a repeat continue this run (resume) or stop it early (stop_at_step).
        recipe = dataclasses.replace(run.cfg, checkpoint=dataclasses.replace(
            run.cfg.checkpoint, resume="none", stop_at_step=None))
        text = ("# the resolved config of this run: python train_gpt2.py --config config.toml "
                "--out-dir NEW_FOLDER repeats it\n" + to_toml(recipe))
        try:
            atomic_write(run.out_dir / "config.toml", lambda fh: fh.write(text.encode()))
        except OSError as e:
            raise ConfigError(f"{run.out_dir / 'config.toml'}: cannot write it ({e.strerror or e})") from None
    run.log = MetricsLog(run.out_dir / "metrics.jsonl", enabled=run.runtime.is_master,
                         trackers=run.trackers)
    try:
        run.log.write(banner(run))
        yield run.log
    finally:
        run.log.close()


def banner(run: Run) -> dict[str, Any]:
    """Print what is about to run; return the metrics log's header record."""
    cfg, rt, d, par = run.cfg, run.runtime, run.cfg.data, run.par
    name, peak = device_name(rt.device), run_peak(run)
    run.say(describe(cfg))
    run.say(
        f"device {rt.device} ({name}) x {rt.world_size} | parallel {cfg.train.parallel}"
        f" | precision {DTYPE_NAMES[run.autocast_dtype]}"
        f"{' + tf32' if cfg.train.tf32 and rt.device_type == 'cuda' else ''}"
        f" | compile {cfg.train.compile_mode if par.compiled else False} | fused AdamW {par.fused} | params {run.model.num_params():,}"
        f" | grad accum {run.accum} x {d.batch_size} x {d.seq_len} tokens"
        f" | train tokens {run.train_loader.num_tokens:,}"
    )
    if peak is None:
        run.say("note: peak FLOP/s of this device unknown; MFU not reported (set --peak-tflops)")
    if cfg.optim.warmup_steps > cfg.train.max_steps and rt.is_master:
        print(f"warning: --warmup-steps {cfg.optim.warmup_steps} is longer than the run "
              f"(--max-steps {cfg.train.max_steps}): the learning rate never reaches --max-lr "
              f"{cfg.optim.max_lr}", file=sys.stderr)
    return {
        "type": "run", "config": to_dict(cfg), "device": str(rt.device),
        "device_name": name, "world_size": rt.world_size, "torch": torch.__version__,
        "dtype": DTYPE_NAMES[run.autocast_dtype], "compile": par.compiled,
        "fused_adamw": par.fused, "params": run.model.num_params(), "grad_accum": run.accum,
        "flops_per_token": flops_per_token(cfg.model, d.seq_len), "peak_tflops": peak,
        "peak_mem_source": peak_memory(rt.device)[1],
        "start_step": run.state.step,
        "resumed_from": str(run.checkpointer.resumed_from) if run.checkpointer.resumed_from else None,
        "time": time.time(),
    }


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured (one process, or one rank under torchrun)."""
    check_tracking(cfg.train.tensorboard, cfg.train.wandb_project)
    cfg = pretrained.with_pretrained_shape(cfg)
    runtime = init_runtime(cfg.train.device, cfg.train.dist_timeout)
    if runtime.device_type == "cpu" and cfg.train.cpu_malloc_reuse:
        reuse_freed_memory()
    clean = False
    try:
        result = build_and_run(cfg, runtime)
        clean = True
        return result
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            raise
        d = cfg.data
        raise OutOfMemory(
            f"out of memory on {runtime.device} at --batch-size {d.batch_size} x --seq-len "
            f"{d.seq_len}: lower --batch-size (gradient accumulation keeps each step at "
            f"--total-batch-tokens {d.total_batch_tokens}), or add --activation-checkpointing"
            f" ({' '.join(str(e).split())[:200]})") from None
    finally:
        shutdown(runtime, clean)


def build_and_run(cfg: Config, runtime: Runtime) -> dict[str, Any]:
    """The run lives in this frame alone, so it is gone by the time the process group is
    torn down (see dist.shutdown)."""
    run = build_run(cfg, runtime)
    try:
        return run_loop(run)
    finally:
        close_trackers(run.trackers)
        run.checkpointer.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the flags (a bad one exits with status 2 and a message naming it), then run."""
    return main_with(parse_args(argv))


def main_with(cfg: Config) -> int:
    """Train as configured; the process's exit status (one line on stderr for errors)."""
    prefix = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    try:
        result = train(cfg)
    except UserError as e:
        print(f"{prefix}error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prefix}interrupted", file=sys.stderr)
        return 130
    if result["stopped_by"] is not None:
        return 128 + int(result["stopped_by"])  # the conventional status of that signal
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
