"""This package's models as an EleutherAI lm-evaluation-harness model ("gpt2-trainer").

The harness asks a model three things; each is answered here from the model's own logits
(a forward with targets=None), with GPT-2's tokenizer:

    loglikelihood          log P(continuation | context), and whether greedy decoding
                           would have produced it
    loglikelihood_rolling  log P(text), scored in windows of the block size
    generate_until         text generated from a context until a stop string (KV cache)

Context and continuation tokens are split by the harness's own TemplateLM (the same
split its Hugging Face model gets), and contexts longer than the block size are cut from
the left the way its `hf` model cuts them, so scores of a GPT-2-shaped checkpoint equal
those of its Hugging Face export (tests/eval/test_harness.py). Any checkpoint the trainer
writes loads, rotary or untied-head ones too, which Hugging Face's GPT-2 cannot hold.

Under torchrun each rank answers the requests the harness gives it (its rank /
world-size contract) and the results are gathered on rank 0. This module imports
lm_eval: import it only after gpt.eval.harness_tasks.require_lm_eval().
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import get_model, register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from gpt.data.tokenizer import GPT2_EOT, GPT2_VOCAB, gpt2_tokenizer
from gpt.eval.harness_tasks import HarnessError
from gpt.eval.rank_agreement import agreed, refuse_together
from gpt.model.sizing import check_free_memory
from gpt.model.transformer import GPT, unwrap
from gpt.runtime.device import autocast


MODEL_NAME = "gpt2-trainer"  # lm_eval --model gpt2-trainer (after register())

Request = tuple[Any, list[int], list[int]]  # (strings, context ids, continuation ids)


class GPT2TrainerLM(TemplateLM):
    """A GPT of this package behind the harness's LM interface.

    From the harness's command line (model_args): checkpoint=PATH or init_from=NAME|DIR,
    device, dtype (auto, fp32, bf16, fp16), batch_size, max_gen_toks. From Python: a
    model already built (model=...), as the trainer's in-training evaluation does.
    """

    def __init__(self, checkpoint: str | None = None, init_from: str | None = None,
                 model: torch.nn.Module | None = None, device: str | None = None,
                 dtype: str | torch.dtype = "auto", batch_size: int | str = 16,
                 max_gen_toks: int | str = 256, rank: int | None = None,
                 world_size: int | None = None, seed: int = 1234, quiet: bool = False,
                 **_ignored: Any) -> None:
        super().__init__()
        from gpt.checkpoint.weights import load_model
        from gpt.runtime.device import resolve_dtype
        from gpt.runtime.world import init_runtime

        if model is None:
            # The harness's command line: torchrun's variables start the process group.
            runtime = init_runtime(device or "auto")
            model = load_model(checkpoint=checkpoint, init_from=init_from, device=runtime.device,
                               flags=("model_args checkpoint", "model_args init_from"))
            rank, world_size = runtime.rank, runtime.world_size
        gpt = unwrap(model)
        if not isinstance(gpt, GPT):
            raise TypeError(f"expected a GPT model, got {type(gpt).__name__}")
        self.model = model  # what is called: under FSDP the sharded module itself
        self.gpt = gpt
        self._device = next(gpt.parameters()).device
        if isinstance(dtype, str):  # the harness's users write torch's names
            dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
            if dtype not in ("auto", "fp32", "bf16", "fp16"):
                raise HarnessError(f"model_args dtype={dtype!r}: expected auto, fp32, bf16 or "
                                   f"fp16")
        self.dtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, self._device)
        self._rank = rank if rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
        self._world_size = world_size if world_size is not None else (
            dist.get_world_size() if dist.is_initialized() else 1)
        self.batch_size = _positive_int(batch_size, "batch_size", 16)
        self._max_gen_toks = _positive_int(max_gen_toks, "max_gen_toks", 256)
        self.tokenizer = gpt2_tokenizer()
        # Ids past GPT-2's vocabulary are a padded vocabulary's unused rows: never scored
        # nor generated (a Hugging Face export cuts them; the scores must agree).
        self.vocab = min(gpt.config.vocab_size, GPT2_VOCAB)
        self.generator = torch.Generator().manual_seed(seed)
        self.quiet = quiet  # no progress bars of ours (the trainer's log stays readable)
        self._where: list[str] | None = None  # the requests loglikelihood() is scoring

    # -------------------------------------------------------------- the harness's contract

    @property
    def eot_token_id(self) -> int:
        return GPT2_EOT

    @property
    def max_length(self) -> int:
        return self.gpt.config.block_size

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return "gpt2"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        # <|endoftext|> written in a text is the EOT token, as Hugging Face's GPT-2
        # tokenizer reads it.
        return self.tokenizer.encode(string, allowed_special={"<|endoftext|>"})

    def tok_decode(self, tokens: Iterable[int] | int, **kwargs: Any) -> str:
        return self.tokenizer.decode([tokens] if isinstance(tokens, int) else list(tokens))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._world_size <= 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self._world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self._world_size <= 1:
            return [obj]
        out: list[Any] | None = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._world_size > 1:
            dist.barrier()

    # -------------------------------------------------------------- the three requests

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False
                      ) -> list[tuple[float, bool]]:
        """The harness's TemplateLM splits each (context, continuation) into tokens and
        hands them to _loglikelihood_tokens, which refuses, naming the task and document,
        what cannot be scored."""
        where = [_where(r) for r in requests]
        refuse_together([f"{w}: its context and continuation are both empty: nothing to score"
                         for w, r in zip(where, requests) if not r.args[0] and not r.args[1]],
                        self._world_size)
        self._where = where
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm or self.quiet)
        finally:
            self._where = None

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        """(sum of log-probs of the continuation, whether it is the greedy one) of each
        request, in its order. Scored in batches of similar length (longest first); the
        input is the last block_size tokens of context + continuation, less the last,
        which holds the whole continuation wherever it fits in a block: one longer than
        the block size, or empty, is refused before anything is scored (the harness's
        `hf` model cannot score either)."""
        where = self._where if self._where and len(self._where) == len(requests) else None
        problems = []
        for i, (_, _, cont) in enumerate(requests):
            who = where[i] if where else "a request"
            if not cont:
                problems.append(f"{who}: its continuation is empty (no tokens): there is "
                                f"nothing to score")
            elif len(cont) > self.max_length:
                problems.append(f"{who}: its continuation is {len(cont)} tokens, more than the "
                                f"model's block size of {self.max_length}: no window of the "
                                f"model holds it whole")
        refuse_together(problems, self._world_size)
        return agreed(lambda: self._score_tokens(requests), self._world_size)

    def _score_tokens(self, requests: list[Request]) -> list[tuple[float, bool]]:
        order = sorted(range(len(requests)),
                       key=lambda i: (-len(requests[i][1]) - len(requests[i][2]),
                                      tuple(requests[i][1] + requests[i][2])))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            rows = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in chunk]
            width = max(len(r) for r in rows)
            x = torch.zeros(len(rows), width, dtype=torch.long)
            for j, r in enumerate(rows):
                x[j, :len(r)] = torch.tensor(r)  # right-padded: causal, so the pad is unseen
            logits = self._logits(x.to(self._device))
            for j, i in enumerate(chunk):
                cont = requests[i][2]
                end = len(rows[j])
                # Only the positions that predict cont, in fp32: a (batch, block, vocab)
                # fp32 copy of all the logits would be 3 GiB at 16 x 1024 x 50257.
                lp = F.log_softmax(logits[j, end - len(cont):end, :self.vocab].float(), dim=-1)
                target = torch.tensor(cont, device=lp.device)
                out[i] = (lp.gather(1, target[:, None]).sum().item(),
                          bool((lp.argmax(-1) == target).all()))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        """log P(text) of each text: its tokens in disjoint windows of the block size, each
        window conditioned on the tokens before it (EOT before the first), as the
        harness's `hf` model windows them; every window of every text in one batched pass."""
        refuse_together([f"{_where(r)}: the text to score is empty: its perplexities per word "
                         f"and per byte would divide by nothing" for r in requests if not r.args[0]],
                        self._world_size)
        windows: list[Request] = []
        owner: list[int] = []
        for n, req in enumerate(requests):
            (text,) = req.args
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, list(ctx), list(cont)))
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (lp, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[n] += lp
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Text generated from each context until one of its stop strings (or EOT, or
        max_gen_toks tokens), with the stop string and what follows cut off. Contexts are
        cut from the left to leave room for max_gen_toks (as the `hf` model cuts them);
        requests of the same generation settings and context length run as one batch."""
        out: list[str] = [""] * len(requests)
        groups: dict[tuple[str, int], list[tuple[int, list[int]]]] = {}
        settings: dict[str, tuple[dict[str, Any], int]] = {}  # gen_kwargs, max_gen_toks
        problems, prompts = [], []
        for req in requests:  # every request checked before any is generated
            context, gen_kwargs = req.args
            ids = self.tok_encode(context)
            max_new = self._max_new(gen_kwargs)
            if not ids:
                problems.append(f"{_where(req)}: its context is empty: nothing to generate from")
            elif max_new is None or not 0 < max_new < self.max_length:
                asked = gen_kwargs.get("max_gen_toks", self._max_gen_toks)
                problems.append(f"{_where(req)}: max_gen_toks {asked!r} "
                                f"must be a whole number from 1 to {self.max_length - 1}, below "
                                f"the model's block size of {self.max_length}, which holds the "
                                f"context and the generated tokens")
            prompts.append((ids, max_new))
        refuse_together(problems, self._world_size)
        for n, (req, (ids, max_new)) in enumerate(zip(requests, prompts)):
            key = json.dumps(req.args[1], sort_keys=True, default=str)
            settings[key] = (dict(req.args[1]), max_new)
            ids = ids[-(self.max_length - max_new):]
            groups.setdefault((key, len(ids)), []).append((n, ids))

        def generate_all() -> list[str]:
            for (key, _), items in sorted(groups.items(), key=lambda kv: -kv[0][1]):
                for start in range(0, len(items), self.batch_size):
                    chunk = items[start:start + self.batch_size]
                    texts = self._generate([ids for _, ids in chunk], *settings[key])
                    for (n, _), text in zip(chunk, texts):
                        out[n] = text
            return out

        return agreed(generate_all, self._world_size)

    # -------------------------------------------------------------- the model itself

    @torch.no_grad()
    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        width = 2 if self.dtype in (torch.bfloat16, torch.float16) else 4
        check_free_memory(x.numel() * self.gpt.config.vocab_size * width, self._device,
                          f"batch_size {self.batch_size} (a forward of {x.size(0):,} rows x "
                          f"{x.size(1):,} tokens: its logits)", "lower it (gpt.evaluate's "
                          f"--tasks-batch-size, batch_size= in gpt2-lm-eval's --model_args)")
        was_training = self.gpt.training
        self.gpt.eval()
        try:
            with autocast(self._device.type, self.dtype):
                logits, _ = self.model(x)
        finally:
            self.gpt.train(was_training)
        return logits

    def _max_new(self, gen_kwargs: dict[str, Any]) -> int | None:
        """The request's max_gen_toks (else the model's), or None if it is not a number."""
        value = gen_kwargs.get("max_gen_toks", self._max_gen_toks)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return None
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if number.is_integer() else None

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], gen_kwargs: dict[str, Any],
                  max_new: int) -> list[str]:
        """Generate from prompts of one length together (prefill, then one token a step
        from the KV cache); each row stops at a stop string, EOT or max_gen_toks."""
        until = gen_kwargs.get("until") or []
        stops = [until] if isinstance(until, str) else list(until)
        temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
        greedy = not gen_kwargs.get("do_sample", False) or temperature == 0.0
        x = torch.tensor(prompts, dtype=torch.long, device=self._device)
        cache = self.gpt.new_kv_cache(x.size(1) + max_new)
        new: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        was_training = self.gpt.training
        self.gpt.eval()
        try:
            for _ in range(max_new):
                with autocast(self._device.type, self.dtype):
                    logits, _ = self.model(x, kv_cache=cache)
                last = logits[:, -1, :self.vocab].float()
                if greedy:
                    nxt = last.argmax(-1)
                else:
                    probs = F.softmax(last / temperature, dim=-1).cpu()
                    nxt = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
                for row, tok in enumerate(nxt.tolist()):
                    if done[row]:
                        continue
                    if tok == GPT2_EOT:
                        done[row] = True
                        continue
                    new[row].append(tok)
                    if stops and any(s in self.tok_decode(new[row]) for s in stops if s):
                        done[row] = True
                if all(done):
                    break
                x = nxt[:, None].to(self._device)
        finally:
            self.gpt.train(was_training)
        texts = []
        for ids in new:
            text = self.tok_decode(ids)
            for s in stops:
                if s:
                    text = text.split(s)[0]
            texts.append(text)
        return texts


def _where(request: Any) -> str:
    """'task NAME, document N' of a harness request (an Instance)."""
    return (f"task {getattr(request, 'task_name', None) or '?'}, document "
            f"{getattr(request, 'doc_id', '?')}")


def _positive_int(value: int | str, name: str, default: int) -> int:
    """model_args arrive as text; 'auto' (the harness's adaptive batch size) is not
    measured here, so it means the default."""
    if value in ("auto", None):
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise HarnessError(f"model_args {name}={value!r}: expected a positive whole number")
    return number


def register() -> None:
    """Make `gpt2-trainer` a model name of the harness (simple_evaluate, its CLI). Called,
    not done at import: importing a module changes no registry."""
    try:
        get_model(MODEL_NAME)
    except (KeyError, ValueError):
        register_model(MODEL_NAME)(GPT2TrainerLM)
