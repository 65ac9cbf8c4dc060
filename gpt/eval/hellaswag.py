"""HellaSwag, completion style: which of 4 endings does the model find likeliest?

Data: the official jsonl (one example a line with "ctx", "endings" (4 strings) and
"label" (0-3); other fields are ignored), from a local path or downloaded once from its
public URL into a cache folder. The official validation set is known by its content (its
size and sha256, the file every published score was taken on): a copy that is not it is
never scored as it, whatever its name, and a set of the user's own (a file, or a download
from another address, cached under a name of its own) is scored under its own name.

Scoring: each candidate is the context tokens followed by the ending's tokens (the ending
tokenized with a leading space, as it follows the context). The model's cross-entropy is
taken over the ending tokens only. `acc` picks the ending with the lowest summed loss;
`acc_norm` the lowest mean loss over the completion tokens (which removes the bias to
short endings). Ties go to the lower index. Reference: OpenAI's GPT-2 124M scores
acc_norm 0.2955 on the 10,042 validation examples this way.

Batching: the 4 candidates of `batch_examples` examples go through one forward, padded to
a fixed shape (batch_examples * 4 rows, seq_len tokens). seq_len is computed once from
the whole set (its longest candidate, rounded up to a multiple of 64, at most the block
size) and the last batch is filled with masked dummy rows, so a torch.compile'd model
sees one input shape for the whole run and never recompiles per example. A candidate
longer than the block size loses context tokens from the left.

Distributed: example i is scored by rank i % world_size; the correct/total counts are
summed over ranks with an all-reduce, so every rank returns the same result. Every rank
runs the same number of forwards (the ranks with fewer examples add dummy batches), so
the model may be the one the trainer calls: plain, compiled, DDP- or FSDP-wrapped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpt.core.text import one_line
from gpt.data.tokenizer import GPT2_EOT, gpt2_tokenizer
from gpt.eval.hellaswag_source import (  # noqa: F401  (where a set comes from; named here too)
    VAL_NAME, VAL_URL, HellaSwagError, address, cached_path, check_reachable, default_cache_dir,
    fetch, is_official, set_name)
from gpt.model.transformer import unwrap
from gpt.runtime.device import autocast


VAL_EXAMPLES = 10042
REFERENCE_ACC_NORM = {"gpt2": 0.2955}  # OpenAI GPT-2 124M, completion style, validation set
NUM_ENDINGS = 4
PAD_MULTIPLE = 64


class Tokenizer(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Example:
    context: tuple[int, ...]
    endings: tuple[tuple[int, ...], ...]  # NUM_ENDINGS token sequences
    label: int


# ---------------------------------------------------------------------------- data


MAX_LINE_BYTES = 2**20  # an example is a few kB: a longer "line" is not HellaSwag's


def _records(path: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The validated records of a HellaSwag jsonl file, in order, the first `limit` of
    them (None: all); an error names the file and line, quoting nothing of it raw."""
    if not path.is_file():
        raise HellaSwagError(f"{path}: no such HellaSwag file (the validation set is at {VAL_URL})")
    found = 0
    try:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
                where = f"{path}:{lineno}"
                if len(raw) > MAX_LINE_BYTES:
                    raise HellaSwagError(f"{where}: a line of over {MAX_LINE_BYTES:,} bytes: not "
                                         f"HellaSwag's JSONL (one example a line)")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise HellaSwagError(f"{where}: not UTF-8 text: not HellaSwag's "
                                         f"JSONL") from None
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise HellaSwagError(f"{where}: not valid JSON ({e.msg})") from None
                yield _check_record(rec, where)
                found += 1
                if limit is not None and found >= limit:
                    return
    except OSError as e:
        raise HellaSwagError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not found:
        raise HellaSwagError(f"{path}: no examples in the file")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The validated records of a HellaSwag jsonl file (ctx, endings, label)."""
    return list(_records(Path(path)))


def check_file(path: str | os.PathLike) -> None:
    """A HellaSwagError naming the file and line if any example of a local HellaSwag file
    is not what the scorer reads (a JSON object with ctx, four endings and a label): before
    a run (the trainer's preflight, so its dry run too), every line, as the run will read
    them (the validation set's 10,042 in a fraction of a second), so that no line the dry
    run passed stops the run."""
    for _ in _records(Path(path)):
        pass


def _check_record(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise HellaSwagError(f"{where}: expected a JSON object with ctx, endings and label")
    if not isinstance(rec.get("ctx"), str):
        raise HellaSwagError(f"{where}: missing or non-string 'ctx'")
    endings = rec.get("endings")
    if not (isinstance(endings, list) and len(endings) == NUM_ENDINGS
            and all(isinstance(e, str) for e in endings)):
        raise HellaSwagError(f"{where}: 'endings' must be a list of {NUM_ENDINGS} strings")
    label = rec.get("label")
    if isinstance(label, str) and label.isdigit():
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < NUM_ENDINGS:
        raise HellaSwagError(f"{where}: 'label' must be an integer 0-{NUM_ENDINGS - 1}, got "
                             f"{one_line(repr(rec.get('label')), 60)} (the test split has no "
                             f"labels)")
    return {"ctx": rec["ctx"], "endings": endings, "label": label}


def tokenize(record: dict[str, Any], tokenizer: Tokenizer) -> Example:
    """Context tokens, and each ending tokenized with the leading space it follows on."""
    context = list(tokenizer.encode_ordinary(record["ctx"]))
    if not context:  # the first ending token needs a position to be predicted from
        context = [getattr(tokenizer, "eot_token", GPT2_EOT)]
    endings = tuple(tuple(tokenizer.encode_ordinary(" " + e)) for e in record["endings"])
    return Example(tuple(context), endings, int(record["label"]))


class HellaSwagSet(list):
    """A set's tokenized examples (a list of Example), and the name its scores go under
    (see set_name)."""

    def __init__(self, name: str, examples: list[Example]) -> None:
        super().__init__(examples)
        self.name = name


def load_examples(
    source: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    rank: int = 0,
    tokenizer: Tokenizer | None = None,
    max_examples: int | None = None,
) -> HellaSwagSet:
    """Read and tokenize HellaSwag: a local jsonl path, an http(s) URL, or None (or "val")
    for the official validation set, downloaded once into cache_dir (see `fetch`).
    Every rank gets every example (evaluate() picks its share)."""
    text = address(source)
    path = fetch(text, cache_dir, rank) if text.startswith(("http://", "https://")) else Path(text)
    records = read_jsonl(path)
    if max_examples is not None:
        records = records[:max_examples]
    if tokenizer is None:
        tokenizer = gpt2_tokenizer()
    return HellaSwagSet(set_name(text, path), [tokenize(r, tokenizer) for r in records])


# ---------------------------------------------------------------------------- scoring


def pad_length(examples: Sequence[Example], block_size: int, multiple: int = PAD_MULTIPLE) -> int:
    """One padded input length for the whole set: the longest candidate's inputs (context +
    ending - 1 tokens), rounded up to `multiple`, at most block_size."""
    longest = max(len(ex.context) + max(len(e) for e in ex.endings) - 1 for ex in examples)
    return min(block_size, -(-longest // multiple) * multiple)


def build_batch(examples: Sequence[Example | None], seq_len: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, mask) of shape (len(examples) * 4, seq_len), and labels.

    Row 4 * i + j is ending j of example i: inputs are the candidate's tokens but the last,
    targets the tokens but the first, and mask is 1 where the target is an ending token.
    None stands for a dummy example: all-zero rows, mask 0, label -1.
    """
    rows = len(examples) * NUM_ENDINGS
    inputs = torch.zeros(rows, seq_len, dtype=torch.long)
    targets = torch.zeros(rows, seq_len, dtype=torch.long)
    mask = torch.zeros(rows, seq_len)
    labels = torch.full((len(examples),), -1, dtype=torch.long)
    for i, ex in enumerate(examples):
        if ex is None:
            continue
        labels[i] = ex.label
        for j, ending in enumerate(ex.endings):
            tokens = (list(ex.context) + list(ending))[-(seq_len + 1):]  # crop the context's left
            first = max(1, len(tokens) - len(ending))  # index of the first scored token
            n = len(tokens) - 1
            row = i * NUM_ENDINGS + j
            inputs[row, :n] = torch.tensor(tokens[:-1])
            targets[row, :n] = torch.tensor(tokens[1:])
            mask[row, first - 1 : n] = 1.0
    return inputs, targets, mask, labels


@torch.no_grad()
def completion_losses(
    model: nn.Module,
    examples: Sequence[Example | None],
    seq_len: int,
    device: str | torch.device,
    autocast_dtype: torch.dtype = torch.float32,
    valid_vocab: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over the candidates of `examples`: (summed loss, mean loss) over each
    ending's tokens, both (len(examples), 4) fp32, and the labels, on `device`."""
    device = torch.device(device)
    inputs, targets, mask, labels = (t.to(device, non_blocking=True)
                                     for t in build_batch(examples, seq_len))
    with autocast(device.type, autocast_dtype):
        logits, _ = model(inputs)
    logits = logits.float()
    if valid_vocab is not None and valid_vocab < logits.size(-1):
        logits[..., valid_vocab:] = float("-inf")  # a padded vocabulary's never-used ids
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    loss = loss.view_as(mask) * mask
    sums = loss.sum(dim=1).view(-1, NUM_ENDINGS)
    counts = mask.sum(dim=1).view(-1, NUM_ENDINGS).clamp_min(1.0)
    return sums, sums / counts, labels


@torch.no_grad()
def evaluate(
    model: nn.Module,
    examples: Sequence[Example],
    device: str | torch.device,
    autocast_dtype: torch.dtype = torch.float32,
    rank: int = 0,
    world_size: int = 1,
    batch_examples: int = 8,
    seq_len: int | None = None,
    valid_vocab: int | None = None,
) -> dict[str, float | int]:
    """HellaSwag accuracy over `examples`, this rank scoring examples[rank::world_size].

    Returns, identical on every rank: acc (lowest summed loss), acc_norm (lowest mean loss
    over the completion tokens), correct, correct_norm and total (all ranks summed).
    Every forward has the shape (batch_examples * 4, seq_len); seq_len defaults to
    pad_length(examples, the model's block size). All ranks run the same number of
    forwards, so a DDP- or FSDP-wrapped model works.
    """
    if not examples:
        raise ValueError("no HellaSwag examples to evaluate")
    if batch_examples < 1:
        raise ValueError(f"batch_examples must be >= 1, got {batch_examples}")
    device = torch.device(device)
    seq_len = seq_len or pad_length(examples, int(unwrap(model).config.block_size))
    mine: list[Example] = list(examples[rank::world_size])
    # Every rank runs the same number of forwards (rank 0's share is the largest), padding
    # with dummy batches, so a model whose forward is a collective (FSDP) cannot hang. A
    # batch is never larger than that share: more rows would all be dummies.
    largest = len(examples[0::world_size])
    batch_examples = min(batch_examples, largest)
    num_batches = -(-largest // batch_examples)
    was_training = model.training
    model.eval()
    counts = torch.zeros(3, dtype=torch.long, device=device)  # correct, correct_norm, total
    try:
        for b in range(num_batches):
            batch: list[Example | None] = list(mine[b * batch_examples : (b + 1) * batch_examples])
            batch += [None] * (batch_examples - len(batch))  # same shape for the last batch
            sums, means, labels = completion_losses(model, batch, seq_len, device,
                                                    autocast_dtype, valid_vocab)
            real = labels >= 0
            counts[0] += ((sums.argmin(dim=1) == labels) & real).sum()
            counts[1] += ((means.argmin(dim=1) == labels) & real).sum()
            counts[2] += real.sum()
    finally:
        model.train(was_training)
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    correct, correct_norm, total = (int(c) for c in counts.tolist())
    return {
        "acc": correct / max(total, 1),
        "acc_norm": correct_norm / max(total, 1),
        "correct": correct,
        "correct_norm": correct_norm,
        "total": total,
    }
