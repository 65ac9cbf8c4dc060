"""Shared fixtures: the offline tokenizer cache, the tiny-shakespeare corpus, small shards."""

from __future__ import annotations

import importlib
import os
import shutil
import site
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import QUIET, SHAKESPEARE, SHARED_DATA, TINY, run_cli, write_random_shards
from tiers import torch_api

pytest_plugins = ["cuda_checks"]  # --fake-cuda, and cuda tests that must stay compiled
TIKTOKEN_CACHE = SHARED_DATA / "tiktoken_cache"
_HOME_ROOT = pytest.StashKey[Path]()


CUDA_SKIP = ("needs an NVIDIA GPU: torch.cuda.is_available() is False here; run "
             "`python -m pytest -m cuda` on a CUDA machine")


# Two tiers. `python -m pytest` runs the fast one: every test not marked slow (minutes).
# `python -m pytest --slow` runs both, `-m slow` the slow one alone; any -m expression
# chooses for itself (`-m "not slow"` is the fast tier again), and a test named on the
# command line (FILE::TEST) runs whatever its tier.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (the longer end-to-end tier); "
                          "-m slow runs those alone")


def _named(config: pytest.Config) -> list[str]:
    """The node ids named on the command line (FILE::TEST...), relative to the rootdir."""
    out = []
    for arg in config.args:
        if "::" not in arg:
            continue
        path, _, rest = arg.partition("::")
        try:
            path = Path(path).resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            pass
        out.append(f"{path}::{rest}")
    return out


def _fast_tier(config: pytest.Config) -> bool:
    return not config.getoption("--slow") and not config.option.markexpr


def pytest_report_header(config: pytest.Config) -> str:
    if _fast_tier(config):
        return ("tier: fast (tests marked slow are left out: `--slow` adds them, `-m slow` "
                "runs them alone)")
    return f"tier: {'all tests' if config.getoption('--slow') else '-m ' + config.option.markexpr}"


_BUSY = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)  # around pytest's own: after its header
def pytest_sessionstart(session: pytest.Session):
    """The busy machine's note, once, at any verbosity (-q hides the header)."""
    result = yield
    note = session.config.stash.get(_BUSY, None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if note and reporter is not None:
        reporter.write_line(note)
    return result


def busy_note(env: dict[str, str], workers: int) -> str | None:
    """One line where other processes already hold the cores the suite's workers will use
    (gpt/runtime/machine_load.py's judgement, as the trainer makes it at a run's start):
    the tests then take longer than on an idle machine. None on a quiet machine, where
    the load cannot be read, or with GPT2_TRAINER_IGNORE_LOAD set."""
    from gpt.runtime import machine_load

    load = machine_load.read_load(env)
    if load is None:
        return None
    given = env.get("OMP_NUM_THREADS", "")
    threads = (int(given) if given.isdigit() and int(given) > 0 else
               max(1, load.cores // workers) if workers > 1 else load.threads)  # as configured below
    load = machine_load.Load(load.average, load.cores, threads, max(1, workers))
    if not machine_load.busy(load):
        return None
    return (f"note: the machine is busy: {load.describe()} (the suite's "
            f"{'workers' if workers > 1 else 'process'}); the tests "
            f"wait for the cores other processes hold and take longer than on an idle "
            f"machine (README section 1 gives an idle machine's time)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under -m torch_api, the tests that reach one of torch's moving parts are marked so;
    the fast tier leaves the slow tests out; tests marked cuda are skipped, with the reason, where there
    is no GPU."""
    if "torch_api" in config.option.markexpr:  # tests/tiers.py's rule (a second to apply)
        for item in items:
            if torch_api(Path(str(item.fspath)), getattr(item, "originalname", item.name)):
                item.add_marker(pytest.mark.torch_api)
    if _fast_tier(config):
        named = _named(config)
        keep, slow = [], []
        for item in items:
            explicit = any(item.nodeid == n or item.nodeid.startswith((n + "[", n + "::"))
                           for n in named)
            (slow if "slow" in item.keywords and not explicit else keep).append(item)
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = keep

    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# The tests, and every process they start, have a home of their own: HOME and every place
# the package and the libraries it drives (datasets, lm-eval, matplotlib, W&B, Triton)
# would write under it, pointed into one temporary folder for the whole test run, so they
# never write into the user's ~/.cache or ~/.config. Set before any of those libraries is
# imported (datasets reads its cache path at import), and inherited by every subprocess a
# test starts (pytest-xdist's workers too). What other processes on the machine do to the
# real home is none of the suite's business; a test that leaves these variables changed
# fails the run (pytest_sessionfinish).
HOME_WRITES = {
    "HOME": "home",                   # ~ itself: Path.home(), expanduser, any library's default
    "XDG_CACHE_HOME": "cache",        # gpt.eval.hellaswag's downloads, and most libraries'
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "HF_HOME": "huggingface",
    "HF_DATASETS_CACHE": "huggingface/datasets",  # lm-eval's tasks, read through datasets
    "MPLCONFIGDIR": "matplotlib",
    "TRITON_CACHE_DIR": "triton",
    "WANDB_DIR": "wandb",
    "WANDB_CONFIG_DIR": "wandb/config",
    "WANDB_CACHE_DIR": "wandb/cache",
    "WANDB_DATA_DIR": "wandb/data",
}
# The machine's load, which the trainer warns of on a CPU (gpt/runtime/machine_load.py), is
# left out: the tests' output must not depend on what else the machine runs.
QUIET_ENV = {"GPT2_TRAINER_IGNORE_LOAD": "1"}


def pytest_configure(config: pytest.Config) -> None:
    # tiktoken downloads its BPE files unless they are cached; offline machines (CI
    # here) have them under shared/data. Subprocesses inherit this too.
    if TIKTOKEN_CACHE.is_dir() and "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
    root = Path(tempfile.mkdtemp(prefix="gpt2-trainer-tests-home-"))
    config.stash[_HOME_ROOT] = root
    # packages installed with pip --user stay importable by the subprocesses: Python finds
    # them under the home, which is about to move (set once, by the first process)
    os.environ.setdefault("PYTHONUSERBASE", site.getuserbase())
    for name, sub in HOME_WRITES.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(root / sub)
    if not hasattr(config, "workerinput"):  # said once, by the process that reports
        workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin(
            "xdist") else None
        count = (os.cpu_count() or 1) if workers in ("auto", "logical") else workers or 1
        note = busy_note(dict(os.environ), int(count))
        if note:
            config.stash[_BUSY] = note
    os.environ.update(QUIET_ENV)
    _start_recording(root)
    # Under pytest-xdist (the dev extra; `-n auto` in pyproject.toml) each worker, and each
    # trainer it starts, gets its share of the cores: N workers each running torch on every
    # core would oversubscribe them. Set before torch sizes its thread pool.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    moved = home_moved(session.config.stash.get(_HOME_ROOT, None))
    if moved:
        print(f"\na test changed the environment and did not put it back: {'; '.join(moved)}; "
              "the tests after it wrote outside their own home (a test sets a variable "
              "with monkeypatch.setenv, which restores it)", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _record_imports()
    if not hasattr(session.config, "workerinput") and _whole_tier(session.config):
        _check_imports(session)


# Every module of gpt/ must be imported by the fast tier: by a test's own process or by a
# process one starts (the trainer, torchrun's ranks, `python -m gpt.x`). Each process of the
# run writes the gpt modules it imported into one folder at its end: pytest's (the xdist
# workers' too) from here, the others from a sitecustomize.py on the PYTHONPATH they
# inherit. A run of a whole tier (no file, test or -k chosen) fails when one is missing.
# The same sitecustomize.py carries --fake-cuda's fake into those processes.
IMPORTS = "GPT2_TRAINER_TESTS_IMPORTS"
RECORDER = """import atexit, os, sys

_fake = os.environ.get("GPT2_TRAINER_FAKE_CUDA")
if _fake:  # --fake-cuda (tests/cuda_checks.py), carried into every process the tests start
    import importlib.util

    _spec = importlib.util.spec_from_file_location("gpt2_trainer_fake_cuda", _fake)
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install()


def _record():
    folder = os.environ.get("GPT2_TRAINER_TESTS_IMPORTS")
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    names = [m for m in [*sys.modules, getattr(main, "name", "")] if m.split(".")[0] == "gpt"]
    if folder and os.path.isdir(folder) and names:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as f:
            f.write("\\n".join(sorted(set(names))))


atexit.register(_record)
"""


def _start_recording(root: Path) -> None:
    if IMPORTS in os.environ:  # an xdist worker: the controller's folder
        return
    folder = root / "imports"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(RECORDER)
    os.environ[IMPORTS] = str(folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


def home_moved(root: Path | None) -> list[str]:
    """The home variables that no longer point where this process set them, each as
    NAME=value (a test that changed one and did not restore it)."""
    if root is None:
        return []
    return [f"{name}={os.environ.get(name, '(unset)')}" for name, sub in HOME_WRITES.items()
            if os.environ.get(name) != str(root / sub)]


def _record_imports() -> None:
    folder = Path(os.environ.get(IMPORTS, ""))
    names = {m for m in sys.modules if m.split(".")[0] == "gpt"}
    if folder.is_dir() and names:
        (folder / f"{os.getpid()}.txt").write_text("\n".join(sorted(names)))


def _whole_tier(config: pytest.Config) -> bool:
    """Whether this run is a whole tier: the test paths pytest.ini names, no -k, no node."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.option.keyword and not config.getoption("deselect", None)
            and not config.getoption("lf", False) and config.option.markexpr in ("", "not slow"))


def _check_imports(session: pytest.Session) -> None:
    if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return
    package = Path(__file__).resolve().parent.parent / "gpt"
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(
        ".__init__") for p in package.rglob("*.py")}
    seen = set()
    for f in Path(os.environ[IMPORTS]).glob("*.txt"):
        seen |= set(f.read_text().split())
    unseen = sorted(modules - seen)
    excused = {name: why for name in unseen if (why := _extra_missing(name))}
    missing = [name for name in unseen if name not in excused]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        end_progress_line(reporter)
        reporter.write_line(
            f"the package's modules this run imported: {len(modules & seen)} of {len(modules)}"
            + (f"; never: {', '.join(missing)}" if missing else "")
            + (f"; cannot import here, for a missing extra: "
               f"{', '.join(f'{n} ({why})' for n, why in excused.items())}" if excused else ""))
    if missing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def end_progress_line(reporter: Any) -> None:
    """End the progress line ("....  [100%]") where it is still open: pytest ends it only
    after the session's own finishing hooks, so a line written from one would be glued
    to it."""
    reporter.ensure_newline()
    if getattr(reporter, "_width_of_current_line", 1):
        reporter.write("\n")


def _extra_missing(module: str) -> str | None:
    """The third-party package whose absence stops `module` importing here (gpt.eval.harness
    imports lm_eval: an extra, whose tests skip without it), else None: a module that
    imports was simply never reached."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        top = (e.name or "gpt").split(".")[0]
        if top != "gpt":
            return top
    except Exception:  # noqa: BLE001 - any other failure: counted as never imported
        pass
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_HOME_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def restore_global_flags():
    """Put torch's process-wide numerics switches back after every test: a test that turns
    TF32 on (the trainer does, on CUDA) must not loosen later exact comparisons."""
    import torch

    from gpt.core.compat import set_tf32, tf32_switches

    cudnn = torch.backends.cudnn
    saved = (tf32_switches(), cudnn.benchmark, torch.get_float32_matmul_precision(),
             torch.are_deterministic_algorithms_enabled())
    yield
    set_tf32(*saved[0])
    cudnn.benchmark = saved[1]
    torch.set_float32_matmul_precision(saved[2])
    torch.use_deterministic_algorithms(saved[3])


@pytest.fixture(autouse=True)
def network_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches the network: every host answers, as far as gpt/core/network.py's
    probe is told (the tests stand in for the downloads themselves), and no answer is
    kept from one test to the next. A test of a machine without network stands in for
    the probe with one that fails (tests/core/test_network.py)."""
    from gpt.core import network

    monkeypatch.setattr(network, "_probe", lambda host, port, timeout_s, *how: None)
    monkeypatch.setattr(network, "_answers", {})


@pytest.fixture(scope="session")
def enc():
    """The GPT-2 tokenizer (tiktoken's cache, else the files the package ships)."""
    from gpt.data.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def shakespeare_tokens(request: pytest.FixtureRequest) -> np.ndarray:
    """GPT-2 tokens of tiny shakespeare (uint16), from the corpus the package ships."""
    enc = request.getfixturevalue("enc")
    ids = enc.encode_ordinary(SHAKESPEARE.read_text(encoding="utf-8"))
    return np.asarray([enc.eot_token, *ids], dtype=np.uint16)


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory: pytest.TempPathFactory, shakespeare_tokens: np.ndarray) -> Path:
    """A data folder with tiny shakespeare: val = first 20k tokens, train = the rest in 2 shards."""
    from gpt.data.shards import write_shard

    out = tmp_path_factory.mktemp("shakespeare")
    val, train = shakespeare_tokens[:20_000], shakespeare_tokens[20_000:]
    half = len(train) // 2
    write_shard(out / "val_000000.bin", val)
    write_shard(out / "train_000000.bin", train[:half])
    write_shard(out / "train_000001.bin", train[half:])
    return out


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str, build) -> Path:
    """A folder built once for the whole test run, by whichever process asks first: under
    pytest-xdist the workers share pytest's base temporary folder's parent, and a file lock
    there makes the others wait for the first one's build and then read it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's, shared by its workers
    folder = base / f"shared-{name}"
    with FileLock(str(folder) + ".lock"):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / "done").touch()
    return folder


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' data folder: random shards (two train, one val), built once for the whole
    test run and shared by its workers; four_step_run trained on it, so a copy of that run
    resumes on it. Tests read it and never write into it (random_data_dir is a test's own)."""
    return _shared(tmp_path_factory, "data", lambda folder: write_random_shards(
        folder, seed=5, train=(9_000, 9_000), val=(3_000,)))


@pytest.fixture(scope="session")
def four_step_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run with ckpt_000002.pt and ckpt_000004.pt, trained once per test run
    (shared by the xdist workers); tests that write into it take run_copy."""
    def train(folder: Path) -> None:
        proc = run_cli(*TINY, *QUIET, "--total-batch-tokens", "512", "--max-steps", "4",
                       "--checkpoint-every", "2", "--data-dir", str(data_dir),
                       "--out-dir", str(folder / "run"))
        assert proc.returncode == 0, proc.stderr

    return _shared(tmp_path_factory, "four_run", train) / "run"


@pytest.fixture()
def run_copy(four_step_run: Path, tmp_path: Path) -> Path:
    """A private copy of four_step_run."""
    return Path(shutil.copytree(four_step_run, tmp_path / "run"))


@pytest.fixture()
def random_data_dir(tmp_path: Path) -> Path:
    """Synthetic shards of random token ids (no tokenizer needed)."""
    return write_random_shards(tmp_path, seed=0, train=(30_000,), val=(5_000,))


@pytest.fixture(autouse=True)
def no_launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No torchrun worker variables in this process's environment, for every test (a trainer
    run in-process is one process, whatever launched pytest); the monkeypatch, for a test
    that sets some again."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hugging Face libraries (datasets, the hub) in their offline mode, as on a machine
    without network: the tests' tasks and models are local."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def graph_backend(monkeypatch: pytest.MonkeyPatch):
    """torch.compile through aot_eager (the graphs and recompiles of inductor, without its
    code generation), counting the frames compiled; graph breaks counted by dynamo
    (helpers.graph_breaks)."""
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    from gpt.engine import parallel

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(parallel, "COMPILE_BACKEND", counter)
    yield counter
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def trained(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint the trainer wrote, ckpt_000001.pt: one step of a tiny model, trained once
    per test run (shared by the xdist workers), to read, never to write."""
    def train(folder: Path) -> None:
        proc = run_cli(*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir),
                       "--out-dir", str(folder / "run"))
        assert proc.returncode == 0, proc.stderr

    return _shared(tmp_path_factory, "one_step", train) / "run" / "ckpt_000001.pt"
