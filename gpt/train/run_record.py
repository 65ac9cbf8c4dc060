"""What a run records as it starts: `config.toml` (the resolved recipe, to repeat it),
the metrics log's header record (config, device, torch, parameters, FLOPs per token,
where it resumed from) and the banner the console shows."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, Iterator

import torch

from gpt.checkpoint.run_folder import CONFIG_NAME, METRICS_NAME
from gpt.core.cli import to_toml
from gpt.core.config import ConfigError
from gpt.core.config_io import describe, to_dict
from gpt.core.fileio import atomic_write
from gpt.core.text import one_line
from gpt.model import loss_kernels
from gpt.report.flops import flops_per_token, peak_memory, peak_tflops
from gpt.report.metrics import MetricsLog
from gpt.runtime.device import DTYPE_NAMES, device_name
from gpt.train.run import Run


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
                "--out-dir NEW_FOLDER repeats it\n"
                f"# out_dir names this run's folder: a copy of the folder continues in the "
                f"copy only with --out-dir COPY (--config COPY/config.toml --resume auto alone "
                f"trains in {one_line(str(run.out_dir), None)})\n" + to_toml(recipe))
        try:
            atomic_write(run.out_dir / CONFIG_NAME, lambda fh: fh.write(text.encode()))
        except OSError as e:
            raise ConfigError(f"{run.out_dir / CONFIG_NAME}: cannot write it ({e.strerror or e})") from None
    log = MetricsLog(run.out_dir / METRICS_NAME, enabled=run.runtime.is_master,
                     trackers=run.trackers)
    try:
        log.write(banner(run))
        yield log
    finally:
        log.close()


def banner(run: Run) -> dict[str, Any]:
    """Print what is about to run; return the metrics log's header record."""
    cfg, rt, d, par = run.cfg, run.runtime, run.cfg.data, run.par
    name, peak = device_name(rt.device), run_peak(run)
    run.say(describe(cfg))
    ac, fp8 = cfg.train.activation_checkpointing, cfg.train.fp8
    run.say(
        f"device {rt.device} ({name}) x {rt.world_size} | parallel {cfg.train.parallel}"
        f"{f' | activation checkpointing {ac}' if ac != 'none' else ''}"
        f"{f' | fp8 {par.fp8}' if fp8 != 'none' else ''}"
        f" | precision {DTYPE_NAMES[run.autocast_dtype]}"
        f"{' + tf32' if cfg.train.tf32 and rt.device_type == 'cuda' else ''}"
        f" | compile {cfg.train.compile_mode if par.compiled else False} | fused AdamW {par.fused}"
        f" | loss {loss_kernels.describe(run.model.chunked_loss, run.model.loss_kernel)}"
        f" | params {run.model.num_params():,}"
        f" | grad accum {run.accum} x {d.batch_size} x {d.seq_len} tokens"
        f" | train tokens {run.train_loader.num_tokens:,}"
    )
    if peak is None:
        run.say("note: peak FLOP/s of this device unknown; MFU not reported (set --peak-tflops)")
    if fp8 != "none" and rt.device_type == "cuda" and not par.compiled:
        run.say("note: --fp8 without torch.compile runs each FP8 cast as kernels of its own; "
                "torchao's float8 is meant to be compiled (drop --no-compile)")
    if cfg.optim.warmup_steps > cfg.train.max_steps and rt.is_master:
        print(f"warning: --warmup-steps {cfg.optim.warmup_steps} is longer than the run "
              f"(--max-steps {cfg.train.max_steps}): the learning rate never reaches --max-lr "
              f"{cfg.optim.max_lr}", file=sys.stderr)
    return {
        "type": "run", "config": to_dict(cfg), "device": str(rt.device),
        "device_name": name, "world_size": rt.world_size, "torch": torch.__version__,
        "dtype": DTYPE_NAMES[run.autocast_dtype], "compile": par.compiled,
        "fused_adamw": par.fused, "chunked_loss": run.model.chunked_loss, "fp8": par.fp8,
        "loss_kernel": (run.model.loss_kernel if run.model.chunked_loss
                        or run.model.loss_kernel == "fused" else None),
        "params": run.model.num_params(), "grad_accum": run.accum,
        "threads": torch.get_num_threads(),  # each process's: what its tokens/s had to work with
        "flops_per_token": flops_per_token(cfg.model, d.seq_len), "peak_tflops": peak,
        "peak_mem_source": peak_memory(rt.device)[1],
        "layout": run.layout_choice,  # --parallel/... auto: the choice, why, its planned peak
        "start_step": run.state.step,
        "resumed_from": str(run.checkpointer.resumed_from) if run.checkpointer.resumed_from else None,
        "time": time.time(),
    }
