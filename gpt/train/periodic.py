"""The loop's periodic work, each job when its interval comes: the evaluations (the list
in gpt/eval/evaluations.py), a checkpoint, samples. The loop decides when
(gpt/train/loop.py's periodic_work); each job here reads its own section of the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpt.eval.evaluation import Evaluation, Scoring
from gpt.eval.sampling import prompt_ids, sample
from gpt.train.run import Records, Run
from gpt.train.step_log import account_skips


def evaluate(run: Run, rec: Records, ev: Evaluation, loaded: Any) -> None:
    """One evaluation at the run's step: scored (on every rank, or on rank 0 where it
    says so), said and logged; the run's validation loss taken from the one that has it."""
    rt, s = run.runtime, run.state
    if not (ev.every_rank or rt.is_master):
        return
    result = ev.score(loaded, Scoring(run.model, run.par.eval_model, rt, run.autocast_dtype,
                                      s.step))
    if result is None:
        return
    if ev.loss is not None:
        s.last_val = result.record[ev.loss]
        rec.tally.validated(s.step, s.last_val)
    rec.tally.scored(ev.name, result.record)
    for line in result.lines:
        run.say(f"step {s.step:6d} | {line}")
    rec.log.write(result.record)


def save_checkpoint(run: Run, rec: Records, reason: str | None = None) -> Path | None:
    """Write a checkpoint (a collective) and record it, with why if not periodic. None
    under --no-save-checkpoints, and during a streak of skipped steps: weights whose loss
    is not finite are no place to go back to (every rank knows the streak: the norm that
    starts it is global)."""
    s = run.state
    if not run.cfg.checkpoint.save_checkpoints:
        return None
    if s.step > 0:  # the skips of the steps since the last log line (one read)
        account_skips(run, rec, s.step - 1, run.skips.counts(run.runtime.device).tolist())
    if s.bad_in_row:
        run.say(f"step {s.step:6d} | no checkpoint: the last {s.bad_in_row} step(s) had a "
                f"non-finite loss or gradient")
        rec.log.write({"type": "checkpoint", "step": s.step, "path": None,
                       "reason": f"not saved: {s.bad_in_row} skipped step(s) in a row"})
        return None
    path = run.checkpointer.save(run.parts())
    record = {"type": "checkpoint", "step": run.state.step, "path": str(path)}
    rec.log.write(record if reason is None else {**record, "reason": reason})
    if reason is None:
        run.say(f"saved checkpoint {path}")
    return path


def no_checkpoint_note(run: Run) -> str:
    """Where to go back to when nothing was saved now, for a message."""
    if not run.cfg.checkpoint.save_checkpoints:
        return "--no-save-checkpoints is set, so nothing is saved"
    return run.checkpointer.last_good()


def log_samples(run: Run, rec: Records) -> None:
    e, tok = run.cfg.eval, run.tokenizer
    gen = torch.Generator().manual_seed(run.cfg.train.seed + run.state.step)
    prompt = prompt_ids(tok, e.sample_prompt, run.cfg.model.vocab_size, "--sample-prompt")
    ids = sample(run.model, prompt, max_new_tokens=e.sample_tokens,
                 num_samples=e.num_samples, top_k=50, valid_vocab=tok.n_vocab, generator=gen,
                 autocast_dtype=run.autocast_dtype)
    texts = [e.sample_prompt + tok.decode(row.tolist()[len(prompt):]) for row in ids]
    for i, text in enumerate(texts):
        run.say(f"--- sample {i} at step {run.state.step}:\n{text}")
    rec.log.write({"type": "sample", "step": run.state.step, "samples": texts})
