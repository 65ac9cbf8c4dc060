"""The torch_api selection (tests/tiers.py), `-m torch_api`, a quick check of another torch
version: it holds the tests that caught what changed between torch versions, and leaves
out tests of this package's own logic."""

from __future__ import annotations

import pytest

from helpers import REPO
from tiers import _file, torch_api

TESTS = REPO / "tests"

# What broke or moved between torch versions (pyproject.toml's notes), and the test that
# shows it: each must stay in the selection.
CAUGHT = [
    ("runs/test_two_ranks.py", "test_two_ranks_match_one_process"),  # gloo reduce-scatter sums (2.7-2.8)
    ("runtime/test_teardown.py",
     "test_the_trainers_model_and_optimizer_are_gone_before_the_group_is"),  # 2.7's cache
    ("engine/test_parallel.py", "test_fsdp_step_under_compile_has_no_graph_break"),  # fake pg, dynamo
    ("engine/test_parallel.py", "test_fsdp_fp16_overflow_on_one_rank_skips_the_step_on_all"),  # DTensor
    ("optim/test_muon.py", "test_one_step_is_torchs_muon_and_adamw_each_on_their_own"),  # torch.optim.Muon
    ("core/test_compat.py", "test_fsdp_on_cpu_names_the_torch_it_needs"),
    ("model/test_fp8.py", "test_fp8_on_two_ranks_trains_as_one_process"),  # torchao
    ("runs/test_launch_scripts.py", "test_two_nodes_on_one_machine_train_like_one_process"),  # torchrun
    ("runs/test_resume.py", "test_stop_and_resume_is_bitwise_identical"),  # optimizer state dicts
    ("model/test_speedrun_parts.py", "test_the_flex_attention_block_mask_is_the_sdpa_mask"),
    ("model/test_chunked_ce.py", "test_compiles_as_one_graph_with_the_eager_loss_and_gradients"),
]
# The package's own logic: the same on any torch.
OWN = [
    ("core/test_config.py", "test_defaults_reproduce_gpt2_124m_recipe"),
    ("data/test_loader.py", "test_header_splits_64bit_count"),
    ("bench/test_tokens_search.py", "test_seeds_schedules_bracketing_and_the_tied_head"),
]


@pytest.mark.parametrize("path,test", CAUGHT)
def test_what_broke_between_torch_versions_is_in_the_selection(path: str, test: str) -> None:
    assert test in _file(TESTS / path)[0], f"{path}::{test} is gone: name what shows it now"
    assert torch_api(TESTS / path, test), f"{path}::{test} left out"


@pytest.mark.parametrize("path,test", OWN)
def test_the_package_s_own_logic_is_left_out(path: str, test: str) -> None:
    assert test in _file(TESTS / path)[0]
    assert torch_api(TESTS / path, test) is None


def test_the_rule_follows_helpers_fixtures_and_the_trainer_s_flags(tmp_path) -> None:
    """A test is in it through what it uses: a helper that starts torchrun, a fixture of its
    file that compiles, the trainer's --parallel in a subprocess; not for importing torch."""
    src = tmp_path / "test_example.py"
    src.write_text(
        "import torch\n"
        "import pytest\n"
        "from helpers import run_cli, run_torchrun\n"
        "@pytest.fixture\n"
        "def compiled():\n"
        "    return torch.compile(torch.nn.Linear(2, 2))\n"
        "def test_ranks():\n    run_torchrun('--max-steps', '1')\n"
        "def test_uses_it(compiled):\n    compiled(torch.ones(2))\n"
        "def test_flag():\n    run_cli('--parallel', 'fsdp')\n"
        "def test_plain():\n    run_cli('--max-steps', '1'); torch.ones(2).sum()\n")
    assert [bool(torch_api(src, t)) for t in ("test_ranks", "test_uses_it", "test_flag",
                                              "test_plain")] == [True, True, True, False]


def test_a_module_only_an_absent_extra_stops_is_excused_from_the_import_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast tier must import every module of gpt/, but gpt.eval.harness imports lm-eval,
    which `.[dev]` alone does not install (its tests skip): the check names the extra and
    passes; a module that imports here and was never reached still fails the run."""
    import sys

    from conftest import _extra_missing

    monkeypatch.delitem(sys.modules, "gpt.eval.harness", raising=False)
    for name in ["lm_eval", *(m for m in sys.modules if m.startswith("lm_eval."))]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    assert _extra_missing("gpt.eval.harness") == "lm_eval"
    assert _extra_missing("gpt.core.config") is None
