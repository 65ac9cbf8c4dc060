"""What the GPU acceptance (`python -m gpt.bench gpu`) runs: its stages by name, each
stage's cells (one process each: a trainer run, build-nanogpt, the CUDA tests, another
bench) and the sizes they run at, and what a stage needs from the user (build-nanogpt's
script, a corpus, an optional package). The plan that `--plan` prints for a choice of
stages is gpt/bench/gpu/plan.py's.

Every process compiles its own graphs (the trainer's command line cannot share a compiled
model across micro-batches), so the stages keep processes few, and a stage that compares
runs (the loss kernels, FP8, the recipes) runs its own baseline beside them, so that the
ratios are taken on one machine in one invocation. Estimates: gpt/bench/gpu/estimates.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.bench.gpu.catalog import STAGES  # the stages by name (their cells are here)
from gpt.bench.gpu.estimates import (MEASURED_STEPS, PLANNER_S, PROFILE_S, WARMUP, ladder_estimate,
                                     loss_bench_estimate, pytest_estimate, run_estimate,
                                     tokens_estimate)
from gpt.bench.record import REPO
from gpt.bench.runs import trainer_command

PYTEST_WORKERS = 4  # pytest-xdist workers for the CUDA tests, where pytest-xdist is installed
# The learning rate's warm-up of every trainer cell, and build-nanogpt's beside them (its own
# is 715 steps): the same rate at each step, so the two runs' losses compare step by step.
LR_WARMUP_STEPS = 10


@dataclass
class Cell:
    name: str
    kind: str  # pytest | trainer | nanogpt | ladder | tokens
    estimate_s: float  # on one H100, compilation included (estimates.py)
    cmd: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    # optional packages by import name (gpt/bench/gpu/inputs.py installs them from --wheels
    # where they are not importable): those it cannot run without (skipped where one cannot
    # be imported), and those it uses where they can be (the CUDA tests: theirs skip without)
    needs: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()


def same_command(cell: Cell) -> str:
    """What makes two stages' cells one measurement: the same kind of cell with the same
    parameters running the same command (the fp8 and throughput stages share their bf16
    cell, for one). build-nanogpt's cells have their command made as they run: their
    parameters tell them apart."""
    return json.dumps([cell.kind, cell.cmd, cell.params], sort_keys=True, default=str)


@dataclass(frozen=True)
class Sizes:
    """The sizes of the stages: real on the GPU, tiny in --smoke."""

    smoke: bool
    model: str
    seq_len: int
    batches: tuple[int, ...]  # the throughput grid's micro-batches, the trainer's default first
    steps: int
    tokens_per_step: int
    xl_model: str
    xl_batch: int  # one micro-batch a step: XL's figures are per step, and its steps are long enough
    loss_steps: int  # the FP8 loss check's steps

    @classmethod
    def make(cls, smoke: bool) -> "Sizes":
        if smoke:
            return cls(True, "tiny", 64, (8, 4, 2), WARMUP + 3, 512, "tiny", 2, 8)
        return cls(False, "gpt2", 1024, (64, 32, 16), WARMUP + MEASURED_STEPS, 2**17, "gpt2-xl", 8, 200)

    def device_flags(self) -> list[str]:
        return ["--device", "cpu", "--no-compile"] if self.smoke else ["--device", "cuda"]


FULL = Sizes.make(smoke=False)  # estimates are always the GPU's, in --smoke too


@dataclass(frozen=True)
class Where:
    """Where a stage's cells read and write: the random-token shards the stage writes
    (`data`), the trainer runs' folders (`work`), scratch (`tmp`), the user's corpus (for
    the stages that compare losses; None: not given) and the CUDA tests' xdist workers."""

    data: Path
    work: Path
    tmp: Path
    corpus: Path | None = None
    workers: int = 0


NOWHERE = Where(Path("/nowhere"), Path("/nowhere"), Path("/nowhere"), Path("/nowhere"),
                PYTEST_WORKERS)  # for plans and cell names: commands are not shown, paths unused


# A 124M cell's head + loss: the trainer's default (on CUDA, the whole logits), or, side by
# side in loss-kernels, the whole logits named (--no-chunked-loss), the chunked loss
# through Liger Kernel's or Cut Cross-Entropy's kernel (--loss-kernel; ours is not offered
# on CUDA, gpt/model/loss_kernels.py), and the whole logits' loss in our Triton kernels
# (--loss-kernel fused, gpt/model/fused_ce.py) in each of its modes (FUSED_MODE; the forward
# mode's cell runs the trainer through gpt/bench/gpu/fused_mode.py): its name's suffix and
# its flags.
LOSSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "default": ("", ()), "unchunked": ("-unchunked", ("--no-chunked-loss",)),
    "liger": ("-liger", ("--loss-kernel", "liger")), "cce": ("-cce", ("--loss-kernel", "cce")),
    "fused": ("-fused", ("--loss-kernel", "fused")),
    "fused-forward": ("-fused-forward", ("--loss-kernel", "fused"))}
# the losses whose trainer runs in a mode of the fused loss other than FUSED_MODE's value
FUSED_MODE_LOSSES = {"fused-forward": "forward"}
# the trainer's default first (on CUDA, the whole logits): the others' baseline, and the
# same command as the throughput and fp8 stages' bf16 cell, measured once in an invocation
KERNEL_LOSSES = ("default", "liger", "cce", "fused", "fused-forward")
# Triton kernels: --smoke (CPU) records them as skipped (fused needs no package of its own:
# CUDA builds of torch bring Triton)
CUDA_ONLY_LOSSES = ("liger", "cce", "fused", "fused-forward")
LOSS_PACKAGES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
FP8_PACKAGE = "torchao"  # every --fp8 cell's (skipped without it)
FP8_RECIPES = ("tensorwise", "rowwise")  # --fp8: torchao's float8 scaling, per tensor or per row
SOFTCAP = 15.0  # the speedrun recipe's --logit-softcap (configs/gpt2-124m-speedrun.toml)
# fused-compile's cells: (compile mode, loss), the whole logits (the trainer's default on
# CUDA) first: the others' baseline
FUSED_COMPILE = (("default", "default"), ("default", "fused"), ("reduce-overhead", "fused"),
                 ("max-autotune", "fused"))
RECIPES = {"gpt2": "configs/gpt2-124m.toml", "speedrun": "configs/gpt2-124m-speedrun.toml"}
# The xl stage's auto-layout cell: 2^16 tokens a step, so several micro-batches whatever
# micro-batch the trainer picks; the trainer's planning before it starts (gpt/plan/layout.py: a
# plan for the layout, then a search over micro-batches) is part of the cell's time.
XL_AUTO_SEQUENCES, AUTO_LAYOUT_PLANS = 64, 5
PROFILED_STEPS = 2  # the profile stage traces each cell's last steps (after compiling and warming up)
TOKENS_STEPS, TOKENS_BATCH_TOKENS = 40, 2**16  # 2.6M tokens
TOKENS_SEEDS = 2  # each point over 2 seeds: a spread
# Per seed: the GPT-2 recipe under both schedules, the new one and its tied-head variant
# each over the full, half and (if still below the target) a quarter budget: 8 processes,
# 5.5 full runs' work
TOKENS_RUNS, TOKENS_WORK = 8 * TOKENS_SEEDS, 5.5 * TOKENS_SEEDS


def pytest_workers() -> int:
    """xdist's workers where pytest-xdist is installed, else none."""
    return PYTEST_WORKERS if importlib.util.find_spec("xdist") is not None else 0


# ---------------------------------------------------------------------------------------
# the stages' cells


def stage_cells(stage: str, s: Sizes, w: Where) -> list[Cell]:
    b = s.batches[0]
    if stage == "cuda-tests":
        return [pytest_cell(w.tmp, w.workers)]
    if stage == "throughput":
        return [c for batch in s.batches for c in (ours_cell(s, w, batch), nanogpt_cell(s, batch))]
    if stage == "xl":
        return [xl_cell(s, w), xl_auto_cell(s, w)]
    if stage == "loss-kernels":  # the loss alone; the whole logits first, then each kernel
        return [loss_bench_cell(s, w.tmp), *(ours_cell(s, w, b, loss=loss) for loss in KERNEL_LOSSES)]
    if stage == "fused-compile":
        return [ours_cell(s, w, b, mode=mode, loss=loss, softcap=SOFTCAP) for mode, loss in FUSED_COMPILE]
    if stage == "profile":
        return [profiled(ours_cell(s, w, b), s), profiled(xl_cell(s, w), s)]
    if stage == "fp8":  # bf16 first at each size: the others' baseline
        return [ours_cell(s, w, b), *(ours_cell(s, w, b, fp8=recipe) for recipe in FP8_RECIPES),
                xl_auto_cell(s, w), xl_auto_cell(s, w, fp8="tensorwise")]
    if stage == "fp8-loss":
        return [loss_cell(s, w, None), loss_cell(s, w, "tensorwise")]
    if stage == "speedrun":
        return [recipe_cell(s, w, recipe) for recipe in RECIPES]
    if stage == "max-autotune":
        return [ours_cell(s, w, b, mode="max-autotune")]
    if stage == "ladder":
        return [ladder_cell(s, w.tmp)]
    if stage == "tokens":
        return [tokens_cell(s, w)]
    raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")


def pytest_cell(tmp: Path, workers: int) -> Cell:
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", f"--junitxml={tmp / 'junit.xml'}"]
    if workers > 1:  # the tests' trainer runs are mostly compiling: CPU work
        # one test at a time to whichever worker is free, not the settings' whole file a
        # worker (--dist loadfile: tests/runs/test_cuda.py's tests alone are 400 s on one)
        cmd += ["-n", str(workers), "--dist", "load"]
    return Cell("pytest-cuda", "pytest", pytest_estimate(workers), [*cmd, str(REPO / "tests")],
                {"workers": workers}, uses=tuple(LOSS_PACKAGES.values()))


def ours_cell(s: Sizes, w: Where, batch: int, mode: str = "default", loss: str = "default",
              fp8: str | None = None, softcap: float = 0.0) -> Cell:
    """The trainer at `s.model`; `loss` (one of LOSSES) picks its head + loss, `fp8` (one
    of FP8_RECIPES) its FP8 matmuls, `softcap` its --logit-softcap."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    suffix, flags = LOSSES[loss]
    extra = [*flags, *(["--fp8", fp8] if fp8 else []), *(["--logit-softcap", f"{softcap:g}"] if softcap else [])]
    estimate = PLANNER_S["gpt2"] + run_estimate(FULL.model, FULL.steps, FULL.tokens_per_step,
                                                FULL.seq_len, mode=mode, fp8=fp8 is not None)
    name = f"ours-b{batch}-{mode}{suffix}{f'-fp8-{fp8}' if fp8 else ''}{f'-cap{softcap:g}' if softcap else ''}"
    cell = trainer_cell(name, s, w.data, w.work, batch=batch, mode=mode, steps=s.steps,
                        estimate=estimate, extra=extra, loss=loss, fp8=fp8)
    cell.params["softcap"] = softcap
    return cell


def loss_cell(s: Sizes, w: Where, fp8: str | None) -> Cell:
    """124M on the user's corpus (random tokens in --smoke) for Sizes.loss_steps, bf16 or
    FP8: the same tokens in the same order and the same learning rate at every step, so
    the two runs' losses compare step by step."""
    data = w.data if s.smoke or w.corpus is None else w.corpus
    estimate = PLANNER_S["gpt2"] + run_estimate(FULL.model, FULL.loss_steps, FULL.tokens_per_step,
                                                FULL.seq_len, fp8=fp8 is not None)
    return trainer_cell(f"loss-{s.model}-{'fp8-' + fp8 if fp8 else 'bf16'}", s, data, w.work,
                        batch=s.batches[0], mode="default", steps=s.loss_steps, estimate=estimate,
                        extra=["--fp8", fp8] if fp8 else None, fp8=fp8)


def recipe_cell(s: Sizes, w: Where, recipe: str) -> Cell:
    """The trainer with a recipe's TOML (RECIPES): its model options, optimizer and
    schedule, and its own tokens a step (the optimizer runs once a step, so a smaller step
    would weigh Muon's Newton-Schulz against fewer tokens than the recipe does), with the
    throughput cells' micro-batch, steps and data."""
    tokens = recipe_step_tokens(recipe)
    estimate = PLANNER_S["gpt2"] + run_estimate(FULL.model, FULL.steps, tokens, FULL.seq_len)
    return trainer_cell(f"recipe-{recipe}-b{s.batches[0]}", s, w.data, w.work, batch=s.batches[0],
                        mode="default", steps=s.steps, estimate=estimate, recipe=recipe,
                        tokens_per_step=None if s.smoke else tokens)


def recipe_step_tokens(recipe: str) -> int:
    """The tokens a step of the recipe's TOML (its --total-batch-tokens)."""
    from gpt.core.cli import parse_args  # the trainer's own reading of the file

    return parse_args(["--config", str(REPO / RECIPES[recipe])]).data.total_batch_tokens


def profiled(cell: Cell, s: Sizes) -> Cell:
    """`cell` with a torch.profiler trace of its last PROFILED_STEPS steps (--torch-profile),
    which its result summarises (gpt/bench/trace_summary.py)."""
    folder = Path(cell.params["out"]) / "trace"
    flags = ["--torch-profile", str(folder), "--profile-start", str(s.steps - PROFILED_STEPS),
             "--profile-steps", str(PROFILED_STEPS)]
    return dataclasses.replace(
        cell, name=f"{cell.name}-profile", cmd=[*cell.cmd, *flags], estimate_s=cell.estimate_s + PROFILE_S,
        params={**cell.params, "trainer_argv": [*cell.params["trainer_argv"], *flags],
                "profile_dir": str(folder)})


def nanogpt_cell(s: Sizes, batch: int) -> Cell:
    # build-nanogpt's model is GPT-2 124M at T=1024, whatever the sizes
    return Cell(f"build-nanogpt-b{batch}", "nanogpt",
                run_estimate("gpt2", FULL.steps, FULL.tokens_per_step, 1024),
                params={"batch_size": batch, "steps": s.steps})


def xl_cell(s: Sizes, w: Where) -> Cell:
    tokens = s.xl_batch * s.seq_len
    estimate = PLANNER_S["gpt2-xl"] + run_estimate(FULL.xl_model, FULL.steps, FULL.xl_batch * FULL.seq_len,
                                                   FULL.seq_len, torchrun=True, recompute=True)
    cell = trainer_cell(f"{s.xl_model}-fsdp-ac-1gpu", s, w.data, w.work, batch=s.xl_batch,
                        mode="default", steps=s.steps, estimate=estimate, model=s.xl_model,
                        tokens_per_step=tokens, extra=["--parallel", "fsdp", "--activation-checkpointing"])
    cell.cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                *cell.cmd[1:]]
    return cell


def xl_auto_cell(s: Sizes, w: Where, fp8: str | None = None) -> Cell:
    """GPT-2 XL with the layout left to the trainer (gpt/plan/layout.py: on one GPU no FSDP, the
    least recomputation and the largest micro-batch that fit), XL_AUTO_SEQUENCES sequences a
    step: several micro-batches, so that AdamW's update is spread over them as in training
    (the FSDP cell updates after every micro-batch of 8); `fp8`: with FP8 matmuls (the
    trainer plans its layout for them), where FP8 is expected to pay (torchao's float8
    training measured +3.6% at 1.5B, pytorch/ao issue 1297)."""
    sequences = 4 * s.xl_batch if s.smoke else XL_AUTO_SEQUENCES
    estimate = AUTO_LAYOUT_PLANS * PLANNER_S["gpt2-xl"] + run_estimate(
        FULL.xl_model, FULL.steps, XL_AUTO_SEQUENCES * FULL.seq_len, FULL.seq_len, fp8=fp8 is not None)
    return trainer_cell(f"{s.xl_model}-auto-1gpu{f'-fp8-{fp8}' if fp8 else ''}", s, w.data, w.work,
                        batch="auto", mode="default", steps=s.steps, estimate=estimate,
                        model=s.xl_model, tokens_per_step=sequences * s.seq_len,
                        extra=["--parallel", "auto", "--activation-checkpointing", "auto",
                               *(["--fp8", fp8] if fp8 else [])], fp8=fp8)


def tokens_cell(s: Sizes, w: Where) -> Cell:
    """python -m gpt.bench tokens at 124M, T=1024: one learning rate per recipe (the GPT-2
    recipe's own, the CPU sweep's best scale for the new one), TOKENS_SEEDS seeds."""
    steps = 4 if s.smoke else TOKENS_STEPS
    data = w.data if s.smoke or w.corpus is None else w.corpus
    cmd = [sys.executable, "-m", "gpt.bench", "tokens", "--out", str(w.tmp / "tokens"),
           "--data-dir", str(data), "--model", s.model,
           "--seq-len", str(s.seq_len), "--batch-size", str(2 if s.smoke else 16),
           "--total-batch-tokens", str(s.seq_len * 2 if s.smoke else TOKENS_BATCH_TOKENS),
           "--steps", str(steps), "--val-every", str(2 if s.smoke else 5),
           "--val-steps", "2" if s.smoke else "8",
           "--baseline-lrs", "6e-4", "--new-lr-scales", "1", "--new-budgets", "0.5",
           "--seeds", "1" if s.smoke else str(TOKENS_SEEDS),
           "--max-halvings", "0" if s.smoke else "1",
           "--device", "cpu" if s.smoke else "cuda", "--trainer-flags=--no-compile",
           # no timing phase: the stage expects the GPU to itself, so the runs' own
           # times are not another job's load
           "--timing-repeats", "0"]
    cmd += ["--n-layer", "2", "--n-head", "2", "--n-embd", "64"] if s.smoke else \
        ["--n-layer", "12", "--n-head", "12", "--n-embd", "768"]
    return Cell(f"tokens-{s.model}", "tokens",
                tokens_estimate(TOKENS_RUNS, TOKENS_WORK, TOKENS_STEPS, TOKENS_BATCH_TOKENS), cmd,
                {"data_dir": str(data), "steps": steps})


def loss_bench_cell(s: Sizes, tmp: Path) -> Cell:
    """The whole logits' loss on its own (gpt/bench/gpu/loss_bench.py): inductor's compiled
    loss and the fused kernels' two modes, the forward mode at each of its launches, without
    and with the soft cap, at the 124M cells' micro-batch, each judged against the compiled
    loss; tiny and eager in --smoke (the fused modes then skipped: CUDA only)."""
    out = tmp / "loss_bench.json"
    cmd = [sys.executable, "-m", "gpt.bench.gpu.loss_bench", "--out", str(out)]
    if s.smoke:
        cmd += ["--device", "cpu", "--rows", "64", "--vocab", "500", "--no-compile", "--warmup", "1",
                "--repeats", "2"]
    else:
        cmd += ["--rows", str(s.batches[0] * s.seq_len)]
    return Cell("loss-bench", "loss-bench", loss_bench_estimate(), cmd, {"out": str(out)})


def ladder_cell(s: Sizes, tmp: Path) -> Cell:
    cmd = [sys.executable, "-m", "gpt.bench", "ladder", "--out", str(tmp / "ladder"), "--name", "ladder",
           "--steps", str(MEASURED_STEPS) if not s.smoke else "2",
           "--warmup", str(WARMUP) if not s.smoke else "1"]
    if s.smoke:
        cmd += ["--device", "cpu", "--no-compile-rungs", "--seq-len", "32", "--batch-size", "2"]
    return Cell(f"ladder-{s.model}", "ladder", ladder_estimate(), cmd)


def trainer_cell(name: str, s: Sizes, data: Path, work: Path, *, batch: int | str, mode: str,
                 steps: int, estimate: float, model: str | None = None,
                 tokens_per_step: int | None = None, extra: list[str] | None = None,
                 loss: str = "default", fp8: str | None = None, recipe: str | None = None) -> Cell:
    out = work / name
    tokens = tokens_per_step or max(s.tokens_per_step, int(batch) * s.seq_len)
    # --no-save-checkpoints: a benchmark keeps nothing (a final checkpoint is 1.5 GB at 124M,
    # 18.7 GB at XL, written with fsync and a CRC pass)
    argv = ["--config", str(REPO / RECIPES[recipe])] if recipe else []
    argv += ["--model", model or s.model, "--seq-len", str(s.seq_len), "--block-size", str(s.seq_len),
             "--batch-size", str(batch), "--total-batch-tokens", str(tokens),
             "--max-steps", str(steps), "--log-every", "1", "--val-every", "0", "--sample-every", "0",
             "--hellaswag-every", "0", "--no-save-checkpoints", "--data-dir", str(data),
             "--out-dir", str(out), *s.device_flags(), *(extra or [])]
    if not recipe:  # a recipe keeps its own schedule
        argv += ["--warmup-steps", str(LR_WARMUP_STEPS)]
    if not s.smoke:
        argv += ["--compile-mode", mode]
    cmd = trainer_command(argv)
    if loss in FUSED_MODE_LOSSES:  # the same trainer, the fused loss in that mode
        cmd = [sys.executable, "-m", "gpt.bench.gpu.fused_mode", FUSED_MODE_LOSSES[loss], *argv]
    needs = tuple(m for m in (LOSS_PACKAGES.get(loss), FP8_PACKAGE if fp8 else None) if m)
    params = {"model": model or s.model, "batch_size": batch, "compile_mode": mode, "out": str(out),
              "tokens_per_step": tokens, "steps": steps, "loss": loss, "fp8": fp8 or "off",
              "recipe": recipe or "default", "trainer_argv": argv, "world_size": 1,
              "device_type": "cpu" if s.smoke else "cuda"}
    return Cell(name, "trainer", estimate, cmd, params, needs=needs)
