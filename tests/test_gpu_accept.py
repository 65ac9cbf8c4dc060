"""The GPU acceptance command's plumbing, on the CPU: the session plan (--plan) fits its
budget with the riskiest cells first; every stage in --smoke mode writes the schema the GPU
stages will; a cell's timeout kills its whole process group; trainer cells write no
checkpoint and record the memory planner's prediction beside the measured peak; and the
build-nanogpt harness patches, runs and parses a stand-in script written here in the shape of
the real one, whose figures make the ours / baseline column, or fails the stage when missing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.bench import gpu, gpu_plan, gpu_results, nanogpt, runs
from gpt.bench.cli import main as bench_main
from gpt.shards import write_shard
from gpt.tokenizer import ASSETS

CELL_KEYS = {"name", "kind", "params", "status", "estimate_s"}
FIGURES = {"step_ms", "tokens_per_s_median", "mfu_median", "compile_s_estimate", "final_loss",
           "losses", "tokens_per_step", "warmup_steps_excluded"}
SMOKE = gpu_plan.Sizes.make(smoke=True)


# ---------------------------------------------------------------------------------------
# the plan


def test_plan_fits_each_session_riskiest_first(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("--plan ran a cell")

    monkeypatch.setattr(gpu, "run_group", refuse)
    monkeypatch.setattr(gpu, "run_stage", refuse)
    assert bench_main(["gpu", "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    calls, sessions = plan["calls"], plan["sessions"]
    assert (plan["budget_s"], plan["session_limit_s"]) == (870, 900) and "not measured" in plan["estimates"]
    # calls numbered in the plan's order, session by session; every stage once
    assert [c["call"] for c in calls] == list(range(1, len(calls) + 1))
    assert [c["stage"] for c in calls] == [n for stages in gpu_plan.SESSIONS for n in stages]
    assert sorted(c["stage"] for c in calls) == sorted(gpu_plan.STAGES)
    assert [s["session"] for s in sessions] == list(range(1, len(gpu_plan.SESSIONS) + 1))
    for s in sessions:  # each a fresh machine: its start and its calls fit the target
        mine = [c for c in calls if c["session"] == s["session"]]
        assert s["calls"] == [c["call"] for c in mine] and s["stages"] == [c["stage"] for c in mine]
        assert s["total_s"] == plan["machine_start_s"] + sum(c["estimate_s"] for c in mine)
        assert s["total_s"] <= plan["budget_s"] < plan["session_limit_s"]
        assert {c["optional"] for c in mine} == {s["optional"]}  # required or optional, not mixed
    required = [s for s in sessions if not s["optional"]]
    flags = [s["optional"] for s in sessions]  # the acceptance first, then the optional ones
    assert flags == sorted(flags) and len(required) == 3
    assert plan["total_s"] == sum(s["total_s"] for s in required)
    names = [[cell["name"] for cell in c["cells"]] for c in calls]
    assert names[0] == ["pytest-cuda", "ours-b64-default", "build-nanogpt-b64"]  # the riskiest first
    assert names[1] == ["gpt2-xl-fsdp-ac-1gpu"] and calls[1]["session"] == 1
    for b in (16, 32, 64):  # the grid, each micro-batch beside its baseline, in the acceptance
        assert any({f"ours-b{b}-default", f"build-nanogpt-b{b}"} <= set(n) for n, c in zip(names, calls)
                   if not c["optional"])
    [kernels] = [c for c in calls if c["stage"] == 7]  # side by side, in one call, required
    assert not kernels["optional"] and names[calls.index(kernels)] == [
        "ours-b64-default-chunked", "ours-b64-default-unchunked", "ours-b64-default-liger",
        "ours-b64-default-cce"]
    autotune = [c for c in calls if any("max-autotune" in cell["name"] for cell in c["cells"])]
    assert len(autotune) == 1 and autotune[0]["optional"] and len(autotune[0]["cells"]) == 1
    for c in calls:  # no optional call fits beside a required session: each needs its own
        assert not c["optional"] or all(s["total_s"] + c["estimate_s"] > plan["budget_s"] for s in required)
    for c in calls:
        assert all(cell["estimate_s"] > 0 for cell in c["cells"])
        assert c["cells_s"] <= plan["stage_budget_s"] and c["estimate_s"] < c["timeout_s"] == 600
        command = c["command"]
        assert f"python3 -m gpt.bench gpu --stage {c['stage']} --out $OUT --commit " in command
        assert "export PYTHONPATH=. " in command and c["carry"] == [".carry"]
        wheels = "--target /tmp/site .carry/wheels/*.whl && export PYTHONPATH=.:/tmp/site || exit 1; fi;"
        assert wheels in command and command.index(wheels) < command.index("python3 -m gpt.bench")
        assert len(command) <= 2000  # the device tool's limit
        assert names[calls.index(c)] == [cell.name for cell in gpu_plan.stage_cells(
            c["stage"], gpu_plan.Sizes.make(False), Path("d"), Path("w"), Path("t"), 4)]
    assert bench_main(["gpu", "--plan"]) == 0
    text = capsys.readouterr().out
    assert all(c["command"] in text for c in calls) and f"{plan['total_s']} s" in text
    assert all(f"session {s['session']}" in text and f"~{s['total_s']} s" in text for s in sessions)
    doc = (gpu_plan.REPO / "benchmarks" / "gpu" / "README.md").read_text()  # says what --plan says
    assert f"total: {plan['total_s']} s" in doc and all(f"| {c['estimate_s']} s |" in doc for c in calls)
    assert all(f"| {s['session']}{', optional' if s['optional'] else ''} ({s['total_s']} s) |" in doc
               for s in sessions)
    assert gpu_plan.device_command(1, "SHA") in doc


def test_without_wheels_the_command_installs_nothing(tmp_path: Path) -> None:
    """The device command's wheel step: with no .carry/wheels, PYTHONPATH stays `.`."""
    command = gpu_plan.device_command(7, "SHA")
    prefix = command[:command.index("nvidia-smi")]
    done = subprocess.run(["bash", "-c", prefix + ' echo "[$PYTHONPATH]"'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "[.]\n", done


def test_a_cell_loss_is_the_default_or_one_of_four() -> None:
    flags = {loss: gpu_plan.ours_cell(SMOKE, Path("/d"), Path("/w"), 8, loss=loss)
             for loss in gpu_plan.LOSSES}
    assert [c.name for c in flags.values()] == [
        "ours-b8-default", "ours-b8-default-chunked", "ours-b8-default-unchunked",
        "ours-b8-default-liger", "ours-b8-default-cce"]
    assert all(c.params["loss"] == loss for loss, c in flags.items())
    assert "--no-chunked-loss" in flags["unchunked"].cmd
    assert "--chunked-loss" not in flags["default"].cmd and "--loss-kernel" not in flags["default"].cmd
    # ours named in full: on a compiled CUDA run the default is the whole logits
    assert "--chunked-loss --loss-kernel ours" in " ".join(flags["ours"].cmd)
    for kernel in gpu_plan.CUDA_ONLY_LOSSES:  # --smoke adds no --compile-mode after them
        assert flags[kernel].params["trainer_argv"][-2:] == ["--loss-kernel", kernel]
    with pytest.raises(ValueError, match="loss must be one of default, ours, unchunked, liger, cce"):
        gpu_plan.ours_cell(SMOKE, Path("/d"), Path("/w"), 8, loss="chunked")


def test_pytest_estimate_counts_workers() -> None:
    serial, parallel = gpu_plan.pytest_estimate(1), gpu_plan.pytest_estimate(4)
    assert parallel < serial
    cell = gpu_plan.pytest_cell(Path("/t"), 4, smoke=False)
    assert cell.cmd[-3:] == ["-n", "4", str(gpu_plan.REPO / "tests")] and cell.estimate_s == parallel
    assert "-n" not in gpu_plan.pytest_cell(Path("/t"), 0, smoke=False).cmd


# ---------------------------------------------------------------------------------------
# the stages in --smoke mode


def run_stage(stage: int, out: Path) -> dict:
    assert bench_main(["gpu", "--stage", str(stage), "--smoke", "--out", str(out)]) == 0
    report = json.loads((out / f"gpu_stage{stage}.json").read_text())
    assert report["schema"] == gpu.SCHEMA and report["stage"] == stage and report["smoke"]
    assert {"device", "torch", "cuda", "commit", "peak_tflops"} <= report["env"].keys()
    assert report["command"] == f"python -m gpt.bench gpu --stage {stage} --smoke --out {out}"
    assert (out / f"gpu_stage{stage}.md").read_text().startswith(f"# GPU acceptance, stage {stage}")
    assert (out / f"gpu_stage{stage}.log").stat().st_size > 0
    assert report["comparison"] == []  # build-nanogpt does not run in --smoke
    assert isinstance(report["loss_comparison"], list)
    for cell in report["cells"]:
        assert CELL_KEYS <= cell.keys()
        assert cell["status"] in ("ok", "skipped"), cell
        if cell["kind"] == "trainer" and cell["status"] == "ok":
            assert "--no-save-checkpoints" in cell["command"]
            assert cell["memory"]["measured_peak_bytes"] > 0 and cell["memory"]["planner"]
    return {c["name"]: c for c in report["cells"]}


@pytest.mark.slow
def test_stage1_smoke(tmp_path: Path) -> None:
    cells = run_stage(1, tmp_path)
    assert list(cells) == ["pytest-cuda", "ours-b8-default", "build-nanogpt-b8"]
    tests = cells["pytest-cuda"]["result"]
    assert tests["tests"] >= 10 and tests["skipped"] == tests["tests"]  # no GPU here
    train = cells["ours-b8-default"]["result"]
    assert FIGURES <= train.keys() and train["step_ms"]["n"] == SMOKE.steps - gpu_plan.WARMUP
    assert train["peak_mem_gb"] > 0 and train["peak_mem_source"] == "peak RSS"
    assert cells["build-nanogpt-b8"]["status"] == "skipped"
    assert "--smoke" in cells["build-nanogpt-b8"]["reason"]


@pytest.mark.slow
def test_stage2_smoke(tmp_path: Path) -> None:
    xl = run_stage(2, tmp_path)["tiny-fsdp-ac-1gpu"]
    assert xl["command"].split()[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert FIGURES <= xl["result"].keys()


@pytest.mark.slow
def test_stage8_smoke_profiles_each_cell_and_summarises_its_trace(tmp_path: Path) -> None:
    cells = run_stage(8, tmp_path)
    assert list(cells) == ["ours-b8-default-profile", "tiny-fsdp-ac-1gpu-profile"]
    for cell in cells.values():
        assert "--torch-profile" in cell["command"] and FIGURES <= cell["result"].keys()
        profile = cell["result"]["profile"]
        assert profile["steps"] == gpu_plan.PROFILED_STEPS and profile["device"] == "cpu"
        assert profile["top"] and profile["kinds"]


@pytest.mark.slow
def test_stage3_smoke(tmp_path: Path) -> None:
    cells = run_stage(3, tmp_path)
    assert list(cells) == ["ours-b2-default", "build-nanogpt-b2", "ours-b4-default", "build-nanogpt-b4"]
    assert all(FIGURES <= cells[n]["result"].keys() for n in cells if n.startswith("ours-"))


@pytest.mark.slow
def test_stage4_and_5_smoke(tmp_path: Path) -> None:
    cells = run_stage(4, tmp_path / "4")
    assert list(cells) == ["ours-b8-max-autotune"]
    assert FIGURES <= cells["ours-b8-max-autotune"]["result"].keys()
    rungs = run_stage(5, tmp_path / "5")["ladder-tiny"]["result"]["results"]
    assert rungs[0]["status"] == "ok" and rungs[-1]["title"] == "trainer full default"


@pytest.mark.slow
def test_stage6_smoke(tmp_path: Path) -> None:
    tokens = run_stage(6, tmp_path)["tokens-tiny"]
    assert tokens["status"] == "ok", tokens
    result = tokens["result"]
    assert [r["label"] for r in result["runs"]] == ["gpt2 cosine", "gpt2 trapezoid", "new", "new",
                                                    "new, tied head", "new, tied head"]
    assert "--no-compile" in result["runs"][0]["flags"] and "tokens_ratio" in result["best"]


@pytest.mark.slow
def test_stage7_smoke(tmp_path: Path) -> None:
    cells = run_stage(7, tmp_path)
    assert list(cells) == ["ours-b8-default-chunked", "ours-b8-default-unchunked",
                           "ours-b8-default-liger", "ours-b8-default-cce"]
    assert [c["params"]["loss"] for c in cells.values()] == ["ours", "unchunked", "liger", "cce"]
    ours, unchunked = cells["ours-b8-default-chunked"], cells["ours-b8-default-unchunked"]
    assert ours["status"] == unchunked["status"] == "ok"
    assert "--chunked-loss" in ours["command"] and "--loss-kernel ours" in ours["command"]
    assert "--no-chunked-loss" in unchunked["command"] and FIGURES <= unchunked["result"].keys()
    for name, kernel in (("ours-b8-default-liger", "liger"), ("ours-b8-default-cce", "cce")):
        assert cells[name]["status"] == "skipped" and "command" not in cells[name]
        assert cells[name]["reason"] == f"--smoke: --loss-kernel {kernel} runs Triton kernels on CUDA only"
    report = json.loads((tmp_path / "gpu_stage7.json").read_text())
    [c] = report["loss_comparison"]  # the skipped kernels have none
    assert (c["cell"], c["loss"], c["ours"]) == ("ours-b8-default-unchunked", "unchunked",
                                                 "ours-b8-default-chunked")
    assert c["peak_mem_over_ours"] == pytest.approx(c["peak_mem_gb"] / c["ours_peak_mem_gb"])
    assert "The head + loss against ours" in (tmp_path / "gpu_stage7.md").read_text()


def test_stage6_without_its_corpus_fails_before_running_anything(tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    monkeypatch.setattr(gpu_plan, "TOKENS_DATA", tmp_path / "missing")
    assert bench_main(["gpu", "--stage", "6", "--out", str(tmp_path / "out")]) == 1
    assert "needs a real corpus" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------
# a cell's process group, its checkpoints and its memory


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, waiting for its (new) parent to reap it


# The cell's first process starts a grandchild that ignores SIGTERM, then sleeps (timeout) or
# exits at once (leaving the grandchild behind, its pipes closed).
LEADER = textwrap.dedent('''
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(float(sys.argv[2]))
''')


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to see the grandchild")
@pytest.mark.parametrize("leader_s,status", [(120, "timeout"), (0, "failed")])
def test_a_cell_leaves_no_process_behind(leader_s: float, status: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "KILL_GRACE_S", 1.0)
    pid_file = tmp_path / "pid"
    cell = gpu_plan.Cell("group", "pytest", 1, [sys.executable, "-c", LEADER, str(pid_file), str(leader_s)])
    (tmp_path / "group").mkdir()
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 5, SMOKE, gpu.make_tokens(10, 10), tmp_path, tmp_path, log)
    assert record["status"] == status, record
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)
    if status == "timeout":
        assert "process group was killed" in record["reason"] and record["seconds"] < 30


def fake_planner(calls: list) -> types.ModuleType:
    module = types.ModuleType("gpt.memory")

    def plan(cfg, world_size: int = 1, device_type: str = "cuda") -> types.SimpleNamespace:
        calls.append((cfg, world_size, device_type))
        return types.SimpleNamespace(peak_bytes=2**30 * cfg.model.n_layer,
                                     components={"params": 2**10, "activations": 2**19})

    module.plan = plan
    return module


@pytest.mark.slow
def test_a_trainer_cell_writes_no_checkpoint_and_records_predicted_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    monkeypatch.setitem(sys.modules, "gpt.memory", fake_planner(calls))
    tokens = gpu.make_tokens(50_000, 5_000)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "train_000000.bin", tokens[0])
    write_shard(data / "val_000000.bin", tokens[1])
    cell = gpu_plan.ours_cell(SMOKE, data, tmp_path / "runs", 8)
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 300, SMOKE, tokens, tmp_path, tmp_path, log)
    assert record["status"] == "ok", record
    out = Path(cell.params["out"])
    assert (out / "metrics.jsonl").is_file() and not list(out.glob("ckpt_*"))
    [(cfg, world_size, device_type)] = calls
    assert (cfg.model.n_layer, cfg.data.batch_size, world_size, device_type) == (2, 8, 1, "cpu")
    assert not cfg.checkpoint.save_checkpoints
    mem = record["memory"]
    assert mem["planner"] == "gpt.memory.plan" and mem["predicted_peak_bytes"] == 2 * 2**30
    assert mem["components"] == {"params": 2**10, "activations": 2**19}
    assert mem["measured_peak_bytes"] == round(record["result"]["peak_mem_gb"] * 2**30)
    assert mem["measured_over_predicted"] == pytest.approx(mem["measured_peak_bytes"] / 2**31)
    report = {"stage": 1, "smoke": True, "seconds": 1, "budget_s": 1, "command": "c", "cells": [record],
              "env": {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}}
    [row] = [line for line in gpu_results.summary(report).splitlines() if line.startswith("| ours-b8")]
    assert f"({2.0:.2f}, {mem['measured_over_predicted']:.2f})" in row


def test_without_the_planner_the_reason_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    cell = gpu_plan.ours_cell(SMOKE, Path("/d"), Path("/w"), 8)
    monkeypatch.setitem(sys.modules, "gpt.memory", None)  # import gpt.memory raises ImportError
    mem = gpu_results.predicted_memory(cell)
    assert mem["predicted_peak_bytes"] is None and mem["planner"].startswith("planner unavailable: ")
    report = {"stage": 1, "smoke": True, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": [{"name": "ours-b8-default", "kind": "trainer", "params": {}, "status": "failed",
                         "memory": mem, "reason": "exit 1"}],
              "env": {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}}
    assert f"No prediction: {mem['planner']}" in gpu_results.summary(report)
    broken = types.ModuleType("gpt.memory")
    broken.plan = lambda cfg, world_size=1, device_type="cuda": 1 / 0
    monkeypatch.setitem(sys.modules, "gpt.memory", broken)
    mem = gpu_results.predicted_memory(cell)
    assert mem["predicted_peak_bytes"] is None
    assert mem["planner"].startswith("planner failed: ZeroDivisionError")
    assert gpu_results.with_measured(mem, {"peak_mem_gb": 1.0, "peak_mem_source": "peak RSS"}) == {
        **mem, "measured_peak_bytes": 2**30, "measured_source": "peak RSS", "measured_over_predicted": None}


# ---------------------------------------------------------------------------------------
# build-nanogpt

# A stand-in with the lines the harness substitutes, which fails if a substitution did not
# happen and prints its per-step line in build-nanogpt's format.
STAND_IN = textwrap.dedent('''
    import os
    import numpy as np
    from hellaswag import render_example, iterate_examples
    total_batch_size = 524288 # 2**19, ~0.5M, in number of tokens
    B = 64 # micro batch size
    max_steps = 19073 # 19,073 steps is ~1 epoch
    warmup_steps = 715
    use_compile = False # torch.compile interferes
    last_step = False
    tokens = np.load(os.path.join("edu_fineweb10B", "edufineweb_train_000000.npy"))
    assert use_compile and render_example is None and B == 4 and total_batch_size == 1024
    assert warmup_steps == 10  # the trainer cells' warm-up
    for step in range(max_steps):
        if step % 250 == 0 or last_step:
            raise SystemExit("validation must be off")
        loss = 10.0 - step / 10 + tokens[step] / 1e9
        print(f"step {step:5d} | loss: {loss:.6f} | lr 6.0000e-04 | norm: 1.0000 | dt: {100.0 + step:.2f}ms | tok/sec: {total_batch_size / 0.1:.2f}")
''')
SIZES = gpu_plan.Sizes(smoke=False, model="gpt2", seq_len=1024, batches=(4,), steps=gpu_plan.WARMUP + 5,
                       tokens_per_step=1024, xl_model="gpt2-xl", xl_batch=1)


def test_build_nanogpt_harness_runs_and_parses_and_makes_the_ratio(tmp_path: Path) -> None:
    script_dir = tmp_path / "bng"
    script_dir.mkdir()
    (script_dir / "train_gpt2.py").write_text(STAND_IN)
    cell = gpu_plan.nanogpt_cell(SIZES, 4)
    tokens = gpu.make_tokens(10_000, 1_000)
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 60, SIZES, tokens, script_dir, tmp_path, log)
    assert record["status"] == "ok", record
    r = record["result"]
    assert r["steps_logged"] == SIZES.steps and r["step_ms"]["median"] == 105.0
    assert r["losses"][0] == pytest.approx(10.0 + tokens[0][0] / 1e9)
    saved = np.load(tmp_path / "build-nanogpt-b4" / nanogpt.DATA_FOLDER / "edufineweb_val_000000.npy")
    assert np.array_equal(saved, tokens[1])  # the same tokens the trainer reads
    # ours at the same micro-batch, 50 ms a step on the same tokens per step: 2.1x its speed
    steps = [{"ms": 50.0, "loss": 5.0}] * SIZES.steps
    ours = {"name": "ours-b4-default", "kind": "trainer", "status": "ok", "seconds": 9, "estimate_s": 9,
            "params": {"batch_size": 4, "model": "gpt2"},
            "result": gpu_results.step_figures(steps, 1024, "gpt2", 1024, "cpu")}
    other = {**ours, "name": "ours-b8-default", "params": {"batch_size": 8, "model": "gpt2"}}
    [c] = gpu_results.comparisons([ours, other, record])
    assert (c["cell"], c["baseline"], c["batch_size"]) == ("ours-b4-default", "build-nanogpt-b4", 4)
    assert c["ours_over_baseline"] == pytest.approx(105.0 / 50.0)
    assert c["losses_compared"] == SIZES.steps
    assert c["max_abs_loss_diff"] == pytest.approx(max(abs(5.0 - x) for x in r["losses"]))
    report = {"stage": 3, "smoke": False, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": [ours, other, record], "comparison": [c],
              "env": {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}}
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in gpu_results.summary(report).splitlines()
            if line.startswith("| ours") or line.startswith("| build")}
    assert rows["ours-b4-default"][5] == "2.100x"
    assert rows["ours-b8-default"][5] == "-" and rows["build-nanogpt-b4"][5] == "-"


def test_build_nanogpt_missing_or_changed_fails_the_cell(tmp_path: Path) -> None:
    cell = gpu_plan.nanogpt_cell(SIZES, 4)
    tokens = gpu.make_tokens(1_000, 100)
    record = gpu.run_cell(cell, 60, SIZES, tokens, tmp_path / "absent", tmp_path, None)
    assert record["status"] == "failed" and "fetch tool" in record["reason"]
    (tmp_path / "train_gpt2.py").write_text(STAND_IN.replace("B = 64 # micro batch size", "B = 8"))
    record = gpu.run_cell(cell, 60, SIZES, tokens, tmp_path, tmp_path, None)
    assert record["status"] == "failed" and "B = 64 # micro batch size" in record["reason"]


def tiktoken_cache(folder: Path) -> Path:
    """A tiktoken cache holding GPT-2's two BPE files (named by the sha1 of their URL)."""
    folder.mkdir()
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        (folder / hashlib.sha1((url + name).encode()).hexdigest()).write_bytes(
            (ASSETS / "gpt2" / name).read_bytes())
    return folder


def test_a_stage_without_its_baseline_fails_before_running_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out, script_dir = tmp_path / "out", tmp_path / "bng"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache(tmp_path / "cache")))
    stage = ["gpu", "--stage", "3", "--out", str(out), "--nanogpt", str(script_dir)]
    for stage_n in ("1", "3"):
        stage[2] = stage_n
        assert bench_main(stage) == 1
        err = capsys.readouterr().err
        assert "fetch tool" in err and ".carry/build-nanogpt" in err and "nothing was run" in err
    script_dir.mkdir()
    (script_dir / "train_gpt2.py").write_text(STAND_IN.replace("use_compile = False", "use_compile = 0"))
    assert bench_main(stage) == 1 and "use_compile = False" in capsys.readouterr().err
    (script_dir / "train_gpt2.py").write_text(STAND_IN)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # no BPE files there
    assert bench_main(stage) == 1 and "tiktoken_cache" in capsys.readouterr().err
    assert not out.exists()
    if not torch.cuda.is_available():  # past the check, a stage needs its GPU
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
        assert bench_main(stage) == 2 and "no CUDA device" in capsys.readouterr().err
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
        assert bench_main([*stage, "--only", "ours-b16-default"]) == 2  # no baseline cell: no check


def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in ((["--stage", "1"], "--stage 1 needs --out"),
                       (["--stage", "1", "--plan"], "not allowed with"),
                       (["--stage", "1", "--out", "o", "--json"], "--json goes with --plan"),
                       (["--stage", "2", "--out", "o", "--only", "nope"],
                        "--only nope: not a cell of stage 2")):
        with pytest.raises(SystemExit) as exc:
            bench_main(["gpu", *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 2, err  # the error, then the hint


def test_each_loss_kernel_against_ours_in_the_summary() -> None:
    def cell(name: str, loss: str, ms: float, mem: float, batch: int = 64, status: str = "ok") -> dict:
        result = gpu_results.step_figures([{"ms": ms, "loss": 5.0}] * 8, 2**17, "gpt2", 1024, "cpu")
        return {"name": name, "kind": "trainer", "status": status, "seconds": 9, "estimate_s": 9,
                "params": {"model": "gpt2", "batch_size": batch, "compile_mode": "default", "loss": loss},
                "result": {**result, "peak_mem_gb": mem}}

    cells = [cell("ours-b64-default", "ours", 400.0, 20.0),
             cell("ours-b64-default-unchunked", "unchunked", 440.0, 50.0),
             cell("ours-b64-default-liger", "liger", 380.0, 18.0),
             cell("ours-b64-default-cce", "cce", 1.0, 1.0, status="failed"),
             cell("ours-b16-default-liger", "liger", 100.0, 5.0, batch=16)]  # no ours at 16
    found = gpu_results.loss_comparisons(cells)
    assert [c["cell"] for c in found] == ["ours-b64-default-unchunked", "ours-b64-default-liger"]
    liger = found[1]
    assert liger["ours"] == "ours-b64-default" and liger["step_ms_over_ours"] == pytest.approx(0.95)
    assert liger["tokens_per_s_over_ours"] == pytest.approx(400 / 380)
    assert liger["peak_mem_over_ours"] == pytest.approx(0.9)
    report = {"stage": 7, "smoke": False, "seconds": 1, "budget_s": 1, "command": "c", "cells": cells,
              "loss_comparison": found, "env": {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}}
    rows = [line for line in gpu_results.summary(report).splitlines()
            if line.startswith("| ours-b64-default-liger | liger")]
    assert rows == ["| ours-b64-default-liger | liger | 380.0 (0.950x) | 344,926 (1.053x) | 18.00 (0.900x) |"]


def test_a_reason_with_a_pipe_keeps_the_summary_a_table() -> None:
    """A failed cell's reason joins its last lines with ' | ': escaped in the markdown
    (unescaped, they split the row into more cells than the header has)."""
    report = {"stage": 1, "smoke": True, "seconds": 1, "budget_s": 1, "command": "c",
              "cells": [{"name": "ours-b8-default", "kind": "trainer", "params": {},
                         "status": "failed", "reason": "exit 1: first | second"}],
              "env": {"device": "cpu", "torch": "t", "cuda": None, "commit": "x"}}
    table = [line for line in gpu_results.summary(report).splitlines() if line.startswith("|")]
    cells = [line.replace("\\|", "").count("|") for line in table]
    assert len(set(cells)) == 1 and "first \\| second" in table[-1]
