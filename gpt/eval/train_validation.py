"""The trainer's --val-every: the validation loss (gpt/eval/validation.py's val_loss) over
the first --val-steps batches of the val_* shards, every rank its own slice, the mean
over all, one of gpt/eval/evaluations.py's: the run's loss, which its best checkpoint and
its summary go by. Torch is imported where it scores (the curves' command reads this row
without it)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpt.core.config import Config, EvalConfig
from gpt.eval.evaluation import Evaluation, Result, Scoring

if TYPE_CHECKING:
    from gpt.data.loader import ShardLoader
    from gpt.runtime.world import Runtime


@dataclass(frozen=True)
class Loaded:
    """What validation holds through a run: its loader and what it scores."""

    loader: ShardLoader
    steps: int  # --val-steps
    vocab_size: int
    world_size: int

    @property
    def batches(self) -> int:
        """The batches a validation scores, all ranks together."""
        return min(self.steps, self.loader.steps_per_pass) * self.world_size


class Validation(Evaluation):
    name = "val"
    loss = "val_loss"

    def every(self, e: EvalConfig) -> int:
        return e.val_every

    def load(self, cfg: Config, runtime: Runtime) -> Loaded | None:
        """The val loader, where the data folder has val_* shards (the preflight read
        their headers); else a note, and no validation."""
        from gpt.data.loader import ShardLoader
        from gpt.data.shards import DataError, find_shards

        d = cfg.data
        try:
            find_shards(d.data_dir, "val")
        except DataError:
            if runtime.is_master:
                print(f"note: {d.data_dir} has no val_* shards; validation is off")
            return None
        # --check-tokens scanned every shard in the preflight (gpt/plan/preflight.py); each
        # batch is still checked as it is read (max_token)
        loader = ShardLoader(d.data_dir, "val", batch_size=d.batch_size, seq_len=d.seq_len,
                             rank=runtime.rank, world_size=runtime.world_size,
                             seed=cfg.train.seed, shuffle=False, device=runtime.device,
                             max_token=cfg.model.vocab_size - 1)
        return Loaded(loader, cfg.eval.val_steps, cfg.model.vocab_size, runtime.world_size)

    def score(self, loaded: Loaded, at: Scoring) -> Result:
        from gpt.eval import bpb
        from gpt.eval.validation import val_loss
        from gpt.runtime.world import all_reduce_mean

        rt = at.runtime
        loss, per_token = all_reduce_mean(
            val_loss(at.eval_model, loaded.loader, loaded.steps, rt.device_type,
                     at.autocast_dtype, bpb.token_bytes(loaded.vocab_size, rt.device)),
            rt).tolist()
        bits = bpb.bits_per_byte(loss, per_token)
        return Result({"type": self.name, "step": at.step, "val_loss": loss, "val_bpb": bits},
                      (f"val loss {loss:.4f} | {bits:.4f} bits/byte",))

    def evaluate_flags(self, cfg: Config, loaded: Loaded | None, compiled: bool) -> list[str]:
        """gpt.evaluate's flags that score the tokens the run's validation scored, as it
        did: its batches (all ranks' together: the ranks' windows, read in order by one
        process, are the same tokens), their size, and the device, precision and
        compilation where the run chose them. gpt.evaluate's defaults (20 batches of 8 x
        the block size) are left out."""
        if loaded is None:
            return []
        d, t = cfg.data, cfg.train
        flags = [f"--data-dir {shlex.quote(d.data_dir)}"]
        if loaded.batches:
            flags.append(f"--val-steps {loaded.batches}")
        if d.batch_size != 8:
            flags.append(f"--batch-size {d.batch_size}")
        if d.seq_len != cfg.model.block_size:
            flags.append(f"--seq-len {d.seq_len}")
        flags += [f"--{name} {value}" for name, value in (("device", t.device), ("dtype", t.dtype))
                  if value != "auto"]
        if compiled:
            flags.append("--compile")
        return flags


VALIDATION = Validation()
