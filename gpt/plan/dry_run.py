"""`train_gpt2.py --dry-run`: what a command would do, checked without doing it.

The answer is the preflight's (gpt/plan/preflight.py), the very checks the run makes before
it builds anything, asked for a little more: the checkpoint to resume from read whole, as
the resume reads it, and the memory planner's peak per device (gpt.plan.memory) against the
device's memory. This module only prints that plan: the resolved config, the parameter
count, the device and precision, tokens per step and the accumulation, the data (shards,
tokens, how many steps one pass covers), fresh start or resume (and from which
checkpoint), what to expect (tokens, time and disk from where the run starts), the memory
plan, then every problem, one line each. So "the run would start" is a promise the run
keeps; a planned peak beyond the device's memory, or checkpoints beyond the free disk,
are problems too (the run would stop in its first step, or at its first checkpoint).

It builds no model on the device but a slice of it, timed for about a second
(gpt/plan/speed.py), starts no process group and writes nothing (the run folder's lock
is not taken). Under torchrun, rank 0 answers for the world (WORLD_SIZE
processes); the others exit.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from gpt.core.config import Config
from gpt.core.config_io import describe
from gpt.core.errors import UserError
from gpt.core.text import one_line
from gpt.core.units import human_count
from gpt.data.tokenizer import GPT2_VOCAB, gpt2_tokenizer
from gpt.model import fp8, loss_kernels, sizing
from gpt.plan import expected, memory
from gpt.plan.preflight import Plan, WillNotFit, preflight
from gpt.runtime.device import DTYPE_NAMES, device_name
from gpt.runtime.launch import launch_environment


GiB = 2**30


def main(cfg: Config) -> int:
    """Print the dry run's report; exit status 0 if the command would start, else the
    first problem's (every problem is printed, one line each)."""
    try:
        launch = launch_environment(os.environ)
    except UserError:
        launch = None  # the preflight names it, as the run would
    if launch is not None and launch.rank != 0:
        return 0  # under torchrun rank 0 answers for everyone
    print("dry run: nothing is started or written (a slice of the model is timed on the "
          "device, to say how long the run takes)", flush=True)
    if cfg.eval.sample_every:  # the run loads it for its samples: in the memory it holds
        gpt2_tokenizer()
    plan = preflight(cfg, verify_resume=True, plan_memory=True)
    report(plan)
    sys.stdout.flush()  # in order with what follows on stderr, when both go to one file
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for problem in plan.problems:
        print(f"error: {problem}", file=sys.stderr)
    if plan.problems:
        print(f"dry run: {len(plan.problems)} problem(s) above; the run would not start"
              + (" (or would run out of memory in its first step)"
                 if any(isinstance(p, WillNotFit) for p in plan.problems) else ""),
              file=sys.stderr)
        return plan.problems[0].exit_code
    print(verdict(plan))
    return 0


def verdict(plan: Plan) -> str:
    """The last line of a dry run whose run would start: what it would do, and for how
    long here."""
    rt = plan.runtime
    return expected.verdict(plan.cfg, rt.device, device_name(rt.device), rt.world_size,
                            plan.estimate, plan.start.step if plan.start else 0)


def memory_words(plan: Plan) -> str:
    """What the log's mem should read on a CPU (or MPS), where it is the process's peak
    resident memory: what this process held before the timing (Python, torch, this
    package, the tokenizer where the run samples: as the run's will), and the step's own,
    as the timed step grew this process where it was the whole run's (the CPU allocator's
    keep in it), else the plan's tensors."""
    kind, baseline = plan.runtime.device_type, plan.resident
    peak = plan.memory.peak_bytes
    if baseline is None:
        return (f"the log's mem on {kind} is the process's peak resident memory: this plan and "
                f"what torch and the process hold besides")
    grown = plan.estimate.step_memory if plan.estimate is not None else None
    step = (f"{grown / GiB:.2f} GiB the step timed here grew it by (the plan's "
            f"{peak / GiB:.3f} GiB of tensors, and what the CPU allocator keeps)"
            if grown is not None else
            f"the plan's {peak / GiB:.3f} GiB (the CPU allocator keeps some more)")
    return (f"the log's mem on {kind} (the process's peak resident memory) should read about "
            f"{(baseline + (grown if grown is not None else peak)) / GiB:.2f} GiB: "
            f"{baseline / GiB:.2f} GiB the process holds before it builds the model (torch, "
            f"this package, the tokenizer; measured here) and {step}; validation, samples, "
            f"the curves' drawing and the allocator's keep growing over the steps add some")


def report(plan: Plan) -> None:
    """The plan, as far as the preflight got, one section a line."""
    cfg, rt = plan.cfg, plan.runtime
    if plan.layout is not None:
        print(plan.layout.line())
    print(describe(cfg))
    print(f"params:     {params_words(cfg)}")
    if rt is not None:
        device = rt.device
        loss = loss_kernels.describe(cfg.train.chunked_loss_on(device.type),
                                     loss_kernels.resolve(cfg.train.loss_kernel, device.type))
        print(f"device:     {device} ({device_name(device)}) x {rt.world_size} process(es) | "
              f"parallel {cfg.train.parallel} | precision {DTYPE_NAMES.get(plan.dtype, '?')} | "
              f"compile {cfg.train.compile_on(device.type)} | loss {loss}"
              + (f" | fp8 {cfg.train.fp8}{' (emulated)' if fp8.emulated(device.type) else ''}"
                 if cfg.train.fp8 != "none" else ""))
    d = cfg.data
    if plan.accum is not None:
        print(f"batch:      {d.batch_size} x {d.seq_len} tokens per micro-batch x "
              f"{rt.world_size} process(es) x {plan.accum} accumulation step(s) = "
              f"{d.total_batch_tokens:,} tokens per step; {cfg.train.max_steps:,} steps = "
              f"{human_count(cfg.train.max_steps * d.total_batch_tokens)} tokens")
    if plan.accum is not None:  # tokens, time where measured, disk (gpt/plan/expected.py)
        print("\n".join(expected.lines(cfg, rt.device, device_name(rt.device), rt.world_size,
                                       plan.estimate, plan.start.step if plan.start else 0)))
    if plan.data is not None:
        facts = plan.data
        passes = cfg.train.max_steps * d.total_batch_tokens / max(facts.train_tokens, 1)
        print(f"data:       {one_line(d.data_dir, None)}: {facts.train_shards} train shard(s), "
              f"{facts.train_tokens:,} tokens; one pass is "
              f"{facts.train_tokens // d.total_batch_tokens:,} steps, the run {passes:.2f} "
              f"pass(es)")
        if facts.val_tokens is not None:
            print(f"            {facts.val_shards} val shard(s), {facts.val_tokens:,} tokens")
        elif cfg.eval.val_every:
            print(f"note:       {one_line(d.data_dir, None)} has no val_* shards; validation "
                  f"would be off")
    if plan.start is not None:
        start = plan.start
        # paths a config file gave are anyone's text: escaped, as every error line is
        print(f"start:      fresh, in {one_line(cfg.train.out_dir, None)}" if start.path is None
              else f"start:      would resume from {one_line(str(start.path), None)} at step "
                   f"{start.step:,}")
    if plan.memory is not None:
        print("\n".join("            " + line for line in plan.memory.table().splitlines()))
        if plan.capacity is not None and plan.memory.fits(plan.capacity):
            print(f"memory:     fits {rt.device} ({plan.capacity / GiB:.1f} GiB)"
                  + ("" if rt.device_type == "cuda" else
                     f": the plan counts the tensors of one training step; "
                     + memory_words(plan)))


def params_words(cfg: Config) -> str:
    """The parameter count, the model, and GPT-2's own count where the vocabulary is
    padded (the README's figures are GPT-2's)."""
    n = sizing.param_count(cfg.model)
    name = memory.model_name(cfg)
    out = f"{n:,} ({name}{' model' if name == cfg.preset else ''}"
    if cfg.model.vocab_size > GPT2_VOCAB:
        gpt2 = sizing.param_count(dataclasses.replace(cfg.model, vocab_size=GPT2_VOCAB))
        out += (f"; {gpt2:,} with GPT-2's {GPT2_VOCAB:,} tokens: the vocabulary is padded "
                f"to {cfg.model.vocab_size:,} for faster matmuls, +{n - gpt2:,}, its padded "
                f"ids never sampled")
    return out + ")"
