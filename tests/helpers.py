"""Shared test helpers: the trainer's command line (here or in a subprocess), shared data paths,
small models and trainer-style checkpoints."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO / "train_gpt2.py"
SHARED_DATA = REPO.parent / "shared" / "data"  # offline caches beside the checkout, when present
SHAKESPEARE = REPO / "gpt" / "assets" / "tinyshakespeare.txt"  # shipped with the package

# A 2-layer, 64-wide model on 32-token sequences: a CPU step takes well under a second.
TINY = ["--model", "tiny", "--block-size", "32", "--seq-len", "32", "--batch-size", "4",
        "--total-batch-tokens", "256", "--warmup-steps", "2", "--max-lr", "3e-3",
        "--device", "cpu"]
QUIET = ["--val-every", "0", "--sample-every", "0"]
# a tiny run whose every step is one 512-token batch (accumulation where micro-batches are smaller)
TINY_RUN = [*TINY, *QUIET, "--total-batch-tokens", "512"]


def write_random_shards(folder: Path, seed: int, train: tuple[int, ...],
                        val: tuple[int, ...] = ()) -> Path:
    """A data folder of random GPT-2 token ids: one train_/val_ shard per size given."""
    import numpy as np

    from gpt.data.shards import write_shard

    rng = np.random.default_rng(seed)
    for split, sizes in (("train", train), ("val", val)):
        for i, n in enumerate(sizes):
            write_shard(folder / f"{split}_{i:06d}.bin", rng.integers(0, 50257, n))
    return folder


def error_line(text: str) -> str:
    """The one error line of a refusal (a command's output, or an error's text): no
    traceback, and exactly one line that says `error:`."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "error:" in line]
    assert len(lines) == 1, text
    return lines[0]


def one_line_error(proc: subprocess.CompletedProcess, code: int = 1) -> str:
    """A command that refused: exit status `code`, and the one error line on its stderr."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    return error_line(proc.stderr)


def only_line(text: str) -> str:
    """Output that is a single line and nothing else (a refusal that says only that): the line."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def run_cli(*args: str, timeout: int = 300, process: bool = False,
            **kwargs: Any) -> subprocess.CompletedProcess:
    """`python train_gpt2.py ARGS`, captured: its exit status, stdout and stderr. It runs in
    this process (train_gpt2.py's own call, gpt.entry.train_main), which saves a Python
    start and torch's import, about 5 s a run on 2 cores; as a process of its own where the
    test passes subprocess's arguments (env, preexec_fn, ...) or process=True: a test of
    what the process does (its environment, limits, signals, what it imports); `timeout`
    bounds a process."""
    if process or kwargs:
        return subprocess.run([sys.executable, str(TRAIN_SCRIPT), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, **kwargs)
    return train_here(*args)


def train_here(*args: str) -> subprocess.CompletedProcess:
    """train_gpt2.py's entry point called here, as `python train_gpt2.py ARGS` runs it: from
    the checkout (relative paths), its streams captured, an exit by SystemExit turned into
    the status, Python's own warning filters (pytest's would swallow what a user sees), and
    torch.compile's caches emptied after it (its recompile limit counts across runs). A run
    in which torch.compile gave up on a function (its recompile limit hit: dynamo then runs
    it eagerly, saying so in one log line nobody reads) fails, status 1, with that line: a
    compiled test must not pass uncompiled."""
    import contextlib
    import io

    from gpt.entry import train_main

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    fell_back = CompileFellBack()
    fell_back.start()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults, as a process of its own starts with
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _to_stderr
            try:
                code = train_main(list(args))
            except SystemExit as e:  # argparse's errors, --help
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.chdir(cwd)
        fell_back.stop()
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            dynamo.reset()
    if fell_back.said:
        code = code or 1
        err.write("".join(f"\ntorch.compile fell back to eager in this run: {line}"
                          for line in fell_back.said) + "\n")
    return subprocess.CompletedProcess([sys.executable, str(TRAIN_SCRIPT), *args], code,
                                       out.getvalue(), err.getvalue())


# dynamo's module that decides to compile a function, or, past its recompile limit, not to
_DYNAMO_LOGGER = "torch._dynamo.convert_frame"


class CompileFellBack(logging.Handler):
    """Between start() and stop(), keeps the first line of each warning dynamo logs when it
    stops compiling a function ("torch._dynamo hit config.recompile_limit (8)", and the
    accumulated limit's): from then on that function runs eagerly. A handler on dynamo's
    own logger, so torch._dynamo need not be imported here (a run that never compiles does
    not import it). train_here fails a run that fell back; tests/cuda_checks.py a cuda test."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def start(self) -> None:
        logging.getLogger(_DYNAMO_LOGGER).addHandler(self)

    def stop(self) -> None:
        logging.getLogger(_DYNAMO_LOGGER).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("torch._dynamo hit config."):
            self.said.append(" ".join(message.split("\n")[:2]).strip())


def _to_stderr(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: Any = None, line: str | None = None) -> None:
    """A warning shown as Python shows one: on stderr (here, the run's captured stream)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def start_trainer(*args: str, **kwargs: Any) -> subprocess.Popen:
    """`python train_gpt2.py ARGS` started as a process of its own, in a session of its own
    (kill_tree ends it and whatever it started), its output piped as text."""
    return subprocess.Popen([sys.executable, str(TRAIN_SCRIPT), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def torchrun_cmd(*args: str, nproc: int = 2, extra: tuple[str, ...] = (),
                 target: Sequence[str] = (str(TRAIN_SCRIPT),)) -> list[str]:
    """torchrun's command line; `target` is what it launches: a script, or ("-m", module)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *extra, *target, *args]


# Set by a launcher for its workers; torchrun sets its own, so none may leak in from here.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_torchrun(*args: str, nproc: int = 2, extra: tuple[str, ...] = (),
                 target: Sequence[str] = (str(TRAIN_SCRIPT),),
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=N TARGET ARGS` (gloo on CPU), captured;
    TARGET is train_gpt2.py unless given."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env["OMP_NUM_THREADS"] = "1"  # 2 ranks on 2 cores: no oversubscription
    return subprocess.run(torchrun_cmd(*args, nproc=nproc, extra=extra, target=target), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)


def free_port() -> int:
    """A loopback TCP port nothing listens on at the moment of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def meta_gpt(name: str, **overrides: object):
    """A preset GPT built on the meta device: shapes without memory, so even 2.7B is instant."""
    import torch

    from gpt.core.config import model_preset
    from gpt.model.transformer import GPT

    with torch.device("meta"):
        return GPT(model_preset(name, **overrides))


def write_checkpoint(path: Path, model=None, step: int = 1, block_size: int = 64) -> Path:
    """A trainer-style checkpoint of `model`; by default a tiny model (seed 0) with GPT-2's
    padded vocabulary and the given block size."""
    import torch

    from gpt.core.config import Config, model_preset
    from gpt.core.config_io import to_dict
    from gpt.model.transformer import GPT

    if model is None:
        torch.manual_seed(0)
        model = GPT(model_preset("tiny", block_size=block_size))
    cfg = Config(preset="tiny", model=model.config)
    torch.save({"model": model.state_dict(), "optimizer": {}, "loader": {}, "step": step,
                "config": to_dict(cfg)}, path)
    return path


def read_metrics(out: Path, kind: str | None = None) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if kind is None or r["type"] == kind]


def _last_output(proc: subprocess.Popen) -> str:
    """What an ended process wrote to its pipes (the reason it stopped), its last 3,000
    characters; nothing where its pipes are not ours or a child still holds them open."""
    try:
        streams = proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return ""
    text = "".join(s if isinstance(s, str) else s.decode(errors="replace") for s in streams if s)
    return text[-3000:]


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Poll until predicate() is true; fail if the process ends or time runs out first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (status {proc.returncode}) before the "
                                 f"condition; its last output:\n{_last_output(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


def kill_tree(proc: subprocess.Popen) -> None:
    """Make sure a test's process group is gone, whatever state it is in."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def assert_resume_is_exact(args: Sequence[str], tmp_path: Path, steps: int = 4) -> Path:
    """Train `steps` steps straight, and again stopped at half and resumed: the same losses.
    Returns the resumed run's folder."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = [*args, "--max-steps", str(steps)]
    assert run_cli(*common, "--out-dir", str(straight)).returncode == 0
    for extra in (["--stop-at-step", str(steps // 2)], ["--resume", "auto"]):
        proc = run_cli(*common, *extra, "--out-dir", str(split))
        assert proc.returncode == 0, proc.stderr
    assert [r["loss"] for r in read_metrics(split, "train")] == \
        [r["loss"] for r in read_metrics(straight, "train")]
    return split


# How far two runs of the same training may end apart when their gradients differ only by
# fp32 rounding: the summation order of ranks against one process, of micro-batches, or of
# another CPU's kernels (ATEN_CPU_CAPABILITY default, avx2, avx512 each add up in their own
# order). Derived below from what the comparison can differ by, so that it holds on any CPU
# torch supports, and still fails a planted bug.
#
# Losses, rel 1e-5: at step 0 the weights are the same, and a forward's fp32 sums differ by
# about 1e-7 of their value in another order. After an update the weights differ only where
# AdamW amplified rounding (below): elements whose gradient was within rounding of zero, so
# they move the next loss to second order only. 1e-5 is 100x fp32's rounding; a doubled
# gradient on one rank or a skipped all-reduce moves step 1's loss by about 1e-4 or more.
LOSS_REL = 1e-5
# Gradient norms, rel 1e-3: step 0's differs by rounding only (~1e-7); later steps' are
# taken at weights that differ in the few amplified elements (measured across capabilities:
# under 1e-6; FSDP, whose norm sums each shard's squares apart, 1.2e-4 on every capability).
# A wrong accumulation divisor scales every gradient, and AdamW undoes a scale (its update
# is m / sqrt(v)), so this is the check that catches one first: off by 2x, not 1e-3.
GRAD_NORM_REL = 1e-3
# AdamW's update of an element is lr * m_hat / (sqrt(v_hat) + eps): with beta1 0.9 and
# beta2 0.95, |m_hat / sqrt(v_hat)| <= 1.001 over the first steps (Cauchy-Schwarz on the
# moments' weights; exactly 1, the gradient's sign, at step 1). So however large or small
# the gradient, a step moves an element by at most lr, and where the gradient is within
# rounding of zero the rounding picks the direction: two runs may differ there by up to
# 2 * lr per step. Key biases get exactly zero gradient in exact arithmetic (softmax ignores
# a shift shared by every key), and an embedding row of a token absent from the batch only
# the softmax's faint pull: the elements where another summation order shows.
ADAM_STEP = 1.001
# Elsewhere an element's update moves by lr times its gradient's relative rounding (~1e-6
# for a gradient away from zero): more than lr / 100 only for a gradient within about 1e4
# roundings of zero: a thin slice of the weights. Measured at max lr 3e-3 (lr / 100 = 3e-5),
# one process under ATEN_CPU_CAPABILITY=default against 2 ranks (DDP, ZeRO-1, FSDP) under
# avx2 and the reverse: none of 3.4M weights beyond it, the furthest 2.8e-5 (an AVX-512
# Xeon's furthest: 8.2e-5); the bound lets 3,400 of them past. A real error turns the
# gradient's direction, and with it most elements' updates by a good part of lr (measured:
# a gradient doubled on rank 1 moved 92% of the weights past lr / 100, a skipped all-reduce
# 95%, a divisor of 2x the accumulation steps 10%).
MOVED_FRACTION = 1e-3


def assert_weights_agree(ref: dict, got: dict, lrs: Sequence[float]) -> None:
    """Final weights of two runs of the same training (state dicts), trained at the learning
    rates `lrs`, agree to what AdamW makes of fp32 rounding (derived above): no element
    further apart than both runs' updates flipped at every step, and at most
    MOVED_FRACTION of them further than a hundredth of the largest learning rate."""
    import torch

    assert got.keys() == ref.keys()
    bound, tight = 2 * ADAM_STEP * sum(lrs), max(lrs) / 100
    moved = total = 0
    for name, value in ref.items():
        diff = (got[name].float() - value.float()).abs()
        assert torch.isfinite(diff).all() and diff.max() <= bound, (name, diff.max(), bound)
        moved += int((diff > tight).sum())
        total += diff.numel()
    assert moved <= MOVED_FRACTION * total, (f"{moved} of {total} weights differ by more than "
                                             f"{tight:.1e}")


def assert_trains_alike(one: Path, two: Path, step: int, weights: bool = True) -> None:
    """Runs `one` and `two` (folders) log the same steps, with losses and gradient norms to
    LOSS_REL and GRAD_NORM_REL, and (unless `weights` is False: an optimizer other than
    AdamW bounds its own) end with weights that agree (their checkpoints of `step`)."""
    import pytest

    from gpt.checkpoint.files import load

    a, b = read_metrics(one, "train"), read_metrics(two, "train")
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=LOSS_REL)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a],
                                                        rel=GRAD_NORM_REL)
    if not weights:
        return
    name = f"ckpt_{step:06d}.pt"
    assert_weights_agree(load(one / name)["model"], load(two / name)["model"],
                         [r["lr"] for r in a])


def assert_two_ranks_match_one(args: Sequence[str], mode: str, tmp_path: Path,
                               weights: bool = True) -> tuple[Path, Path]:
    """The same run in one process and on 2 gloo ranks under --parallel `mode`: the same
    losses, gradient norms and (unless `weights` is False) final weights, to what fp32
    rounding in another summation order can make of them (assert_trains_alike). `args`
    ends with --max-steps N and the run checkpoints at its end. Returns (one, two)."""
    one, two = tmp_path / "one", tmp_path / "two"
    proc = run_cli(*args, "--out-dir", str(one))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_torchrun(*args, "--parallel", mode, "--out-dir", str(two))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_trains_alike(one, two, int(args[list(args).index("--max-steps") + 1]), weights)
    return one, two


def meta_build_and_reference(cfg: Any) -> tuple[Any, Any]:
    """(a GPT of cfg built on the meta device, moved to the CPU and initialised; one built
    on the CPU directly), each from seed 0, after checking that their weights are equal:
    the trainer builds big models the first way, and must get the same start."""
    import torch

    from gpt.model.transformer import GPT

    torch.manual_seed(0)
    ref = GPT(cfg)
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    assert model.state_dict().keys() == ref.state_dict().keys()
    for key, value in ref.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    return model, ref


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create anything in: one of mode 555, or for root, whom
    modes do not stop, sysfs (where not even root may make a folder). Skips the test where
    there is none."""
    import pytest

    if os.geteuid() != 0:
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o555)
        return parent
    probe = Path("/sys/gpt2-trainer-probe")
    try:
        probe.mkdir()
    except OSError:
        return Path("/sys")
    probe.rmdir()
    pytest.skip("no folder here is read-only to root")


def listing(folder: Path) -> list[str]:
    """What a folder holds (to show a refusal wrote nothing); [] for none."""
    if not os.path.lexists(folder) or not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir())


def cuda_run_losses(tmp_path: Path, variants: dict[str, list[str]],
                    total_batch_tokens: int) -> dict[str, tuple[list[float], str]]:
    """A compiled 4-step CUDA run of a tiny soft-capped model for each variant's flags, on
    the same random data: each one's logged losses and its output."""
    data = write_random_shards(tmp_path, seed=3, train=(20_000,))
    runs = {}
    for name, flags in variants.items():
        out = tmp_path / name
        proc = run_cli("--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "8",
                       "--total-batch-tokens", str(total_batch_tokens), "--device", "cuda",
                       "--logit-softcap", "15", "--max-steps", "4", "--no-save-checkpoints", *QUIET,
                       *flags, "--data-dir", str(data), "--out-dir", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = ([r["loss"] for r in read_metrics(out, "train")], proc.stdout + proc.stderr)
    return runs


def lm_eval_command(monkeypatch: Any, *args: str) -> int:
    """`gpt2-lm-eval ARGS` in this process (its parser reads sys.argv). The harness gives
    its logger a handler on this test's stderr, once a process: undone after the test."""
    import copy

    import lm_eval.utils

    from gpt import harness_cli

    logger = logging.getLogger("lm_eval")
    for name in ("handlers", "propagate", "level"):
        monkeypatch.setattr(logger, name, copy.copy(getattr(logger, name)))
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
    monkeypatch.setattr(sys, "argv", ["gpt2-lm-eval", *args])
    return harness_cli.main()


class served_folder:
    """`with served_folder(folder) as base:` files of `folder` over HTTP at base + "/NAME",
    from a thread of this process, on the loopback, for the length of the block."""

    def __init__(self, folder: Path) -> None:
        import functools
        import http.server

        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *args: None  # type: ignore[method-assign]
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class silent_host:
    """`with silent_host() as (host, port):` a loopback address that takes connections and
    never answers them: a hub or mirror that hangs (the kernel completes the handshake of
    up to the backlog's connections; nothing is ever read or written)."""

    def __enter__(self) -> tuple[str, int]:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        return "127.0.0.1", self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def val_loader(run: Any) -> Any:
    """A built run's validation loader (what its validation loaded)."""
    return next(held for ev, held in run.evaluations if ev.name == "val").loader


def graph_breaks() -> int:
    """Graph breaks dynamo counted since the graph_backend fixture reset its counters."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def highest_rise(run) -> int:
    """The most bytes that blocks the CPU allocator hands out during run() hold at once,
    from the profiler's allocation events (frees have negative sizes)."""
    import torch
    from torch._C._profiler import _EventType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        run()
    events: list[tuple[int, int, int, int]] = []  # (time, order seen, pointer, size)

    def walk(event) -> None:
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            events.append((event.start_time_ns, len(events), fields.ptr, fields.alloc_size))
        for child in event.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    assert events, "the profiler recorded no allocations"
    # Only blocks allocated during run() count. The allocator's own running total also
    # counts blocks that an earlier profiled run (an earlier test) left alive, and falls
    # when one of those is freed mid-run: CI once measured a step's peak 5% low so.
    held: dict[int, int] = {}
    now = highest = 0
    for _, _, ptr, size in sorted(events):
        if size > 0:
            held[ptr] = size
            now += size
        elif ptr in held:
            now -= held.pop(ptr)
        highest = max(highest, now)
    return highest
