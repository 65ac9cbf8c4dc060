"""What a log step reads back and says: the loss over the ranks, the gradient norm, the
steps skipped for a non-finite gradient since the last read, and the finiteness check of
the weights and optimizer state (the run stops on either, naming the checkpoint to go
back to)."""

from __future__ import annotations

import torch

from gpt.engine.step import TrainingDiverged, nonfinite_tensors
from gpt.report.flops import flops_per_token, mfu, peak_memory
from gpt.runtime.world import all_reduce_mean
from gpt.train.run import Records, Run
from gpt.train.run_record import run_peak


def log_step(run: Run, rec: Records, step: int, loss: torch.Tensor, norm: torch.Tensor, lr: float,
             sec: float, check_weights: bool, fields: dict[str, float] | None = None) -> float:
    """The step's line and metrics record (with the optimizer's `fields`: its
    log_fields), the skipped steps since the last one, and (when due) the check that the
    weights and optimizer state are finite; returns the loss (mean over ranks)."""
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
    account_skips(run, rec, step, values[3:])
    if bad_mean > 0:
        raise diverged_weights(run, step)
    tok_s = run.cfg.data.total_batch_tokens / sec
    util = mfu(tok_s / rt.world_size, flops_tok, run_peak(run))  # per-device MFU
    mem_gb = peak_memory(rt.device)[0] / 2**30  # this rank's; the header says what it measures
    progress = rec.progress.update(step, sec)
    run.say(f"step {step:6d} | loss {mean_loss:.6f} | lr {lr:.4e} | norm {grad_norm:.4f} | "
            f"{sec * 1000:.1f} ms | {tok_s:,.0f} tok/s"
            + (f" | MFU {util * 100:.1f}%" if util is not None else "")
            + f" | mem {mem_gb:.2f} GiB | {progress.line()}")
    rec.log.write({"type": "train", "step": step, "loss": mean_loss, "lr": lr,
                   "grad_norm": grad_norm, "ms": sec * 1000, "tokens_per_s": tok_s, "mfu": util,
                   "peak_mem_gb": mem_gb, **progress.record(), **(fields or {})})
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


def account_skips(run: Run, rec: Records, step: int, counts: list[float]) -> None:
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
    rec.log.write({"type": "skipped", "step": step, "count": since, "in_a_row": streak,
                   "total": s.skipped})
    if longest >= run.cfg.train.max_bad_steps:
        raise TrainingDiverged(
            f"{longest} steps in a row had a non-finite loss or gradient (by step {step}); "
            f"stopping. {run.checkpointer.last_good()}. Lower --max-lr or check the data, "
            f"then --resume auto")
