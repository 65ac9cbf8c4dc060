"""The training loop, as the algorithm reads: at each step, the periodic work that is due
(the evaluations, a checkpoint, samples), then the learning rate, one
optimizer step over the micro-batches (gpt/engine/step.py), a log line when due, and a
stop when every rank agrees to one. How a run is built is gpt/train/build.py's; the
run from start to end, gpt/train/trainer.py's."""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

from gpt.data.shards import DataError
from gpt.engine.step import forward_backward, optimizer_step
from gpt.eval import evaluations
from gpt.model import fp8
from gpt.model.attention_mask import set_attention_step
from gpt.optim.schedule import Schedule
from gpt.plan.speed import compare_steps
from gpt.report.metrics import Progress, StepTimer
from gpt.report.profiling import Profiler
from gpt.runtime.machine_load import SlowdownWatch, read_load
from gpt.train.periodic import evaluate, log_samples, no_checkpoint_note, save_checkpoint
from gpt.train.run import Records, Run
from gpt.train.run_curves import RunCurves
from gpt.train.run_record import open_log
from gpt.train.run_summary import Ending, Tally, summarize
from gpt.train.signals import StopSignal
from gpt.train.step_log import check_finite, log_step


def run_loop(run: Run) -> dict[str, Any]:
    """Train from the run's step to its end (or a stop signal); what it came to."""
    cfg, rt, s = run.cfg, run.runtime, run.state
    end = run.end_step
    start, stopped_by, last_loss = s.step, None, None
    if already_done(run):
        return outcome(run)
    timer = StepTimer(rt)
    schedule = Schedule(cfg.optim, cfg.train.max_steps)
    slowdown = SlowdownWatch() if rt.device_type == "cpu" and rt.is_master else None
    estimated = run.expected_step_s  # held against the first steps after the first, once
    with open_log(run) as log, StopSignal(rt) as stop, \
            Profiler(cfg.profile, rt, start) as profiler:
        rec = Records(log, Progress(cfg.data.total_batch_tokens, cfg.train.max_steps),
                      Tally(start_step=start), RunCurves.start(run.out_dir, rt.is_master))
        timer.reset()
        while True:
            at_end = s.step >= end
            set_attention_step(run.model, s.step, cfg.train.max_steps)  # a growing window
            with stop_at_bad_data(run, rec):  # a val shard can fail too
                if periodic_work(run, rec, at_end, first=s.step == start):
                    timer.reset()  # evaluation and checkpoint time is not training time
            if at_end:
                break

            step = s.step
            lr = schedule.lr(step)
            with profiler.step(step), stop_at_bad_data(run, rec):
                loss, norm = forward_backward(run.par.train_model, run.par.scaler, run.par.optimizer,
                                              run.train_loader, run.accum, cfg.optim.grad_clip,
                                              rt.device_type, run.autocast_dtype, cfg.profile.nvtx)
                # Skipped on the device if the gradient is not finite (counted, read later).
                run.skips.add(optimizer_step(run.par.optimizer, run.par.scaler, lr, norm,
                                             cfg.profile.nvtx, schedule.settings(step)))
            s.step += 1
            timer.steps += 1

            # The only waits on the device: log steps, and the finiteness check when due.
            check = s.step % cfg.train.finite_check_every == 0
            if step % cfg.train.log_every == 0 or s.step == end:
                steps, sec = timer.steps, timer.lap()
                rec.tally.steps_timed(steps, sec)
                last_loss = log_step(run, rec, step, loss, norm, lr, sec, check,
                                     schedule.log_fields(step))
                if slowdown is not None and (note := slowdown.observe(sec, read_load)):
                    run.say(f"note: {note}")  # once: the machine has become busy
                if estimated is not None and step > start:  # the first step warms up
                    if note := compare_steps(estimated, sec, end - s.step):
                        run.say(f"note: {note}")
                    estimated = None
            elif check:
                check_finite(run, step)
            if stop.agreed():  # every rank stops at the same step
                stopped_by = stop_on_signal(run, rec, stop.signum or signal.SIGTERM)
                break
        finish(run, rec, stopped_by)
    return outcome(run, last_loss, stopped_by)


def stop_on_signal(run: Run, rec: Records, signum: int) -> int:
    """A stop signal every rank agreed on: a checkpoint, and how to continue from it."""
    name, step = signal.Signals(signum).name, run.state.step
    path = save_checkpoint(run, rec, reason=name)
    run.say(f"{name} received: " + (
        f"saved checkpoint {path} at step {step}" if path else
        f"stopped at step {step} without a checkpoint; {no_checkpoint_note(run)}")
        + "; continue with --resume auto")
    return signum


def already_done(run: Run) -> bool:
    """A resumed run at or past its last step says so, and leaves its record as it is;
    one at its last step whose end-of-run work was not done (a signal came as the last
    step finished) does that work now."""
    s = run.state
    if s.step < run.end_step:
        return False
    if s.step == run.end_step and s.ended_at != s.step:
        run.say(f"step {s.step} is the run's last and its end-of-run work was not done "
                f"(it was stopped as the step finished): doing it now")
        return False
    which = "--stop-at-step" if run.end_step < run.cfg.train.max_steps else "--max-steps"
    run.say(f"nothing to do: the run is already at step {run.state.step} and {which} is "
            f"{run.end_step}; raise {which} to train further")
    return True


def finish(run: Run, rec: Records, stopped_by: int | None) -> None:
    """The end of a run that trained: its curves drawn a last time, then the summary and
    the commands that go on from it (gpt/train/run_summary.py), printed and recorded."""
    why = (signal.Signals(stopped_by).name if stopped_by is not None else
           f"--stop-at-step {run.end_step}" if run.end_step < run.cfg.train.max_steps else None)
    curves = rec.curves.at_end()
    rec.tally.drawing_seconds = rec.curves.seconds  # not training time
    scores = [part for ev, _ in run.evaluations if ev.name in rec.tally.last
              and (part := ev.summary(rec.tally.last[ev.name])) is not None]
    lines, record = summarize(rec.tally, Ending(
        cfg=run.cfg, state=run.state, stopped_by=why, checkpoint=run.checkpointer.last_saved,
        out_dir=run.out_dir, curves=curves, distributed=run.runtime.distributed,
        evaluate=evaluations.evaluate_flags(run.cfg, run.evaluations, bool(run.par.compiled)),
        scores=scores))
    for line in lines:
        run.say(line)
    rec.log.write(record)


def outcome(run: Run, loss: float | None = None, stopped_by: int | None = None) -> dict[str, Any]:
    s = run.state
    return {"loss": loss, "val_loss": s.last_val, "checkpoint": run.checkpointer.last_saved,
            "steps": s.step, "skipped": s.skipped, "stopped_by": stopped_by}


def periodic_work(run: Run, rec: Records, at_end: bool, first: bool) -> bool:
    """The evaluations, a checkpoint and samples, each when its interval (or the end)
    comes; the last two not on the step a run starts at. Returns whether any ran."""
    s, e = run.state, run.cfg.eval

    def due(every: int) -> bool:
        return every > 0 and (s.step % every == 0 or at_end)

    if at_end:  # recorded by the checkpoint below, written after the evaluations
        s.ended_at = s.step
    # A run resumed at its last step starts there: its end's checkpoint and samples too.
    later = not first or at_end
    jobs = [(due(ev.every(e)), lambda ev=ev, held=held: evaluate(run, rec, ev, held))
            for ev, held in run.evaluations]
    evaluated = any(wanted for wanted, _ in jobs)
    jobs += [
        (run.cfg.checkpoint.save_checkpoints and later
         and (at_end or due(run.cfg.checkpoint.checkpoint_every)),
         lambda: save_checkpoint(run, rec)),
        (run.tokenizer is not None and later and due(e.sample_every),
         lambda: log_samples(run, rec)),
    ]
    for wanted, job in jobs:
        if wanted:
            with fp8.high_precision(run.model):  # evaluation as any reader of the weights
                job()
    if evaluated and not at_end:  # the end draws its own
        rec.curves.after_evaluations()  # after all of them, to show them all
    return any(wanted for wanted, _ in jobs)


@contextlib.contextmanager
def stop_at_bad_data(run: Run, rec: Records) -> Iterator[None]:
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
        path = save_checkpoint(run, rec, reason="data error")
        saved = (f"saved {path} at step {run.state.step}" if path else
                 f"no checkpoint saved ({no_checkpoint_note(run)})")
        raise DataError(f"{e}; {saved}: restore the data, then --resume auto") from None

