"""The GPU acceptance command's plumbing, on the CPU: every stage in --smoke mode writes the
schema the GPU stages will, and the build-nanogpt harness patches, runs and parses a
stand-in script written here in the shape of the real one."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpt.bench import gpu, nanogpt
from gpt.bench.cli import main as bench_main

CELL_KEYS = {"name", "kind", "params", "status"}
FIGURES = {"step_ms", "tokens_per_s_median", "mfu_median", "compile_s_estimate", "final_loss",
           "losses", "tokens_per_step", "warmup_steps_excluded"}


def run_stage(stage: int, out: Path) -> dict:
    assert bench_main(["gpu", "--stage", str(stage), "--smoke", "--out", str(out)]) == 0
    report = json.loads((out / f"gpu_stage{stage}.json").read_text())
    assert report["schema"] == gpu.SCHEMA and report["stage"] == stage and report["smoke"]
    assert {"device", "torch", "cuda", "commit", "peak_tflops"} <= report["env"].keys()
    assert report["command"] == f"python -m gpt.bench gpu --stage {stage} --smoke --out {out}"
    assert (out / f"gpu_stage{stage}.md").read_text().startswith(f"# GPU acceptance, stage {stage}")
    assert (out / f"gpu_stage{stage}.log").stat().st_size > 0
    for cell in report["cells"]:
        assert CELL_KEYS <= cell.keys()
        assert cell["status"] in ("ok", "skipped"), cell
    return {c["name"]: c for c in report["cells"]}


@pytest.mark.slow
def test_stage1_smoke(tmp_path: Path) -> None:
    cells = run_stage(1, tmp_path)
    tests = cells["pytest-cuda"]["result"]
    assert tests["tests"] >= 10 and tests["skipped"] == tests["tests"]  # no GPU here
    train = cells["train-tiny-6-steps"]["result"]
    assert FIGURES <= train.keys() and train["step_ms"]["n"] == 6 - gpu.WARMUP
    assert train["peak_mem_gb"] > 0 and train["peak_mem_source"] == "peak RSS"


@pytest.mark.slow
def test_stage2_smoke(tmp_path: Path) -> None:
    cells = run_stage(2, tmp_path)
    assert [n for n in cells if n.startswith("ours-")] == ["ours-b2-default", "ours-b4-default"]
    assert all(FIGURES <= cells[n]["result"].keys() for n in cells if n.startswith("ours-"))
    assert cells["build-nanogpt-b2"]["status"] == "skipped"
    assert "--smoke" in cells["build-nanogpt-b2"]["reason"]


@pytest.mark.slow
def test_stage3_smoke(tmp_path: Path) -> None:
    cells = run_stage(3, tmp_path)
    rungs = cells["ladder-tiny"]["result"]["results"]
    assert rungs[0]["status"] == "ok" and rungs[-1]["title"] == "trainer full default"
    xl = cells["tiny-fsdp-ac-1gpu"]
    assert xl["command"].split()[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert FIGURES <= xl["result"].keys()


# A stand-in with the lines the harness substitutes, which fails if a substitution did not
# happen and prints its per-step line in build-nanogpt's format.
STAND_IN = textwrap.dedent('''
    import os
    import numpy as np
    from hellaswag import render_example, iterate_examples
    total_batch_size = 524288 # 2**19, ~0.5M, in number of tokens
    B = 64 # micro batch size
    max_steps = 19073 # 19,073 steps is ~1 epoch
    use_compile = False # torch.compile interferes
    last_step = False
    tokens = np.load(os.path.join("edu_fineweb10B", "edufineweb_train_000000.npy"))
    assert use_compile and render_example is None and B == 4 and total_batch_size == 1024
    for step in range(max_steps):
        if step % 250 == 0 or last_step:
            raise SystemExit("validation must be off")
        loss = 10.0 - step / 10 + tokens[step] / 1e9
        print(f"step {step:5d} | loss: {loss:.6f} | lr 6.0000e-04 | norm: 1.0000 | dt: {100.0 + step:.2f}ms | tok/sec: {total_batch_size / 0.1:.2f}")
''')


def test_build_nanogpt_harness_patches_runs_and_parses(tmp_path: Path) -> None:
    script_dir = tmp_path / "bng"
    script_dir.mkdir()
    (script_dir / "train_gpt2.py").write_text(STAND_IN)
    plan = gpu.Plan(smoke=False, model="gpt2", seq_len=1024, batches=(4,), modes=("default",),
                    steps=gpu.WARMUP + 5, tokens_per_step=1024)
    cell = gpu.Cell("build-nanogpt-b4", "nanogpt", 10, params={"batch_size": 4, "steps": plan.steps})
    tokens = gpu.make_tokens(10_000, 1_000)
    with open(tmp_path / "log", "w") as log:
        record = gpu.run_cell(cell, 60, plan, tokens, script_dir, tmp_path, log)
    assert record["status"] == "ok", record
    r = record["result"]
    assert r["steps_logged"] == plan.steps and r["step_ms"]["median"] == 105.0
    assert r["losses"][0] == pytest.approx(10.0 + tokens[0][0] / 1e9)
    saved = np.load(tmp_path / "build-nanogpt-b4" / nanogpt.DATA_FOLDER / "edufineweb_val_000000.npy")
    assert np.array_equal(saved, tokens[1])  # the same tokens the trainer reads


def test_build_nanogpt_missing_or_changed_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    plan = gpu.Plan(smoke=False, model="gpt2", seq_len=1024, batches=(4,), modes=("default",),
                    steps=5, tokens_per_step=1024)
    cell = gpu.Cell("build-nanogpt-b4", "nanogpt", 10, params={"batch_size": 4, "steps": 5})
    tokens = gpu.make_tokens(1_000, 100)
    record = gpu.run_cell(cell, 60, plan, tokens, tmp_path / "absent", tmp_path, None)
    assert record["status"] == "skipped" and "fetch tool" in record["reason"]
    (tmp_path / "train_gpt2.py").write_text(STAND_IN.replace("B = 64 # micro batch size", "B = 8"))
    record = gpu.run_cell(cell, 60, plan, tokens, tmp_path, tmp_path, None)
    assert record["status"] == "skipped" and "B = 64 # micro batch size" in record["reason"]
