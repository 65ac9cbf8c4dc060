"""Building a run: its loader, what its evaluations load, its model (fresh on the meta device, or a checkpoint's or
GPT-2's weights), spread over the ranks, the run folder taken, a checkpoint restored;
each part from its own section of the settled plan's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpt.checkpoint import weights
from gpt.checkpoint.checkpointer import Checkpointer, LoopState, Parts
from gpt.checkpoint.files import model_weights
from gpt.core.compat import old_torch_note
from gpt.core.config import DataConfig, ModelConfig
from gpt.core.config_io import to_dict
from gpt.core.rng import seed_everything
from gpt.data.loader import ShardLoader
from gpt.data.tokenizer import gpt2_tokenizer
from gpt.engine import parallel
from gpt.eval import evaluations as gpt_evaluations
from gpt.model.transformer import GPT
from gpt.plan.preflight import Plan
from gpt.report.trackers import open_trackers
from gpt.runtime.world import Runtime, set_matmul_precision
from gpt.train.run import Run


def build_loader(d: DataConfig, runtime: Runtime, *, seed: int, vocab_size: int) -> ShardLoader:
    """The train loader: batches of token ids below `vocab_size`; `seed` orders shuffled
    shards. (The val loader is validation's: gpt/eval/validation.py.)"""
    # --check-tokens scanned every shard in the preflight (gpt/plan/preflight.py), as the
    # dry run does; each batch is still checked as it is read (max_token)
    return ShardLoader(d.data_dir, "train", batch_size=d.batch_size, seq_len=d.seq_len,
                       rank=runtime.rank, world_size=runtime.world_size, seed=seed,
                       shuffle=d.shuffle, device=runtime.device, max_token=vocab_size - 1)


def build_model(m: ModelConfig, runtime: Runtime, ckpt: dict[str, Any] | None = None,
                init_from: str | None = None) -> GPT:
    """The model, not yet sharded: built on the meta device, so no rank holds a copy on
    the host. Fresh weights come later, on the device and after sharding
    (parallel.materialize); a checkpoint's or GPT-2's (--init-from) are loaded here, on
    the device."""
    with torch.device("meta"):
        model = GPT(m)
    if ckpt is not None:
        state = model_weights(ckpt, "checkpoint", warn=False)[1]  # open() read it, and said so
    elif init_from:
        state = weights.load_pretrained(init_from, vocab_size=m.vocab_size,
                                        block_size=m.block_size, dropout=m.dropout).state_dict()
        if runtime.is_master:
            print(f"initialised from {init_from}{weights.init_from_note(m)}")
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
    # bad data stops before any file is written
    train_loader = build_loader(cfg.data, runtime, seed=t.seed, vocab_size=cfg.model.vocab_size)
    # Before the model: what each evaluation needs (the val loader, examples, the tasks
    # and their data), loaded once (the preflight checked what it could); one that finds
    # nothing to load says so and the run goes on without it.
    evaluations = gpt_evaluations.load(cfg, runtime)
    checkpointer = Checkpointer(Path(t.out_dir), cfg.checkpoint, runtime)
    resume_path, ckpt = checkpointer.open(cfg)  # the run folder is this run's from here on
    try:
        samples = e.sample_every > 0 and parallel.samples_on_this_rank(t.parallel, runtime)
        model = build_model(cfg.model, runtime, ckpt, t.init_from)
        par = parallel.parallelize(model, t, cfg.optim, runtime, autocast_dtype)
        state = LoopState()
        if ckpt is not None:
            checkpointer.restore(Parts(model, par.optimizer, par.scaler, train_loader, state, cfg),
                                 ckpt)
            if runtime.is_master:
                print(f"resumed from {resume_path} at step {state.step}", flush=True)
        # last: W&B can fail to start (no login)
        trackers = (open_trackers(t.tensorboard, t.wandb_project, checkpointer.out_dir,
                                  to_dict(cfg)) if runtime.is_master else [])
    except BaseException:
        checkpointer.close(failed_at_start=True)
        raise
    return Run(cfg=cfg, runtime=runtime, out_dir=checkpointer.out_dir, model=model, par=par,
               autocast_dtype=autocast_dtype, accum=plan.accum, train_loader=train_loader,
               checkpointer=checkpointer, tokenizer=gpt2_tokenizer() if samples else None,
               evaluations=evaluations, state=state, trackers=trackers,
               # what --parallel/--activation-checkpointing/--batch-size auto settled on, for
               # the metrics header
               layout_choice=plan.layout.to_json() if plan.layout is not None else None,
               expected_step_s=plan.step_s)  # the loop holds its first steps against it
