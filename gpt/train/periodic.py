"""The loop's periodic work, each job when its interval comes: validation, HellaSwag,
a checkpoint, samples. The loop decides when (gpt/train/loop.py's periodic_work); each
job here reads its own section of the config."""

from __future__ import annotations

from pathlib import Path

import torch

from gpt.core.text import one_line
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.eval import bpb, hellaswag
from gpt.eval.sampling import prompt_ids, sample
from gpt.eval.validation import val_loss
from gpt.runtime.world import all_reduce_mean
from gpt.train.run import Run
from gpt.train.step_log import account_skips


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
    name = getattr(run.hellaswag_examples, "name", hellaswag.VAL_NAME)
    named = "" if name == hellaswag.VAL_NAME else f" of {one_line(name, 200)}"  # a set of one's own
    run.say(f"step {run.state.step:6d} | hellaswag acc_norm {hs['acc_norm']:.4f} "
            f"(acc {hs['acc']:.4f}, {hs['total']} examples{named})")
    run.log.write({"type": "hellaswag", "step": run.state.step, "set": name, **hs})


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
    prompt = prompt_ids(tok, e.sample_prompt, run.cfg.model.vocab_size, "--sample-prompt")
    ids = sample(run.model, prompt, max_new_tokens=e.sample_tokens,
                 num_samples=e.num_samples, top_k=50, valid_vocab=tok.n_vocab, generator=gen,
                 autocast_dtype=run.autocast_dtype)
    texts = [e.sample_prompt + tok.decode(row.tolist()[len(prompt):]) for row in ids]
    for i, text in enumerate(texts):
        run.say(f"--- sample {i} at step {run.state.step}:\n{text}")
    run.log.write({"type": "sample", "step": run.state.step, "samples": texts})
