"""Tests for gpt.report.flops (FLOPs per token, MFU, device peaks) and gpt.report.metrics (the
JSONL log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpt.core.config import model_preset
from gpt.report.flops import flops_per_token, mfu, peak_tflops
from gpt.report.metrics import MetricsLog

from helpers import REPO, TINY_RUN, meta_gpt, one_line_error, read_metrics, run_cli


# --------------------------------------------------------------------------
# flops_per_token


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("gpt2", {"vocab_size": 50257}),
        ("gpt2", {"vocab_size": 50304}),
        ("tiny", {}),
        ("mini", {}),
        ("mini", {"block_size": 128, "vocab_size": 1000}),
    ],
)
@pytest.mark.parametrize("T", [64, 1024])
def test_flops_per_token_matches_model(name: str, overrides: dict, T: int) -> None:
    model = meta_gpt(name, **overrides)
    cfg = model.config
    n = model.num_params(exclude_position_embedding=True)
    expected = 6 * n + 12 * cfg.n_layer * cfg.n_embd * T
    assert flops_per_token(cfg, T) == expected
    # the position embedding is excluded, the tied head counted once
    assert n == model.num_params() - cfg.block_size * cfg.n_embd


def test_gpt2_124m_param_count() -> None:
    model = meta_gpt("gpt2", vocab_size=50257)
    assert model.num_params() == 124_439_808
    assert model.num_params(exclude_position_embedding=True) == 124_439_808 - 1024 * 768


def test_flops_per_token_known_value() -> None:
    cfg = model_preset("gpt2", vocab_size=50257)
    n = 124_439_808 - 1024 * 768
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024
    # ~0.85 GFLOP per token for GPT-2 124M at T=1024
    assert flops_per_token(cfg, 1024) == pytest.approx(8.5e8, rel=0.02)


def test_flops_per_token_hand_count_tiny() -> None:
    """The tiny preset (2 layers, d = 64, vocab 50304) counted by hand."""
    d, L, V, T = 64, 2, 50304, 128
    c_attn = d * 3 * d + 3 * d  # 12,288 + 192
    attn_proj = d * d + d  # 4,096 + 64
    c_fc = d * 4 * d + 4 * d  # 16,384 + 256
    mlp_proj = 4 * d * d + d  # 16,384 + 64
    layernorms = 2 * (d + d)  # ln_1, ln_2: weight + bias
    per_block = c_attn + attn_proj + c_fc + mlp_proj + layernorms
    assert per_block == 49_984
    n = L * per_block + V * d + (d + d)  # blocks, tied wte / lm_head, ln_f (wpe excluded)
    assert n == 3_319_552
    attention = 12 * L * d * T  # QK^T and AV: 2 * 2 * T * d per layer forward, x3 with backward
    assert attention == 196_608
    assert flops_per_token(model_preset("tiny"), T) == 6 * 3_319_552 + 196_608 == 20_113_920


def test_flops_per_token_grows_with_seq_len() -> None:
    cfg = model_preset("tiny")
    assert flops_per_token(cfg, 128) - flops_per_token(cfg, 64) == 12 * 2 * 64 * 64


# --------------------------------------------------------------------------
# mfu


@pytest.mark.parametrize("peak", [None, 0, 0.0])
def test_mfu_unknown_peak(peak: float | None) -> None:
    assert mfu(100_000, 1e9, peak) is None


def test_mfu_value() -> None:
    assert mfu(100_000, 1e9, 989.0) == pytest.approx(100_000 * 1e9 / 989e12, rel=1e-12)
    assert mfu(100_000, 1e9, 989.0) == pytest.approx(0.10111223458038422)
    assert mfu(1_000_000, 1e9, 1000.0) == pytest.approx(1.0)
    assert mfu(0, 1e9, 312.0) == 0.0


# --------------------------------------------------------------------------
# peak_tflops


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40", 181.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A30", 165.0),
        ("NVIDIA A40", 149.7),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 3090", 71.0),
        ("NVIDIA RTX A6000", 154.8),
        ("NVIDIA RTX 6000 Ada Generation", 364.2),
        ("AMD Instinct MI300X", 1307.4),
        ("nvidia h100 80gb hbm3", 989.0),  # case-insensitive
        # whole-word matches only: other parts with other peaks are not confused
        ("NVIDIA A10G", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("Tesla V100-SXM2-16GB", None),
        ("Intel(R) Xeon(R) Processor", None),
        ("Tesla T4", None),
        ("", None),
        ("cpu", None),
    ],
)
def test_peak_tflops(name: str, expected: float | None) -> None:
    assert peak_tflops(name) == expected


def test_peak_table_specific_names_first() -> None:
    """Every key must be reachable: no earlier key may match a later key's own name."""
    from gpt.report.flops import PEAK_BF16_TFLOPS

    for key, tflops in PEAK_BF16_TFLOPS:
        assert peak_tflops(f"NVIDIA {key}") == tflops, key
        assert 50 < tflops < 2000


# --------------------------------------------------------------------------
# MetricsLog


def read_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_metrics_log_writes_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"kind": "header", "model": "tiny"})
        log.write({"step": 1, "loss": 10.5, "lr": 6e-4, "mfu": None})
    assert read_records(path) == [
        {"kind": "header", "model": "tiny"},
        {"step": 1, "loss": 10.5, "lr": 6e-4, "mfu": None},
    ]
    assert len(path.read_text().splitlines()) == 2


def test_metrics_log_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    try:
        log.write({"step": 0})
        assert read_records(path) == [{"step": 0}]
        log.write({"step": 1, "loss": 3.25})
        assert read_records(path) == [{"step": 0}, {"step": 1, "loss": 3.25}]
    finally:
        log.close()


def test_metrics_log_appends_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"run": 1, "step": 0})
    with MetricsLog(str(path)) as log:
        log.write({"run": 2, "step": 5})
    assert read_records(path) == [{"run": 1, "step": 0}, {"run": 2, "step": 5}]


def test_metrics_log_closes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        pass
    with pytest.raises(ValueError):
        log.write({"step": 1})
    assert path.read_text() == ""


def test_the_log_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    """A metrics.jsonl that is a link to a file elsewhere would append the run's records
    there: refused, and the file it leads to is left as it was."""
    from gpt.report.metrics import MetricsError

    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text('{"theirs": 1}\n')
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "metrics.jsonl"
    path.symlink_to(elsewhere)
    with pytest.raises(MetricsError, match=r"metrics\.jsonl: cannot open the metrics log for "
                       r"appending: it is a symlink \(to .*elsewhere\.jsonl\), and a run writes "
                       r"only inside its folder, never through a link; remove or rename it"):
        MetricsLog(path)
    assert elsewhere.read_text() == '{"theirs": 1}\n'


def test_a_run_refuses_a_log_or_tracker_folder_that_leads_outside_it(
        tmp_path: Path, random_data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """The run's folder check (the run's and its dry run's) refuses a link at the log's
    name and at a folder it writes into, before anything is written."""
    from gpt.checkpoint.run_folder import check_run_folder
    from gpt.core.errors import UserError
    from gpt.entry import train_main
    from helpers import QUIET, TINY

    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to(elsewhere)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(random_data_dir),
            "--out-dir", str(out)]
    for dry in (["--dry-run"], []):
        assert train_main([*args, *dry]) != 0
        err = capsys.readouterr().err
        assert f"{out / 'metrics.jsonl'}: cannot open the metrics log for appending: it is a " \
            f"symlink (to {elsewhere}), and a run writes only inside its folder" in err
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    assert elsewhere.read_text() == ""
    (out / "metrics.jsonl").unlink()
    (tmp_path / "logs").mkdir()
    (out / "tensorboard").symlink_to(tmp_path / "logs")  # --tensorboard's event files
    with pytest.raises(UserError, match=r"tensorboard: cannot write the run's TensorBoard event "
                       r"files \(--tensorboard\) there: it is a symlink \(to .*logs\), and a "
                       r"run writes only inside its folder"):
        check_run_folder(out, tensorboard=True)
    check_run_folder(out)  # without --tensorboard, nothing is written there


@pytest.mark.slow
def test_file_size_limit_on_the_metrics_log(data_dir: Path, tmp_path: Path) -> None:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    proc = run_cli(*TINY_RUN, "--max-steps", "200", "--checkpoint-every", "0", "--data-dir", str(data_dir),
                   "--out-dir", str(tmp_path / "r"), preexec_fn=limit)
    assert "metrics.jsonl: cannot write the metrics log" in one_line_error(proc)
    assert read_metrics(tmp_path / "r")  # every line parses: the cut record was taken back


def test_metrics_log_that_cannot_be_opened(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    (out / "metrics.jsonl").mkdir(parents=True)
    proc = run_cli(*TINY_RUN, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out))
    assert "metrics.jsonl: cannot open the metrics log" in one_line_error(proc)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # each line parses


@pytest.mark.parametrize("tail,words", [
    (b'{"type": "train", "step": 2, "lo', "dropped the torn end of its last record (32 bytes"),
    (b"\0" * 100, "dropped the torn end of its last record (100 bytes"),
    (b'{"type": "train", "step": 2}', "its last record had no line end"),
], ids=["torn record", "zeros", "no line end"])
def test_a_torn_end_of_the_metrics_log_is_repaired_on_open(tail: bytes, words: str,
                                                           tmp_path: Path, capsys) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"type": "run"}\n{"type": "train", "step": 1}\n' + tail)
    with MetricsLog(path) as log:
        log.write({"type": "run", "resumed": True})
    assert f"note: {path}: {words}" in capsys.readouterr().err
    got = records(path)
    assert got[0] == {"type": "run"} and got[-1] == {"type": "run", "resumed": True}
    assert len(got) == (4 if tail.startswith(b"{") and tail.endswith(b"}") else 3)
    with MetricsLog(path):  # a whole file: nothing to say
        pass
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_write_that_fails_part_way_leaves_no_torn_record(tmp_path: Path) -> None:
    """A file-size limit, as a full disk: the record cut short is taken back at once."""
    path = tmp_path / "metrics.jsonl"
    script = (f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))\n"
              f"from gpt.report.metrics import MetricsLog, MetricsError\n"
              f"log = MetricsLog({str(path)!r})\n"
              f"try:\n"
              f"    for step in range(100):\n"
              f"        log.write({{'type': 'train', 'step': step, 'note': 'x' * 200}})\n"
              f"except MetricsError as e:\n"
              f"    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert "cannot write the metrics log" in proc.stdout, proc.stderr
    assert [r["step"] for r in records(path)] == list(range(len(records(path))))
    assert path.stat().st_size < 3000 and path.read_bytes().endswith(b"\n")


def test_peak_memory_on_cpu_is_the_process_peak_rss() -> None:
    import mmap

    import torch

    from gpt.report.flops import peak_memory, reset_peak_memory

    cpu = torch.device("cpu")
    reset_peak_memory(cpu)
    before, source = peak_memory(cpu)
    assert source == "peak RSS" and before > 10 * 2**20
    # 64 MiB of fresh pages: a tensor could reuse memory an earlier test freed (the
    # trainer's malloc settings outlive an in-process run), an anonymous map cannot.
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"x" * len(block))
    after, _ = peak_memory(cpu)
    assert after >= before + 60 * 2**20
    block.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_cpu_malloc_reuse_takes_effect_on_glibc() -> None:
    from gpt.runtime.device import reuse_freed_memory

    assert reuse_freed_memory() is True
