"""Every metrics record also in TensorBoard or Weights & Biases (the tensorboard and wandb
extras), and the check that the one asked for can start."""

from __future__ import annotations

import contextlib
import html
import json
import math
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from gpt.core import extras
from gpt.core.config import ConfigError
from gpt.core.errors import UserError


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
