"""Can a download's host be reached? Asked before each download (GPT-2's weights and
datasets from the Hugging Face hub, lm-eval's task data, the evaluations' data sets), so
that a machine without network is told so at once, in one line, rather than after a
minute or two of the libraries' retries.

The answer for the hub is "no" at once where the user said so (HF_HUB_OFFLINE,
HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE set to 1, on, yes or true: the libraries'
own switches); otherwise, for any host, a TCP connection to it (or to the proxy that
HTTPS_PROXY names for it) is tried for at most TIMEOUT_S, name lookup included, and the
host must then answer within ANSWER_S (a TLS handshake, an HTTP request's first byte, a
proxy's reply to CONNECT): a host that takes connections and never answers would hold
each of the libraries' requests until its timeout, and their retries many times over.
Each host's answer is kept for the life of the process. A host that answers may still
fail a download (a firewall, an outage): the libraries' own errors say that, and one
that stalls part-way is given up on after STALL_S without progress (within_time_limit).
An address that cannot be parsed (a port that is not a number) is a NetworkError naming
where it came from.

Where the hub is known to be out of reach, offline_hub() puts the Hugging Face libraries
in their offline mode for a while: what they have cached loads at once, and what they do
not fails at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Callable, Iterator, TypeVar

from gpt.core.errors import UserError


TIMEOUT_S = 2.0  # to connect, name lookup included
ANSWER_S = 5.0  # for the host to answer once connected (a TLS handshake takes a few round trips)
STALL_S = 60.0  # a download without progress for this long has stopped
HUB = "https://huggingface.co"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# The libraries read their offline switch once, as they are imported: these are the
# module attributes they consult at call time afterwards.
LIBRARY_SWITCHES = (("huggingface_hub.constants", "HF_HUB_OFFLINE"),
                    ("datasets.config", "HF_HUB_OFFLINE"),
                    ("datasets.config", "HF_DATASETS_OFFLINE"))
_TRUE = ("1", "ON", "YES", "TRUE")

_answers: dict[tuple[str, int], str | None] = {}  # (host, port) -> why not, or None


class NetworkError(UserError):
    """A download's address cannot be used, or its host stopped answering; the message
    names the variable, flag or host."""


def _probe(host: str, port: int, timeout_s: float, hello: bytes | None = None,
           tls: str | None = None) -> str | None:
    """None if a TCP connection to host:port opens within timeout_s and the host then
    answers within ANSWER_S (to `hello`, sent first, or to a TLS handshake for the name
    `tls`), else why not. Only silence counts against a host: one that answers with an
    error or closes the connection has answered (the download's own error will say
    more). The name lookup has no timeout of its own, so the attempt runs in a thread
    of its own that is waited for at most that long."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            outcome.append(f"{type(e).__name__}: {e.strerror or e}")
            return
        try:
            sock.settimeout(ANSWER_S)
            if tls is not None:
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # any reply
                sock = context.wrap_socket(sock, server_hostname=tls)  # the handshake
            elif hello is not None:
                sock.sendall(hello)
                sock.recv(1)
            outcome.append(None)
        except socket.timeout:
            outcome.append(f"it takes connections but does not answer (nothing in "
                           f"{ANSWER_S:g} s)")
        except OSError:  # refused, reset, a TLS error: an answer, if not a welcome one
            outcome.append(None)
        finally:
            sock.close()

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout_s + ANSWER_S + 0.5)
    return outcome[0] if outcome else f"no answer in {timeout_s + ANSWER_S:g} s"


def split_address(url: str, where: str, given: str | None = None) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) address; a NetworkError naming `where` (the
    variable or flag it came from) and what was `given` there if it cannot be parsed."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise NetworkError(f"{where}: {(given or url)!r} is not a usable address ({e}); give one "
                           f"such as https://host or http://host:8080") from None
    host = parts.hostname or url
    return parts.scheme, host, port or (80 if parts.scheme == "http" else 443)


def _proxy_for(scheme: str, host: str) -> str | None:
    proxy = urllib.request.getproxies().get(scheme or "https")
    return proxy if proxy and not urllib.request.proxy_bypass(host) else None


def unreachable(url: str, where: str = "the address") -> str | None:
    """None if `url`'s host (or the proxy for it) can be reached and answers, else why
    not, in words naming the host ("cannot connect to huggingface.co:443 (gaierror:
    ...)"). Asked once per host and process. A NetworkError naming `where`, or the proxy
    variable, where the address or the proxy's cannot be parsed."""
    scheme, target, target_port = split_address(url, where)
    proxy = _proxy_for(scheme, target)
    if proxy:
        name = next((n for n in PROXY_VARS if n.lower() in (f"{scheme}_proxy", "all_proxy")
                     and os.environ.get(n) == proxy), f"{scheme}_proxy")
        _, host, port = split_address(proxy if "://" in proxy else f"http://{proxy}", name,
                                      proxy)
        via = f" through the proxy for {target}"
        hello = (f"CONNECT {target}:{target_port} HTTP/1.1\r\nHost: {target}:{target_port}\r\n\r\n"
                 if scheme == "https" else f"HEAD {url} HTTP/1.0\r\n\r\n").encode()
        tls = None
    else:
        host, port, via = target, target_port, ""
        hello = None if scheme == "https" else f"HEAD / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode()
        tls = host if scheme == "https" else None
    if (host, port) not in _answers:
        why = _probe(host, port, TIMEOUT_S, hello, tls)
        _answers[host, port] = None if why is None else (
            f"{host}:{port}{via}: {why}" if why.startswith("it takes") else
            f"cannot connect to {host}:{port}{via} ({why})")
    return _answers[host, port]


Result = TypeVar("Result")


def within_time_limit(fn: Callable[[], Result], what: str,
                      progress: Callable[[], int] | None = None,
                      stall_s: float = STALL_S) -> Result:
    """fn() (a library's download), given up on once `stall_s` pass without progress (a
    change in progress(), polled each second; without it, stall_s in all): then a
    NetworkError naming `what`. A library's own timeouts hold each request; its retries
    multiply them, which this bounds. fn runs in a thread of its own, left behind (a
    daemon) when given up on."""
    box: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box.append((False, e))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    last, since = progress() if progress else 0, time.monotonic()
    while True:
        worker.join(min(1.0, stall_s))
        if box:
            ok, value = box[0]
            if ok:
                return value  # type: ignore[return-value]
            raise value  # type: ignore[misc]
        now = progress() if progress else 0
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= stall_s:
            raise NetworkError(f"{what}: no progress in {stall_s:g} s: the host stopped "
                               f"answering; try again later, or work offline from a local copy")


def hub_url() -> str:
    """The Hugging Face hub's address: HF_ENDPOINT where set (a mirror), else the hub."""
    return os.environ.get("HF_ENDPOINT") or HUB


PROXY_VARS = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy",
              "ALL_PROXY")


def check_addresses() -> None:
    """A NetworkError naming the variable if HF_ENDPOINT or a proxy variable holds an
    address that cannot be parsed (a port that is not a number or beyond 65535): asked
    before the Hugging Face libraries are imported, which parse them as they load and
    would fail with a traceback from deep inside."""
    if os.environ.get("HF_ENDPOINT"):
        split_address(os.environ["HF_ENDPOINT"], "HF_ENDPOINT")
    for name in PROXY_VARS:
        value = os.environ.get(name)
        if value:
            split_address(value if "://" in value else f"http://{value}", name, value)


def hub_where() -> str:
    """Where the hub's address comes from, for a message."""
    return "HF_ENDPOINT" if os.environ.get("HF_ENDPOINT") else "the hub's address"


def offline_by_choice() -> str | None:
    """The offline switch the user set, as "HF_HUB_OFFLINE=1", or None."""
    for name in OFFLINE_VARS:
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return f"{name}={os.environ[name]}"
    return None


def hub_unreachable() -> str | None:
    """None if the Hugging Face hub can be reached, else why not: the user's offline
    switch, or the connection that failed."""
    check_addresses()
    chosen = offline_by_choice()
    if chosen:
        return f"{chosen} is set"
    return unreachable(hub_url(), hub_where())


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
