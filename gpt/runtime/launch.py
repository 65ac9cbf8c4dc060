"""A torchrun worker's launch: its place in the job from the environment, checked before
torch.distributed reads it, waiting for rank 0, and keeping torchrun's restarts apart."""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from typing import Mapping

import torch

from gpt.core.config import ConfigError
from gpt.core.errors import UserError


WORKER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # what torchrun sets for each worker
HOW_TO_LAUNCH = ("start every rank with torchrun (torchrun --standalone --nproc_per_node=N "
                 "...), or unset RANK, WORLD_SIZE and LOCAL_RANK to run in one process")


class RendezvousError(UserError):
    """The ranks of a job could not meet; the message says where and how to launch."""


@dataclass(frozen=True)
class Launch:
    """A torchrun worker's place in the job, from its environment."""

    rank: int
    local_rank: int
    world_size: int
    host: str  # MASTER_ADDR and MASTER_PORT: where rank 0 hosts the store the ranks meet in
    port: int

    @property
    def master(self) -> str:
        return f"{self.host}:{self.port}"


def launch_environment(env: Mapping[str, str]) -> Launch | None:
    """This process's place in a torchrun job, or None for a single process (none of RANK,
    WORLD_SIZE, LOCAL_RANK set). Those variables without the rest of what torchrun sets
    (a shell or job script that exports them, a copied environment) are a ConfigError
    saying what is missing and how to launch, before torch.distributed fails on them."""
    present = [k for k in WORKER_VARS if k in env]
    if not present:
        return None
    given = ", ".join(f"{k}={env[k]}" for k in present)
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ConfigError(f"{given} set without {', '.join(missing)}: not a torchrun worker's "
                          f"environment; {HOW_TO_LAUNCH}")
    numbers = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        value = env.get(key, "0")
        if not re.fullmatch(r"\s*\d+\s*", value):
            raise ConfigError(f"{key}={value!r} in the environment is not a number >= 0; "
                              f"{HOW_TO_LAUNCH}")
        numbers[key] = int(value)
    rank, world_size, port = numbers["RANK"], numbers["WORLD_SIZE"], numbers["MASTER_PORT"]
    if not rank < world_size:
        raise ConfigError(f"RANK={rank} with WORLD_SIZE={world_size}: ranks go from 0 to "
                          f"WORLD_SIZE - 1; {HOW_TO_LAUNCH}")
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is not a TCP port (1..65535); {HOW_TO_LAUNCH}")
    return Launch(rank, numbers["LOCAL_RANK"], world_size, env["MASTER_ADDR"].strip(), port)


def wait_for_master(launch: Launch, timeout_s: float) -> None:
    """Wait, up to timeout_s, until something listens at MASTER_ADDR:MASTER_PORT, else a
    RendezvousError. torch's own client retries there too, but logs a C++ stack trace to
    stderr at every retry; a plain connect that is closed at once says nothing, and the
    store does not count it as a rank."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((launch.host, launch.port),
                                          timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"rank {launch.rank} of {launch.world_size}: nothing listens at "
                    f"{launch.master} after {timeout_s:g} s (--dist-timeout; "
                    f"{e.strerror or e}), where rank 0 should be; {HOW_TO_LAUNCH}") from None
            time.sleep(0.2)


def restart_store_prefix(env: Mapping[str, str]) -> str | None:
    """A key prefix that keeps one torchrun restart's rendezvous apart from the last one's.

    torchrun's agent hosts the TCPStore that workers meet in and, since torch 2.5, keeps the
    same store across `--max-restarts` restarts without prefixing the keys. A restarted
    worker can then read the address its dead predecessor published and connect to a port
    nobody listens on: gloo times out, NCCL fails to connect (pytorch issue #135712). With
    one agent (one node) every worker has the same TORCHELASTIC_RESTART_COUNT, so it
    names the attempt. Across nodes the agents count restarts separately, so there the
    prefix would split the world; launch/multi_node.sh sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    instead, which makes the agent hand each attempt a fresh store.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        return None
    return f"gpt2-trainer/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def restart_store_warning(env: Mapping[str, str]) -> str | None:
    """The advice a multi-node torchrun job with restarts needs, where the trainer cannot
    keep restarts apart itself (see restart_store_prefix)."""
    shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if shared and restarts > 0 and env.get("GROUP_WORLD_SIZE", "1") != "1":
        return ("warning: torchrun --max-restarts across nodes reuses one rendezvous store, and a "
                "restarted worker can hang connecting to the address of the one it replaces "
                "(pytorch issue #135712); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's "
                "environment on every node (launch/multi_node.sh does)")
    return None


def check_launch_device(device: torch.device, launch: Launch | None) -> None:
    """A device a torchrun worker can join a process group from: CUDA (nccl) or the CPU
    (gloo); MPS has no backend."""
    if launch is not None and device.type == "mps":
        raise ConfigError("--device mps: multi-process training needs CUDA (nccl) or CPU (gloo)")
