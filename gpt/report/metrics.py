"""What a run measures: FLOP counts and MFU, peak memory, step time and progress, and the
JSONL metrics log."""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from gpt.core import extras
from gpt.core.config import ConfigError, ModelConfig
from gpt.runtime.dist import Runtime, synchronize
from gpt.core.errors import UserError
from gpt.core.units import format_duration, human_count

# bf16 dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' datasheets
# (GeForce/RTX: the Ampere and Ada architecture whitepapers, "BF16 with FP32 accumulate").
# Matched against the device name (torch.cuda.get_device_name()) in this order, so
# specific names come before the names they contain ("H100 PCIe" before "H100", "L40S"
# before "L40" before "L4"). A key matches as a whole word, case-insensitively: "A10"
# does not match "A100" or "A10G", and "RTX 4090" does not match "RTX 4090 D", "Ti",
# "SUPER" or laptop parts, whose peaks differ. GPUs without bf16 tensor cores (V100, T4)
# are absent on purpose, as is any part whose number we could not check: pass
# --peak-tflops for those.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    # Hopper
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),  # SXM
    # Ampere data centre
    ("A100", 312.0),  # SXM and PCIe alike
    ("A30", 165.0),
    ("A40", 149.7),
    ("A10", 125.0),
    # Ada data centre
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    # Workstation
    ("RTX 6000 Ada", 364.2),
    ("RTX A6000", 154.8),
    # GeForce
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
    # AMD Instinct (ROCm builds report these names)
    ("MI300X", 1307.4),
]

# A key followed by one of these words names a different part (e.g. "RTX 4090 D").
_VARIANT_SUFFIX = r"(?:Ti|SUPER|D|Laptop|Mobile|Max-Q)\b"


def _name_pattern(key: str) -> re.Pattern[str]:
    return re.compile(
        rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])(?![ -]{_VARIANT_SUFFIX})",
        re.IGNORECASE,
    )


_PEAK_PATTERNS = [(_name_pattern(key), tflops) for key, tflops in PEAK_BF16_TFLOPS]


def peak_tflops(device_name: str) -> float | None:
    """The device's bf16 dense peak, or None when we do not know it (no MFU then)."""
    for pattern, tflops in _PEAK_PATTERNS:
        if pattern.search(device_name or ""):
            return tflops
    return None


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B style:

        6 * N  +  12 * n_layer * n_embd * seq_len

    N counts every weight a token's matmuls touch: the blocks plus the (tied) token
    embedding, which is the LM head's matmul; the position embedding is a lookup, not a
    matmul, and is left out. The second term is attention's QK^T and AV products
    (2 * 2 * T * d per layer forward, x3 for forward + backward), counted without the
    causal mask's saving, as is the convention for MFU; nor an attention window's or
    document mask's (--attn-window, --doc-mask), so with them this is an upper bound.
    Value embeddings are lookups (no matmul) and U-net skips and value mixing a few
    element-wise products per token: none is counted, as the position embedding is not.
    """
    d, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    per_block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attn, mlp (w + b), 2 LayerNorms
    n = L * per_block + V * d + 2 * d  # + token embedding / head, final LayerNorm
    return 6.0 * n + 12.0 * L * d * seq_len


def mfu(tokens_per_second: float, flops_per_tok: float, peak: float | None) -> float | None:
    """Achieved training FLOP/s over the peak (TFLOP/s); None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_second * flops_per_tok / (peak * 1e12)


# ---- peak memory


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or elsewhere the process's peak RSS where the
    OS allows it (Linux: /proc/self/clear_refs; elsewhere the peak stays since start)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5: reset the peak resident set size (VmHWM)
    except OSError:
        pass


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): on CUDA the most memory tensors held (the caching
    allocator's max_memory_allocated); on CPU and MPS, where that does not exist, the
    process's peak resident set size (RSS: everything the process holds in RAM)."""
    if device.type == "cuda":  # the allocator's own count: no need to wait for the device
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    return _peak_rss(), "peak RSS"


def _peak_rss() -> int:
    try:  # Linux: VmHWM, which clear_refs can reset
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # POSIX only

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(maxrss if sys.platform == "darwin" else maxrss * 1024)  # bytes on macOS, KiB elsewhere
    except ImportError:  # Windows
        return int(getattr(psutil.Process().memory_info(), "peak_wset", 0))


# ---- time


@dataclass
class StepTimer:
    """Wall time between log points; the device is synchronised only at those points, so
    steps in between queue up without host stalls."""

    runtime: Runtime
    start: float = 0.0
    steps: int = 0

    def reset(self) -> None:
        synchronize(self.runtime.device)
        self.start = time.perf_counter()
        self.steps = 0

    def lap(self) -> float:
        """Seconds per step since the last lap/reset."""
        synchronize(self.runtime.device)
        now = time.perf_counter()
        per_step = (now - self.start) / max(1, self.steps)
        self.start, self.steps = now, 0
        return per_step


@dataclass
class Progress:
    """How far the run is: tokens seen, time since this process started training, and an
    estimate of the time to --max-steps from a moving average of the step time (evaluation
    and checkpoints not counted)."""

    tokens_per_step: int
    max_steps: int
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    step_seconds: float | None = None

    def update(self, step: int, seconds_per_step: float) -> "Progress":
        self.step = step
        avg = self.step_seconds
        self.step_seconds = seconds_per_step if avg is None else 0.9 * avg + 0.1 * seconds_per_step
        return self

    def record(self) -> dict[str, float]:
        left = max(0, self.max_steps - self.step - 1) * (self.step_seconds or 0.0)
        return {"tokens_seen": (self.step + 1) * self.tokens_per_step,
                "elapsed_s": round(time.monotonic() - self.started, 1), "eta_s": round(left, 1)}

    def line(self) -> str:
        r = self.record()
        return (f"{human_count(r['tokens_seen'])} tokens | {self.step + 1}/{self.max_steps} steps in "
                f"{format_duration(r['elapsed_s'])}, ETA {format_duration(r['eta_s'])}")


# ---- the log


class Tracker(Protocol):
    """Somewhere else every metrics record goes (rank 0 only, like the log itself)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars_and_texts(record: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """A record as "type/key" -> number and "type/key" -> text (lists of strings joined)."""
    kind, numbers, texts = record["type"], {}, {}
    for key, value in record.items():
        if key in ("type", "step"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            numbers[f"{kind}/{key}"] = float(value)
        elif isinstance(value, str):
            texts[f"{kind}/{key}"] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            texts[f"{kind}/{key}"] = "\n\n".join(value)
        elif isinstance(value, dict):
            texts[f"{kind}/{key}"] = "    " + json.dumps(value, indent=1).replace("\n", "\n    ")
    return numbers, texts


class TensorBoardTracker:
    """Event files in `folder` for `tensorboard --logdir` (the tensorboard extra)."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional: the tensorboard extra

        self.writer = SummaryWriter(log_dir=str(folder))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        numbers, texts = scalars_and_texts(record)
        for tag, value in numbers.items():
            self.writer.add_scalar(tag, value, step)
        for tag, text in texts.items():
            self.writer.add_text(tag, text, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run (the wandb extra). Its id is kept in the run folder, so a
    resumed training run continues the same W&B run; WANDB_MODE=offline keeps it on disk
    (`wandb sync` uploads it later)."""

    def __init__(self, project: str, folder: Path, config: dict[str, Any]) -> None:
        import wandb  # optional: the wandb extra

        id_file, wandb_dir = folder / "wandb_run_id", folder / "wandb"
        resumed, had_dir = id_file.is_file(), wandb_dir.exists()
        run_id = id_file.read_text().strip() if resumed else uuid.uuid4().hex[:8]
        self.wandb = wandb
        try:
            self.run = wandb.init(project=project, dir=str(folder), config=config,
                                  name=folder.name, id=run_id, resume="allow")
        except Exception as e:  # noqa: BLE001 - any failure of the service or its login
            if not had_dir:  # leave the run folder as it was
                shutil.rmtree(wandb_dir, ignore_errors=True)
            message = " ".join(str(e).split())[:300] or type(e).__name__
            raise TrackingError(
                f"--wandb-project {project}: W&B could not start a run ({message}); log in "
                f"with `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to keep "
                f"the run on disk") from None
        if not resumed:
            id_file.write_text(run_id + "\n")
        # Records of a resumed run repeat earlier steps: plot against the trainer's step.
        self.run.define_metric("trainer/step")
        self.run.define_metric("*", step_metric="trainer/step")

    def write(self, record: dict[str, Any]) -> None:
        numbers, texts = scalars_and_texts(record)
        data: dict[str, Any] = {**numbers, "trainer/step": int(record.get("step", 0))}
        for tag, text in texts.items():
            if tag != "run/config":  # already the run's config
                data[tag] = self.wandb.Html(f"<pre>{html.escape(text)}</pre>")
        self.run.log(data)

    def close(self) -> None:
        self.run.finish()


def open_trackers(tensorboard: bool, wandb_project: str | None, folder: Path,
                  config: dict[str, Any]) -> list[Tracker]:
    """The tracking services the flags ask for, in the run folder. W&B first, the one that
    can fail (no login): its failure then leaves nothing behind."""
    trackers: list[Tracker] = []
    if wandb_project:
        trackers.append(WandbTracker(wandb_project, folder, config))
    if tensorboard:
        trackers.append(TensorBoardTracker(folder / "tensorboard"))
    return trackers


def close_trackers(trackers: Sequence[Tracker]) -> None:
    for tracker in trackers:
        with contextlib.suppress(Exception):  # a service failing at the end loses nothing local
            tracker.close()


class TrackingError(UserError):
    """A tracking service (W&B) could not start; the message says how to fix it."""


def check_tracking(tensorboard: bool, wandb_project: str | None) -> None:
    """The packages the tracking flags need, imported as open_trackers imports them,
    before any work: a one-line error naming the extra to install."""
    if tensorboard:
        extras.require(("tensorboard", "torch.utils.tensorboard"), "--tensorboard",
                       "tensorboard", "tensorboard", error=ConfigError)
    if wandb_project:
        extras.require("wandb", "--wandb-project", "wandb", "wandb", error=ConfigError)


class MetricsError(UserError):
    """The metrics log cannot be opened or written; the message names the file."""


def repair_tail(path: Path) -> str | None:
    """Make a JSONL file end on a whole line again, if it does not: a last record that
    parses but lacks its newline gets one, anything else after the last newline (a
    record torn by a crash, zeros after a power loss) is cut off, so that the next record
    starts a line of its own. Returns what was done, or None for a whole (or no) file."""
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        return None
    with fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0 or os.pread(fh.fileno(), 1, size - 1) == b"\n":
            return None
        start = size  # of the last line: just after the last newline before the end
        while start > 0:
            chunk = os.pread(fh.fileno(), min(start, 1 << 16), max(0, start - (1 << 16)))
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = start - len(chunk) + cut + 1
                break
            start -= len(chunk)
        try:
            whole = isinstance(json.loads(os.pread(fh.fileno(), size - start, start)), dict)
        except ValueError:  # not JSON, or not UTF-8
            whole = False
        if whole:
            fh.write(b"\n")
            return "its last record had no line end (a write cut short); added it"
        fh.truncate(start)
        return (f"dropped the torn end of its last record ({size - start} bytes, left by a write "
                f"that failed); the records before it are intact")


class MetricsLog:
    """Append-only JSONL file: one JSON object per line (a header record, then one per event).

    Each record is written as it comes, in one unbuffered write, so a crashed run keeps
    everything up to its last step, and a reader can tail the file while training runs.
    Every line parses, whatever fails: a write cut short (full disk, file-size limit) is
    taken back before the error is raised, and a torn record that a crash left at the end
    is completed or dropped when the log is opened again (with a note). A log made with
    enabled=False (every rank but 0) opens nothing and writes nothing, so callers need
    no rank checks.
    """

    def __init__(self, path: str | os.PathLike, enabled: bool = True,
                 trackers: Sequence[Tracker] = ()) -> None:
        self.path = Path(path)
        self._fh = None
        self.trackers = list(trackers)  # every record goes to these as well (not closed here)
        if enabled:
            try:
                note = repair_tail(self.path)
                self._fh = open(self.path, "ab", buffering=0)
            except OSError as e:
                raise MetricsError(f"{self.path}: cannot open the metrics log for appending "
                                   f"({e.strerror or e})") from None
            if note:
                print(f"note: {self.path}: {note}", file=sys.stderr)

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        data = memoryview((json.dumps(record) + "\n").encode("utf-8"))
        start = -1  # the file's size before this record
        try:
            start = os.fstat(self._fh.fileno()).st_size
            while data:
                data = data[self._fh.write(data):]
        except OSError as e:  # a full disk, a quota, a file-size limit
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError):
                if start >= 0:  # take back what part of the record got written (no space needed)
                    os.ftruncate(fh.fileno(), start)
                fh.close()
            raise MetricsError(f"{self.path}: cannot write the metrics log ({e.strerror or e}); "
                               f"the records before this one are intact") from None
        for tracker in list(self.trackers):
            try:
                tracker.write(record)
            except Exception as e:  # a tracking service must not stop training
                print(f"warning: {type(tracker).__name__} failed ({type(e).__name__}: {e}); "
                      f"it gets no more records, metrics.jsonl still does", file=sys.stderr)
                self.trackers.remove(tracker)

    def close(self) -> None:
        """Close the file; the trackers belong to whoever opened them."""
        if self._fh is not None:
            self._fh.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
