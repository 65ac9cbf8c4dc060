"""A machine without network is told so at once (gpt/core/network.py), before each download:
GPT-2's weights and datasets from the Hugging Face hub, fineweb.py's stream, lm-eval's task
data, HellaSwag's validation set; and what is cached still loads. The probe is stood in
for (tests/conftest.py: no test touches the network): here, with one that fails."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

import pytest

from gpt.core import network

from helpers import QUIET, TINY, run_cli, served_folder, silent_host, write_random_shards

NO_NETWORK = "gaierror: Name or service not known"
REAL_PROBE = network._probe  # conftest's stand-in replaces it in every test


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """No host answers; the hosts asked, in order."""
    asked: list[tuple[str, int]] = []

    def probe(host: str, port: int, timeout_s: float, *how: object) -> str:
        asked.append((host, port))
        return NO_NETWORK

    monkeypatch.setattr(network, "_probe", probe)
    for name in (*network.OFFLINE_VARS, "HF_ENDPOINT", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for module, attr in network.LIBRARY_SWITCHES:  # as if imported without a switch set
        if module in sys.modules:
            monkeypatch.setattr(sys.modules[module], attr, False)
    return asked


def test_each_host_is_asked_once_and_the_answer_names_it(offline, monkeypatch) -> None:
    why = network.unreachable("https://huggingface.co/api/x")
    assert why == f"cannot connect to huggingface.co:443 ({NO_NETWORK})"
    assert network.hub_unreachable() == why  # the same host: kept, not asked again
    assert offline == [("huggingface.co", 443)]
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    assert "mirror.example:8080" in network.hub_unreachable()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert network.unreachable("https://raw.githubusercontent.com/x") == (
        "cannot connect to proxy.example:3128 through the proxy for raw.githubusercontent.com "
        f"({NO_NETWORK})")
    assert offline[-1] == ("proxy.example", 3128)


def test_the_users_offline_switch_answers_without_asking(offline, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert network.hub_unreachable() == "HF_HUB_OFFLINE=1 is set"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")
    assert network.hub_unreachable() == "TRANSFORMERS_OFFLINE=yes is set"
    assert offline == []


def test_a_real_probe_of_a_closed_port_answers_within_its_timeout() -> None:
    """The probe itself, on this machine: a port nothing listens on refuses at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: a connection is refused
        why = REAL_PROBE("127.0.0.1", port, 1.0)
    assert why is not None and "ConnectionRefusedError" in why


@pytest.fixture()
def real_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe, on the loopback, with a short wait for an answer; no proxy, no
    offline switch, nothing kept from before."""
    monkeypatch.setattr(network, "_probe", REAL_PROBE)
    monkeypatch.setattr(network, "ANSWER_S", 0.5)
    for name in (*network.OFFLINE_VARS, "HF_ENDPOINT", "HTTPS_PROXY", "https_proxy",
                 "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
def test_a_host_that_takes_connections_and_never_answers_is_told_at_once(
        real_probe, monkeypatch, tmp_path, capsys) -> None:
    """A hub mirror, a HellaSwag address or a proxy that accepts and stays silent: one
    line within the probe's waits, not the libraries' timeouts and retries (minutes)."""
    import time

    from gpt.checkpoint import weights
    from gpt.checkpoint.model_load import PretrainedError
    from gpt.eval import hellaswag
    from gpt.generate import main as generate_main

    with silent_host() as (host, port):
        for scheme in ("http", "https"):  # an HTTP request, a TLS handshake: no reply
            network._answers.clear()
            monkeypatch.setenv("HF_ENDPOINT", f"{scheme}://{host}:{port}")
            start = time.monotonic()
            with pytest.raises(PretrainedError, match=rf"the hub cannot be reached \({host}:"
                               rf"{port}: it takes connections but does not answer \(nothing "
                               rf"in 0\.5 s\)\)"):
                weights.download("gpt2", tmp_path / "hub")
            assert time.monotonic() - start < 10
        network._answers.clear()
        assert generate_main(["--init-from", "gpt2", "--prompt", "hi", "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "it takes connections but does not answer" in err
        monkeypatch.delenv("HF_ENDPOINT")
        with pytest.raises(hellaswag.HellaSwagError, match="it takes connections but does not "
                           "answer"):
            hellaswag.check_reachable(f"http://{host}:{port}/hs.jsonl", tmp_path / "hs")
        network._answers.clear()
        monkeypatch.setenv("HTTPS_PROXY", f"http://{host}:{port}")  # a proxy that never replies
        assert network.hub_unreachable() == (
            f"{host}:{port} through the proxy for huggingface.co: it takes connections but does "
            f"not answer (nothing in 0.5 s)")


def test_a_host_that_answers_is_reachable(real_probe, tmp_path) -> None:
    """Any answer counts: an HTTP server's reply (an error too)."""
    with served_folder(tmp_path) as base:
        assert network.unreachable(f"{base}/missing.jsonl") is None


def test_a_download_that_stops_making_progress_is_given_up_on_in_one_line() -> None:
    """Past the probe, a host can still stall a download: the library's retries are
    bounded by the time without progress, not left to run for minutes."""
    import threading
    import time

    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(network.NetworkError, match=r"^downloading x: no progress in 0\.5 s: "
                       r"the host stopped answering"):
        network.within_time_limit(lambda: release.wait(30), "downloading x", stall_s=0.5)
    assert time.monotonic() - start < 5
    release.set()
    ticks = iter(range(10**6))  # progress all along: waited for to the end
    assert network.within_time_limit(lambda: time.sleep(2) or "done", "x",
                                      progress=lambda: next(ticks), stall_s=0.5) == "done"
    with pytest.raises(KeyError):  # the download's own error, raised as it was
        network.within_time_limit(lambda: {}["k"], "x", stall_s=5)


BAD_ADDRESS = "is not a usable address"


@pytest.mark.slow
@pytest.mark.parametrize("env,command,words", [
    ({"HTTPS_PROXY": "http://proxy:notaport"}, ["train", "--init-from", "gpt2", "--dry-run"],
     "HTTPS_PROXY: 'http://proxy:notaport' is not a usable address (Port could not be cast"),
    ({"HTTPS_PROXY": "http://proxy:notaport"}, ["train", "--init-from", "gpt2"],
     "HTTPS_PROXY: 'http://proxy:notaport' is not a usable address"),
    ({}, ["train", "--hellaswag-every", "1", "--hellaswag-file",
          "http://127.0.0.1:99999/hs.jsonl", "--dry-run"],
     "--hellaswag-file: 'http://127.0.0.1:99999/hs.jsonl' is not a usable address (Port out "
     "of range"),
    ({}, ["evaluate", "--hellaswag", "https://[::1/hs.jsonl"],
     "--hellaswag: 'https://[::1/hs.jsonl' is not a usable address (Invalid IPv6 URL)"),
    ({"HF_ENDPOINT": "http://host:badport"}, ["generate", "--init-from", "gpt2"],
     "HF_ENDPOINT: 'http://host:badport' is not a usable address"),
    ({"http_proxy": "proxy:99999"}, ["train", "--init-from", "gpt2", "--dry-run"],
     "http_proxy: 'proxy:99999' is not a usable address (Port out of range"),
], ids=["proxy-dry-run", "proxy-run", "hellaswag-port", "hellaswag-ipv6", "endpoint",
        "http-proxy"])
def test_a_malformed_address_is_one_line_naming_its_variable_or_flag(
        env, command, words, tmp_path, four_step_run, monkeypatch, capsys, no_launch_env) -> None:
    from gpt.entry import train_main
    from gpt.evaluate import main as evaluate_main
    from gpt.generate import main as generate_main

    for name in (*network.PROXY_VARS, "HF_ENDPOINT", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    kind, *flags = command
    if kind == "train":
        (tmp_path / "data").mkdir()
        data = write_random_shards(tmp_path / "data", seed=0, train=(10_000,))
        code = train_main([*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data),
                           "--out-dir", str(tmp_path / "run"), *flags])
    elif kind == "evaluate":
        code = evaluate_main(["--checkpoint", str(four_step_run / "ckpt_000004.pt"),
                              "--device", "cpu", *flags])
    else:
        code = generate_main([*flags, "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert line.startswith(f"error: {words}"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_malformed_hub_address_is_named_before_the_library_fails_to_import_on_it(
        tmp_path) -> None:
    """huggingface_hub parses HF_ENDPOINT as it is imported: in a fresh process, the
    variable is named before that import."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in network.PROXY_VARS}
    proc = subprocess.run([sys.executable, "-m", "gpt.generate", "--init-from", "gpt2",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300,
                          env={**env, "HF_ENDPOINT": "http://host:badport",
                               "HF_HUB_CACHE": str(tmp_path)})
    assert proc.returncode == 1 and proc.stderr.startswith(
        "error: HF_ENDPOINT: 'http://host:badport' is not a usable address"), proc.stderr


def test_the_libraries_offline_mode_is_set_and_put_back() -> None:
    import datasets.config
    import huggingface_hub.constants

    before = (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE,
              os.environ.get("HF_HUB_OFFLINE"))
    with network.offline_hub():
        assert huggingface_hub.constants.is_offline_mode() and datasets.config.HF_HUB_OFFLINE
        assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE,
            os.environ.get("HF_HUB_OFFLINE")) == before


# ---- GPT-2's weights (--init-from gpt2, python -m gpt.generate --init-from, ...)


def cached_gpt2(cache: Path, files: dict[str, bytes]) -> Path:
    """A Hugging Face cache holding openai-community/gpt2's `files` at one revision."""
    repo = cache / "models--openai-community--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    return snapshot


def test_gpt2s_weights_offline_come_from_the_cache_or_one_line(offline, tmp_path) -> None:
    from gpt.checkpoint import weights
    from gpt.checkpoint.model_load import PretrainedError

    with pytest.raises(PretrainedError) as e:
        weights.download("gpt2", tmp_path / "empty")
    assert str(e.value) == (
        f"--init-from gpt2: not in the Hugging Face cache, and the hub cannot be reached "
        f"(cannot connect to huggingface.co:443 ({NO_NETWORK})): download it once with "
        f"network, or pass a local folder with config.json and model.safetensors")
    snapshot = cached_gpt2(tmp_path / "cache", {"config.json": b"{}",
                                                "model.safetensors": b"x"})
    assert weights.download("gpt2", tmp_path / "cache") == snapshot  # cached: still works
    only_config = cached_gpt2(tmp_path / "half", {"config.json": b"{}"}).parent.parent.parent
    with pytest.raises(PretrainedError, match="not in the Hugging Face cache"):
        weights.download("gpt2", only_config)


def test_the_trainer_with_init_from_gpt2_offline_stops_in_one_line(offline, tmp_path,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    proc = run_cli(*TINY, *QUIET, "--init-from", "gpt2", "--data-dir", str(tmp_path),
                   "--out-dir", str(tmp_path / "run"), "--dry-run")
    assert proc.returncode != 0
    assert "error: --init-from gpt2: not in the Hugging Face cache, and the hub cannot be " \
        "reached (cannot connect to huggingface.co:443" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- fineweb.py's Hugging Face sources


def test_a_stream_offline_is_refused_at_once_and_a_download_is_read_from_the_cache(
        offline, tmp_path, monkeypatch) -> None:
    import datasets

    from gpt.data.prepare import PrepareConfig, PrepareError, prepare

    modes: list[bool] = []

    def stand_in(*a, **k):  # what the library does in its offline mode: the cache alone
        modes.append(datasets.config.HF_HUB_OFFLINE)
        if k.get("streaming"):
            pytest.fail("a stream was started without network")
        return [{"text": "cached words " * 50}] * 40

    monkeypatch.setattr(datasets, "load_dataset", stand_in)
    with pytest.raises(PrepareError) as e:
        prepare(PrepareConfig(("someone/corpus",), str(tmp_path / "s"), streaming=True,
                              progress=False))
    assert str(e.value).startswith("--source someone/corpus --streaming: streaming reads the "
                                   "Hugging Face hub, which cannot be reached (cannot connect "
                                   "to huggingface.co:443")
    result = prepare(PrepareConfig(("someone/corpus",), str(tmp_path / "d"), val_tokens=100,
                                   progress=False), log=io.StringIO())
    assert result.tokens > 0 and modes == [True]  # loaded in the offline mode: from the cache
    assert not datasets.config.HF_HUB_OFFLINE  # the mode put back as it was

    def not_cached(*a, **k):
        raise ConnectionError("Couldn't reach 'someone/corpus' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", not_cached)
    with pytest.raises(PrepareError, match=r"--source someone/corpus: not in Hugging Face "
                       r"datasets' cache .* and the hub cannot be reached"):
        prepare(PrepareConfig(("someone/corpus",), str(tmp_path / "n"), progress=False))


# ---- lm-eval's task data


def test_a_hub_task_offline_loads_from_the_cache_in_offline_mode_or_says_so(offline, tmp_path,
                                                                              monkeypatch) -> None:
    pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')
    import datasets

    from gpt.eval import harness_tasks

    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: no-such-org/no-such-dataset\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
        "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n")
    modes: list[bool] = []
    real = datasets.load_dataset

    def spy(*a, **k):
        modes.append(datasets.config.HF_HUB_OFFLINE)
        return real(*a, **k)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    _, failed = harness_tasks.load_tasks(["hub_task"], str(tmp_path))
    assert modes and all(modes)  # the library was told: no retries, the cache alone
    assert failed == [
        f"task hub_task: its data could not be loaded: it is not in Hugging Face datasets' "
        f"cache ({harness_tasks.data_home()}, HF_DATASETS_CACHE) and the Hub cannot be "
        f"reached (cannot connect to huggingface.co:443 ({NO_NETWORK})): run once with network"]


def test_gpt_evaluate_offline_names_the_task_it_cannot_load_in_one_line(
        offline, tmp_path, four_step_run, capsys) -> None:
    pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')
    from gpt.evaluate import main as evaluate_main

    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: no-such-org/no-such-dataset\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
        "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n")
    code = evaluate_main(["--checkpoint", str(four_step_run / "ckpt_000004.pt"), "--tasks",
                          "hub_task", "--include-path", str(tmp_path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "task hub_task: its data could not be loaded: it is not in Hugging Face datasets' " \
        "cache" in err and "cannot connect to huggingface.co:443" in err


# ---- HellaSwag's validation set


def test_hellaswags_download_offline_is_one_line_at_once_and_a_cached_copy_is_used(
        offline, tmp_path, monkeypatch, no_launch_env) -> None:
    from gpt.eval import hellaswag

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=0, train=(10_000,))
    flags = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data), "--hellaswag-every", "1"]
    for dry in (["--dry-run"], []):
        proc = run_cli(*flags, "--out-dir", str(tmp_path / "run"), *dry)
        assert proc.returncode != 0
        assert f"error: HellaSwag: {hellaswag.VAL_URL}: it is not cached at " \
            f"{hellaswag.default_cache_dir() / 'hellaswag_val.jsonl'}, and it cannot be " \
            f"downloaded (cannot connect to raw.githubusercontent.com:443 ({NO_NETWORK})): pass a local " \
            f"copy with --hellaswag-file FILE, or go online" in proc.stderr
        assert not (tmp_path / "run").exists()  # before anything was made
    with pytest.raises(hellaswag.HellaSwagError, match="--hellaswag FILE to python -m "
                       "gpt.evaluate, --hellaswag-file FILE, or go online"):
        hellaswag.fetch(hellaswag.VAL_URL)  # gpt.evaluate's download, in one line too
    cached = hellaswag.cached_path(hellaswag.VAL_URL)
    cached.parent.mkdir(parents=True)
    cached.write_text("{}\n")  # not the official file: not a cached copy of it
    with pytest.raises(hellaswag.HellaSwagError, match="is not HellaSwag's validation set"):
        hellaswag.check_reachable(None)
    proc = run_cli(*flags, "--out-dir", str(tmp_path / "run"), "--dry-run")  # nor the trainer's
    assert proc.returncode != 0 and f"the copy at {cached} is not HellaSwag's validation set" \
        in proc.stderr
    from gpt.eval import hellaswag_source  # the official file's identity made this file's

    monkeypatch.setattr(hellaswag_source, "VAL_BYTES", 3)
    monkeypatch.setattr(hellaswag_source, "VAL_SHA256",
                        hashlib.sha256(b"{}\n").hexdigest())
    monkeypatch.setattr(hellaswag_source, "_identified", {})
    hellaswag.check_reachable(None)  # cached: no network needed
    assert hellaswag.fetch(hellaswag.VAL_URL) == cached
