"""Can a download's host be reached? Asked before each download (GPT-2's weights and
datasets from the Hugging Face hub, lm-eval's task data, the evaluations' data sets), so
that a machine without network is told so at once, in one line, rather than after a
minute or two of the libraries' retries.

The answer for the hub is "no" at once where the user said so (HF_HUB_OFFLINE,
HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE set to 1, on, yes or true: the libraries'
own switches); otherwise, for any host, a TCP connection to it (or to the proxy that
HTTPS_PROXY names for it) is tried for at most TIMEOUT_S, name lookup included. Each
host's answer is kept for the life of the process. A host that answers may still fail a
download (a firewall, an outage): the libraries' own errors say that.

Where the hub is known to be out of reach, offline_hub() puts the Hugging Face libraries
in their offline mode for a while: what they have cached loads at once, and what they do
not fails at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import urllib.parse
import urllib.request
from typing import Iterator


TIMEOUT_S = 2.0
HUB = "https://huggingface.co"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# The libraries read their offline switch once, as they are imported: these are the
# module attributes they consult at call time afterwards.
LIBRARY_SWITCHES = (("huggingface_hub.constants", "HF_HUB_OFFLINE"),
                    ("datasets.config", "HF_HUB_OFFLINE"),
                    ("datasets.config", "HF_DATASETS_OFFLINE"))
_TRUE = ("1", "ON", "YES", "TRUE")

_answers: dict[tuple[str, int], str | None] = {}  # (host, port) -> why not, or None


def _probe(host: str, port: int, timeout_s: float) -> str | None:
    """None if a TCP connection to host:port opens within timeout_s, else why not. The
    name lookup has no timeout of its own, so the attempt runs in a thread of its own
    that is waited for at most timeout_s."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{type(e).__name__}: {e.strerror or e}")

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    return outcome[0] if outcome else f"no answer in {timeout_s:g} s"


def unreachable(url: str) -> str | None:
    """None if `url`'s host (or the proxy for it) can be reached, else why not, in words
    naming the host ("cannot connect to huggingface.co:443 (gaierror: ...)"). Asked once
    per host and process."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (80 if parts.scheme == "http" else 443)
    proxy = urllib.request.getproxies().get(parts.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        via, host, port = f" through the proxy for {parts.hostname}", p.hostname or host, p.port or 80
    else:
        via = ""
    if (host, port) not in _answers:
        why = _probe(host, port, TIMEOUT_S)
        _answers[host, port] = None if why is None else f"cannot connect to {host}:{port}{via} ({why})"
    return _answers[host, port]


def hub_url() -> str:
    """The Hugging Face hub's address: HF_ENDPOINT where set (a mirror), else the hub."""
    return os.environ.get("HF_ENDPOINT") or HUB


def offline_by_choice() -> str | None:
    """The offline switch the user set, as "HF_HUB_OFFLINE=1", or None."""
    for name in OFFLINE_VARS:
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return f"{name}={os.environ[name]}"
    return None


def hub_unreachable() -> str | None:
    """None if the Hugging Face hub can be reached, else why not: the user's offline
    switch, or the connection that failed."""
    chosen = offline_by_choice()
    if chosen:
        return f"{chosen} is set"
    return unreachable(hub_url())


@contextlib.contextmanager
def offline_hub() -> Iterator[None]:
    """The Hugging Face libraries in their offline mode while this lasts, as if
    HF_HUB_OFFLINE=1 had been set: their environment variables, and the switches of those
    already imported (import them first: one imported inside keeps the mode). Restored
    after."""
    saved_env = {name: os.environ.get(name) for name in OFFLINE_VARS[:2]}
    saved_attrs = []
    for module_name, attr in LIBRARY_SWITCHES:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attr):
            saved_attrs.append((module, attr, getattr(module, attr)))
            setattr(module, attr, True)
    os.environ.update({name: "1" for name in saved_env})
    try:
        yield
    finally:
        for module, attr, value in saved_attrs:
            setattr(module, attr, value)
        for name, old in saved_env.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
