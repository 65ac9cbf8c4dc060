"""The training loop: build a run, then step (gpt/engine/step.py), log, evaluate, sample and
checkpoint, each when its interval comes.

Run it as `python train_gpt2.py [flags]` (or `gpt2-train`); `--help` lists every flag.
The same file runs one process or one rank under torchrun.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import torch

from gpt.checkpoint import weights
from gpt.engine import parallel
from gpt.eval import bpb, harness_tasks, hellaswag
from gpt.model import fp8
from gpt.optim import muon
from gpt.model.attention_mask import set_attention_step
from gpt.checkpoint.files import model_weights
from gpt.checkpoint.checkpointer import Checkpointer
from gpt.core.cli import parse_command
from gpt.core.compat import old_torch_note
from gpt.core.config import Config, to_dict
from gpt.data.loader import ShardLoader
from gpt.runtime.dist import (Runtime, all_reduce_mean, init_runtime, is_oom, peer_lost,
                      reuse_freed_memory, set_matmul_precision, shutdown)
from gpt.core.errors import UserError
from gpt.eval.validation import val_loss
from gpt.eval.sampling import sample
from gpt.report.metrics import (Progress, StepTimer, close_trackers, flops_per_token, mfu, open_trackers,
                         peak_memory)
from gpt.model.transformer import GPT
from gpt.optim.optimizer import lr_at
from gpt.plan.preflight import Plan, preflight
from gpt.report.profiling import Profiler
from gpt.train.run import Run
from gpt.train.run_curves import RunCurves
from gpt.train.run_record import open_log, run_peak
from gpt.train.run_summary import Ending, Tally, summarize
from gpt.train.signals import StopSignal
from gpt.core.rng import seed_everything
from gpt.data.shards import DataError, find_shards
from gpt.engine.step import TrainingDiverged, forward_backward, nonfinite_tensors, optimizer_step
from gpt.data.tokenizer import GPT2_VOCAB, gpt2_tokenizer
from gpt.train.train_tasks import TrainingTasks


class OutOfMemory(UserError):
    """The device (or host) ran out of memory; the message says which flag to lower."""


# ---------------------------------------------------------------------------------------
# building a run


def build_loaders(cfg: Config, runtime: Runtime) -> tuple[ShardLoader, ShardLoader | None]:
    """The train loader, and the val loader if validation is on and val_* shards exist."""
    d = cfg.data

    def loader(split: str, shuffle: bool = False) -> ShardLoader:
        # --check-tokens scanned every shard in the preflight (gpt/plan/preflight.py), as the
        # dry run does; each batch is still checked as it is read (max_token)
        return ShardLoader(d.data_dir, split, batch_size=d.batch_size, seq_len=d.seq_len,
                           rank=runtime.rank, world_size=runtime.world_size, seed=cfg.train.seed,
                           shuffle=shuffle, device=runtime.device,
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
    """The model, not yet sharded: built on the meta device, so no rank holds a copy on
    the host. Fresh weights come later, on the device and after sharding
    (parallel.materialize); the checkpoint's or GPT-2's are loaded here, on the device."""
    with torch.device("meta"):
        model = GPT(cfg.model)
    if ckpt is not None:
        state = model_weights(ckpt, "checkpoint", warn=False)[1]  # open() read it, and said so
    elif cfg.train.init_from:
        state = weights.load_pretrained(
            cfg.train.init_from, vocab_size=cfg.model.vocab_size, block_size=cfg.model.block_size,
            dropout=cfg.model.dropout).state_dict()
        if runtime.is_master:
            print(f"initialised from {cfg.train.init_from}{weights.init_from_note(cfg.model)}")
    else:
        return model
    model.to_empty(device=runtime.device)
    model.load_state_dict(state)
    return model


def build_run(plan: Plan, runtime: Runtime) -> Run:
    """The run's parts, from the preflight's plan (gpt/plan/preflight.py), in this rank's
    runtime."""
    cfg, t, e = plan.cfg, plan.cfg.train, plan.cfg.eval
    if runtime.is_master and (note := old_torch_note()):
        print(note)
    autocast_dtype = plan.dtype
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
        # Before the model: the tasks and their data, loaded once (the preflight knew the
        # names); a task whose data cannot load is a warning and the run goes on.
        tasks = TrainingTasks(e, runtime, t.parallel == "fsdp") if e.eval_tasks_every else None
        model = build_model(cfg, ckpt, runtime)
        par = parallel.parallelize(model, t, cfg.optim, runtime, autocast_dtype)
        run = Run(cfg=cfg, runtime=runtime, out_dir=checkpointer.out_dir, model=model, par=par,
                  autocast_dtype=autocast_dtype, accum=plan.accum, train_loader=train_loader,
                  val_loader=val_loader, checkpointer=checkpointer,
                  tokenizer=gpt2_tokenizer() if samples else None, hellaswag_examples=examples,
                  tasks=tasks)
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
    run.tally = Tally(start_step=start)
    timer = StepTimer(rt)
    with open_log(run), StopSignal(rt) as stop, Profiler(cfg.profile, rt, start) as profiler:
        run.curves = RunCurves.start(run.out_dir, rt.is_master)
        timer.reset()
        while True:
            at_end = s.step >= end
            set_attention_step(run.model, s.step, cfg.train.max_steps)  # a growing window
            with stop_at_bad_data(run):  # a val shard can fail too
                if periodic_work(run, at_end, first=s.step == start):
                    timer.reset()  # evaluation and checkpoint time is not training time
            if at_end:
                break

            step = s.step
            o = cfg.optim
            lr = lr_at(step, o.max_lr, o.min_lr_ratio, o.warmup_steps, cfg.train.max_steps,
                       o.lr_schedule, o.cooldown_frac)
            momentum = (muon.momentum_at(step, o.muon_momentum, o.muon_momentum_warmup)
                        if o.optimizer == "muon" else None)
            with profiler.step(step), stop_at_bad_data(run):
                loss, norm = forward_backward(run.par.train_model, run.par.scaler, run.par.optimizer,
                                              run.train_loader, run.accum, cfg.optim.grad_clip,
                                              rt.device_type, run.autocast_dtype, cfg.profile.nvtx)
                # Skipped on the device if the gradient is not finite (counted, read later).
                run.skips.add(optimizer_step(run.par.optimizer, run.par.scaler, lr, norm,
                                             cfg.profile.nvtx, momentum))
            s.step += 1
            timer.steps += 1

            # The only waits on the device: log steps, and the finiteness check when due.
            check = s.step % cfg.train.finite_check_every == 0
            if step % cfg.train.log_every == 0 or s.step == end:
                steps, sec = timer.steps, timer.lap()
                run.tally.steps_timed(steps, sec)
                last_loss = log_step(run, step, loss, norm, lr, sec, check)
            elif check:
                check_finite(run, step)
            if stop.agreed():  # every rank stops at the same step
                stopped_by = stop.signum or signal.SIGTERM
                name = signal.Signals(stopped_by).name
                path = save_checkpoint(run, reason=name)
                run.say(f"{name} received: " + (
                    f"saved checkpoint {path} at step {s.step}" if path else
                    f"stopped at step {s.step} without a checkpoint; "
                    f"{no_checkpoint_note(run)}") + "; continue with --resume auto")
                break
        finish(run, stopped_by)
    return outcome(run, last_loss, stopped_by)


def already_done(run: Run) -> bool:
    """A resumed run at or past its last step says so, and leaves its record as it is."""
    if run.state.step < run.end_step:
        return False
    which = "--stop-at-step" if run.end_step < run.cfg.train.max_steps else "--max-steps"
    run.say(f"nothing to do: the run is already at step {run.state.step} and {which} is "
            f"{run.end_step}; raise {which} to train further")
    return True


def finish(run: Run, stopped_by: int | None) -> None:
    """The end of a run that trained: its curves drawn a last time, then the summary and
    the commands that go on from it (gpt/train/run_summary.py), printed and recorded."""
    why = (signal.Signals(stopped_by).name if stopped_by is not None else
           f"--stop-at-step {run.end_step}" if run.end_step < run.cfg.train.max_steps else None)
    lines, record = summarize(run.tally, Ending(
        cfg=run.cfg, state=run.state, stopped_by=why, checkpoint=run.checkpointer.last_saved,
        out_dir=run.out_dir, curves=run.curves.at_end() if run.curves else None,
        val=run.val_loader is not None, hellaswag=bool(run.hellaswag_examples),
        distributed=run.runtime.distributed))
    for line in lines:
        run.say(line)
    run.log.write(record)


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
        (run.tasks is not None and due(e.eval_tasks_every), lambda r: r.tasks.score(r, s.step)),
        (run.cfg.checkpoint.save_checkpoints and not first
         and (at_end or due(run.cfg.checkpoint.checkpoint_every)), save_checkpoint),
        (run.tokenizer is not None and not first and due(e.sample_every), log_samples),
    ]
    for wanted, job in jobs:
        if wanted:
            with fp8.high_precision(run.model):  # evaluation as any reader of the weights
                job(run)
    if jobs[0][0] and not at_end and run.curves is not None:  # the end draws its own
        run.curves.after_validation()  # after HellaSwag and the tasks, to show them too
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
                 f"no checkpoint saved ({no_checkpoint_note(run)})")
        raise DataError(f"{e}; {saved}: restore the data, then --resume auto") from None


def log_step(run: Run, step: int, loss: torch.Tensor, norm: torch.Tensor, lr: float,
             sec: float, check_weights: bool) -> float:
    """The step's line and metrics record, the skipped steps since the last one, and (when
    due) the check that the weights and optimizer state are finite; returns the loss
    (mean over ranks)."""
    rt, flops_tok = run.runtime, flops_per_token(run.cfg.model, run.cfg.data.seq_len)
    # One collective (every rank joins, only on log steps) and one read-back for the loss,
    # the count of non-finite weight and state tensors, the (already global) norm and the
    # skip counts (the same on every rank: the norm that decides them is global).
    bad = (nonfinite_tensors(run.model, run.par.optimizer) if check_weights
           else torch.zeros((), device=loss.device))
    reduced = all_reduce_mean(torch.stack([loss.float(), bad.to(loss.device)]), rt)
    values = torch.cat([reduced, norm.float().reshape(1).to(loss.device),
                        run.skips.counts(loss.device)]).tolist()
    mean_loss, bad_mean, grad_norm = values[:3]
    account_skips(run, step, values[3:])
    if bad_mean > 0:
        raise diverged_weights(run, step)
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


def check_finite(run: Run, step: int) -> None:
    """The finiteness check of the weights and optimizer state on a step that is not a
    log step (one collective and one read)."""
    bad = all_reduce_mean(nonfinite_tensors(run.model, run.par.optimizer), run.runtime)
    if bad.item() > 0:
        raise diverged_weights(run, step)


def diverged_weights(run: Run, step: int) -> TrainingDiverged:
    return TrainingDiverged(
        f"the weights or optimizer state hold NaN, inf or values beyond 1e19 after step "
        f"{step}, though the gradient was finite (the update itself overflowed: lower "
        f"--max-lr); {run.checkpointer.last_good()}; then --resume auto")


def account_skips(run: Run, step: int, counts: list[float]) -> None:
    """Bring the loop's count of skipped steps up to date from the device's (read at
    `step`): record and say how many were skipped since the last read, and stop once
    --max-bad-steps came in a row."""
    since, streak, longest = (int(c) for c in counts)
    s = run.state
    s.bad_in_row = streak
    run.skips.reset()
    if since == 0:
        return
    s.skipped += since
    what = ("step skipped" if since == 1 and streak > 0 else
            f"{since} step(s) skipped since the last log line")
    run.say(f"step {step:6d} | non-finite loss or gradient: {what} ({streak} in a row now, "
            f"{s.skipped} in all)")
    run.log.write({"type": "skipped", "step": step, "count": since, "in_a_row": streak,
                   "total": s.skipped})
    if longest >= run.cfg.train.max_bad_steps:
        raise TrainingDiverged(
            f"{longest} steps in a row had a non-finite loss or gradient (by step {step}); "
            f"stopping. {run.checkpointer.last_good()}. Lower --max-lr or check the data, "
            f"then --resume auto")


def validate(run: Run) -> None:
    # Every rank scores its own disjoint slice; the mean is over all of them.
    rt, s = run.runtime, run.state
    s.last_val, per_token = all_reduce_mean(
        val_loss(run.par.eval_model, run.val_loader, run.cfg.eval.val_steps, rt.device_type,
                 run.autocast_dtype, bpb.token_bytes(run.cfg.model.vocab_size, rt.device)),
        rt).tolist()
    bits = bpb.bits_per_byte(s.last_val, per_token)
    run.tally.validated(s.step, s.last_val)
    run.say(f"step {s.step:6d} | val loss {s.last_val:.4f} | {bits:.4f} bits/byte")
    run.log.write({"type": "val", "step": s.step, "val_loss": s.last_val, "val_bpb": bits})


def score_hellaswag(run: Run) -> None:
    rt = run.runtime
    # GPT-2's ids only: a padded vocabulary's extra rows are masked out.
    hs = hellaswag.evaluate(run.par.eval_model, run.hellaswag_examples, rt.device,
                            run.autocast_dtype, rt.rank, rt.world_size, valid_vocab=GPT2_VOCAB)
    run.say(f"step {run.state.step:6d} | hellaswag acc_norm {hs['acc_norm']:.4f} "
            f"(acc {hs['acc']:.4f}, {hs['total']} examples)")
    run.log.write({"type": "hellaswag", "step": run.state.step, **hs})


def save_checkpoint(run: Run, reason: str | None = None) -> Path | None:
    """Write a checkpoint (a collective) and record it, with why if not periodic. None
    under --no-save-checkpoints, and during a streak of skipped steps: weights whose loss
    is not finite are no place to go back to (every rank knows the streak: the norm that
    starts it is global)."""
    s = run.state
    if not run.cfg.checkpoint.save_checkpoints:
        return None
    if s.step > 0:  # the skips of the steps since the last log line (one read)
        account_skips(run, s.step - 1, run.skips.counts(run.runtime.device).tolist())
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


def no_checkpoint_note(run: Run) -> str:
    """Where to go back to when nothing was saved now, for a message."""
    if not run.cfg.checkpoint.save_checkpoints:
        return "--no-save-checkpoints is set, so nothing is saved"
    return run.checkpointer.last_good()


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


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured (one process, or one rank under torchrun)."""
    if cfg.eval.eval_tasks:
        # datasets' progress bars would fill the training log at each scoring; it reads
        # this as the preflight first imports it (lm-eval's own: harness_tasks.run_tasks)
        harness_tasks.quiet_progress()
    # Every check before the ranks meet, as the dry run makes them: a refusal is one
    # line, not a rendezvous that waits for --dist-timeout
    plan = preflight(cfg).settled()
    cfg = plan.cfg  # settled: --init-from's shape, the automatic layout's values
    if plan.runtime.is_master:
        if plan.layout is not None:
            print(plan.layout.line(), flush=True)
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    runtime = init_runtime(cfg.train.device, cfg.train.dist_timeout)
    if runtime.device_type == "cpu" and cfg.train.cpu_malloc_reuse:
        reuse_freed_memory()
    clean = False
    try:
        result = build_and_run(plan, runtime)
        clean = True
        return result
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            lost = peer_lost(e, runtime)  # one line: the rank that stopped says why
            if lost is None:
                raise
            raise lost from None
        d = cfg.data
        raise OutOfMemory(
            f"out of memory on {runtime.device} at --batch-size {d.batch_size} x --seq-len "
            f"{d.seq_len}: lower --batch-size (gradient accumulation keeps each step at "
            f"--total-batch-tokens {d.total_batch_tokens}), or add --activation-checkpointing "
            f"(or let the planner fit both: --batch-size auto --activation-checkpointing auto);"
            f" `python -m gpt.bench memory <these flags> --world-size {runtime.world_size} "
            f"--largest-batch` predicts the peak and the largest batch that fits"
            f" ({' '.join(str(e).split())[:200]})") from None
    finally:
        shutdown(runtime, clean)


def build_and_run(plan: Plan, runtime: Runtime) -> dict[str, Any]:
    """The run lives in this frame alone, so it is gone by the time the process group is
    torn down (see dist.shutdown)."""
    run = build_run(plan, runtime)
    # what --parallel/--activation-checkpointing/--batch-size auto settled on, for the
    # metrics header
    run.layout_choice = plan.layout.to_json() if plan.layout is not None else None
    try:
        return run_loop(run)
    finally:
        close_trackers(run.trackers)
        run.checkpointer.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the flags (a bad one exits with status 2 and a message naming it), then run
    (or, with --dry-run, say what the run would do)."""
    cfg, dry_run = parse_command(argv)
    if dry_run:
        from gpt.plan.dry_run import main as dry_main
        return dry_main(cfg)
    return main_with(cfg)


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
