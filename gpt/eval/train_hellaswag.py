"""The trainer's --hellaswag-every: HellaSwag accuracy (gpt/eval/hellaswag.py) every N steps
and at the end, one of gpt/eval/evaluations.py's. Its file is checked before the run (a
local one's first examples; the official set cached, or its host reachable); its examples
are read once, as the run starts (rank 0 downloads), and every rank scores its share.
Torch is imported where it loads (the curves' command reads this row without it)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt.core.config import Config, ConfigError, EvalConfig
from gpt.core.text import one_line
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.eval.evaluation import Evaluation, Result, Scoring
from gpt.report.metrics_reader import Panel

if TYPE_CHECKING:
    from gpt.eval.hellaswag import Example
    from gpt.runtime.world import Runtime


class HellaSwag(Evaluation):
    name = "hellaswag"
    stands_in = True  # the official set scores any checkpoint, the run's data or not
    panels = (Panel("hellaswag", (("acc_norm", "acc_norm"), ("acc", "acc")),
                    "HellaSwag accuracy", "accuracy"),)

    def every(self, e: EvalConfig) -> int:
        return e.hellaswag_every

    def check(self, cfg: Config) -> None:
        """--hellaswag-file, where it names a local file, exists and every example is
        HellaSwag's JSONL (gpt/eval/hellaswag.py's check_file); an http(s) address, or
        none for the official set, is fetched when the run starts: it is cached, or its
        host answers."""
        from gpt.eval import hellaswag

        source = cfg.eval.hellaswag_file
        hellaswag.check_reachable(source)  # a download that cannot happen: now
        if source is None or source.startswith(("http://", "https://")):
            return
        if source == "val" and not Path(source).exists():
            return  # the official validation set's name
        if not Path(source).is_file():
            raise ConfigError(f"--hellaswag-file {source}: no such file; give a local HellaSwag "
                              f"jsonl, or leave the flag out to download the validation set")
        try:  # every example read as the scorer reads them (not tokenized)
            hellaswag.check_file(source)
        except hellaswag.HellaSwagError as err:
            raise ConfigError(f"--hellaswag-file {err}; give HellaSwag's jsonl (one JSON object a "
                              f"line with ctx, endings and label), or leave the flag out to "
                              f"download the validation set") from None

    def load(self, cfg: Config, runtime: Runtime) -> list[Example] | None:
        from gpt.eval import hellaswag

        e = cfg.eval  # every rank reads every example (it scores its share); rank 0 downloads
        return hellaswag.load_examples(e.hellaswag_file, None, runtime.rank, None,
                                       e.hellaswag_max_examples) or None

    def score(self, loaded: list[Example], at: Scoring) -> Result:
        from gpt.eval import hellaswag

        rt = at.runtime
        # GPT-2's ids only: a padded vocabulary's extra rows are masked out.
        hs = hellaswag.evaluate(at.eval_model, loaded, rt.device, at.autocast_dtype, rt.rank,
                                rt.world_size, valid_vocab=GPT2_VOCAB)
        name = getattr(loaded, "name", hellaswag.VAL_NAME)
        named = "" if name == hellaswag.VAL_NAME else f" of {one_line(name, 200)}"  # one's own set
        return Result({"type": self.name, "step": at.step, "set": name, **hs},
                      (f"hellaswag acc_norm {hs['acc_norm']:.4f} (acc {hs['acc']:.4f}, "
                       f"{hs['total']} examples{named})",))

    def evaluate_flags(self, cfg: Config, loaded: Any | None, compiled: bool) -> list[str]:
        return [f"--hellaswag {shlex.quote(cfg.eval.hellaswag_file or 'val')}"]


HELLASWAG = HellaSwag()
