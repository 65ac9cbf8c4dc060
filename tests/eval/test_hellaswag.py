"""HellaSwag: file checks, completion scoring with known answers, batching, ranks, compile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.core.config import model_preset
from gpt.eval import hellaswag
from gpt.eval.hellaswag import Example, HellaSwagError, build_batch, completion_losses, evaluate
from gpt.model.transformer import GPT

from helpers import served_folder

# ---------------------------------------------------------------------------- fixtures

# Per-token losses the stub model gives each ending word, whatever comes before it.
WORD_LOSS = {"good": 1.0, "ok": 2.0, "meh": 2.5, "bad": 3.0}
CONTEXT_LOSS = 7.0  # context words: counting one by mistake would change every answer
CONTEXT_WORDS = ["the", "man", "a", "dog", "runs", "then", "she", "sits", "down", "and"]

# (context, endings, label) -> expected (acc right?, acc_norm right?)
MINI_SET = [
    ("the man", ["good", "bad", "bad bad", "meh"], 0),  # sums 1 3 6 2.5, means 1 3 3 2.5
    ("a dog runs", ["ok", "good good good good", "bad", "meh meh"], 1),  # sums pick 0, means 1
    ("then she", ["bad bad bad", "ok", "good good good", "meh"], 0),  # sums 1, means 2: both wrong
    ("she sits down", ["meh", "ok ok", "good", "bad"], 2),  # both right
    ("the dog and", ["meh", "good good good", "bad", "bad"], 0),  # sums 0 right, means 1 wrong
    ("a man", ["bad", "good good good good", "ok ok", "meh meh meh"], 1),  # sums 0, means 1
]
MINI_ACC, MINI_ACC_NORM = 3, 4  # of 6


class WordTokenizer:
    """Whitespace tokenizer over a fixed vocabulary: id 0 is <|endoftext|>."""

    eot_token = 0

    def __init__(self) -> None:
        words = [*CONTEXT_WORDS, *WORD_LOSS]
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.vocab_size = len(words) + 2  # + EOT + a filler token holding the spare probability

    def encode_ordinary(self, text: str) -> list[int]:
        return [self.ids[w] for w in text.split()]


class UnigramStub(nn.Module):
    """A model whose next-token distribution is fixed: loss(token) is set by the test."""

    def __init__(self, tok: WordTokenizer, block_size: int = 256) -> None:
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size)
        loss = torch.full((tok.vocab_size,), 30.0)
        for w, i in tok.ids.items():
            loss[i] = WORD_LOSS.get(w, CONTEXT_LOSS)
        p = torch.exp(-loss.double())
        filler = tok.vocab_size - 1
        p[filler] = 1.0 - (p.sum() - p[filler])  # so that log p is exactly -loss
        self.register_buffer("log_p", p.log().float())
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        self.shapes.append(tuple(idx.shape))
        return self.log_p.expand(*idx.shape, -1).clone(), None


def write_jsonl(path: Path, items: list[tuple[str, list[str], int]]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for n, (ctx, endings, label) in enumerate(items):
            # The official format, with its extra fields.
            fh.write(json.dumps({"ind": n, "activity_label": "Test", "ctx_a": ctx, "ctx_b": "",
                                 "ctx": ctx, "split": "val", "split_type": "indomain",
                                 "label": label, "endings": endings, "source_id": f"t~{n}"}) + "\n")
    return path


@pytest.fixture()
def mini_examples(tmp_path: Path) -> list[Example]:
    path = write_jsonl(tmp_path / "mini.jsonl", MINI_SET)
    return hellaswag.load_examples(path, tokenizer=WordTokenizer())


# ---------------------------------------------------------------------------- scoring


def test_known_answers_acc_and_acc_norm(mini_examples: list[Example]) -> None:
    tok = WordTokenizer()
    model = UnigramStub(tok)
    sums, means, labels = completion_losses(model, mini_examples[:2], seq_len=64, device="cpu")
    torch.testing.assert_close(sums, torch.tensor([[1.0, 3.0, 6.0, 2.5], [2.0, 4.0, 3.0, 5.0]]))
    torch.testing.assert_close(means, torch.tensor([[1.0, 3.0, 3.0, 2.5], [2.0, 1.0, 3.0, 2.5]]))
    assert labels.tolist() == [0, 1]
    # 6 examples in batches of 4: the last batch is padded with masked dummy rows.
    result = evaluate(model, mini_examples, "cpu", batch_examples=4)
    assert result == {"acc": MINI_ACC / 6, "acc_norm": MINI_ACC_NORM / 6, "correct": MINI_ACC,
                      "correct_norm": MINI_ACC_NORM, "total": 6}


def test_every_forward_has_one_fixed_shape(mini_examples: list[Example]) -> None:
    model = UnigramStub(WordTokenizer())
    evaluate(model, mini_examples, "cpu", batch_examples=4)
    assert model.shapes == [(16, 64), (16, 64)]  # 4 examples x 4 endings, padded to 64
    assert hellaswag.pad_length(mini_examples, block_size=1024) == 64
    assert hellaswag.pad_length(mini_examples, block_size=8) == 8


def test_every_rank_runs_the_same_number_of_forwards(mini_examples: list[Example]) -> None:
    """A sharded (FSDP) forward is a collective: a rank with fewer examples must not stop early."""
    seven = mini_examples + mini_examples[:1]
    calls = []
    for rank in range(3):  # 3, 2 and 2 examples
        model = UnigramStub(WordTokenizer())
        result = evaluate(model, seven, "cpu", rank=rank, world_size=3, batch_examples=2)
        calls.append(len(model.shapes))
        assert result["total"] == len(seven[rank::3])  # no process group: local counts
    assert calls == [2, 2, 2]


def test_long_candidates_lose_context_from_the_left() -> None:
    ex = Example(context=tuple(range(10, 30)), endings=((1, 2), (3,), (4, 5, 6), (7,)), label=0)
    inputs, targets, mask, labels = build_batch([ex, None], seq_len=8)
    assert inputs.shape == (8, 8) and labels.tolist() == [0, -1]
    tokens = list(range(10, 30)) + [4, 5, 6]
    assert inputs[2].tolist() == tokens[-9:-1] and targets[2].tolist() == tokens[-8:]
    assert mask[2].tolist() == [0] * 5 + [1] * 3  # exactly the three ending tokens
    assert mask[1].sum() == 1 and mask[4:].sum() == 0  # the dummy example scores nothing


def reference_scores(model: GPT, ex: Example) -> tuple[list[float], list[float]]:
    """One unpadded forward per candidate: summed and mean loss over the ending tokens."""
    sums, means = [], []
    for ending in ex.endings:
        tokens = torch.tensor([list(ex.context) + list(ending)])
        logits, _ = model(tokens[:, :-1])
        losses = F.cross_entropy(logits[0], tokens[0, 1:], reduction="none")[-len(ending):]
        sums.append(losses.sum().item())
        means.append(losses.mean().item())
    return sums, means


REAL_SET = [
    ("A man is sitting on a roof. He", ["is using wrap to wrap a pair of skis.",
                                         "is ripping level tiles off.", "is holding a rubik's cube.",
                                         "starts pulling up roofing on a roof."], 3),
    ("A woman is outside with a bucket and a dog. The dog is running around trying to avoid a "
     "bath. She", ["rinses the bucket off with soap and blow dry the dog's head.",
                   "uses a hose to keep it from getting soapy.", "gets the dog wet, then it runs "
                   "away again.", "gets into a bath tub with the dog."], 2),
    ("Then, the man writes over the snow covering the window of a car, and a woman wearing "
     "winter clothes smiles. Then", [", the man adds wax to the windshield and cuts it.",
                                     ", a person board a ski lift, while two men supporting the "
                                     "head of the person wearing winter clothes snow as the we "
                                     "girls sled.", ", the man puts on a christmas coat, knitted "
                                     "with netting.", ", the man continues removing the snow on "
                                     "his car."], 3),
    ("Kids", ["play.", "sleep soundly in a very long bed tonight.", "eat.", "run around."], 0),
    ("The cat", ["sat.", "sat on the mat.", "flew to the moon and back again.", "purred."], 1),
]


@pytest.mark.numerics
def test_batched_scoring_matches_per_candidate_reference(tmp_path: Path, enc) -> None:
    examples = hellaswag.load_examples(write_jsonl(tmp_path / "real.jsonl", REAL_SET),
                                       tokenizer=enc)
    assert examples[0].endings[1] == tuple(enc.encode_ordinary(" is ripping level tiles off."))
    assert examples[3].context == tuple(enc.encode_ordinary("Kids"))
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=128)).eval()
    sums, means, _ = completion_losses(model, examples, seq_len=64, device="cpu")
    acc = acc_norm = 0
    for i, ex in enumerate(examples):
        ref_sums, ref_means = reference_scores(model, ex)
        torch.testing.assert_close(sums[i], torch.tensor(ref_sums), rtol=0, atol=1e-4)
        torch.testing.assert_close(means[i], torch.tensor(ref_means), rtol=0, atol=1e-4)
        acc += min(range(4), key=ref_sums.__getitem__) == ex.label
        acc_norm += min(range(4), key=ref_means.__getitem__) == ex.label
    result = evaluate(model, examples, "cpu", batch_examples=2)
    assert (result["correct"], result["correct_norm"], result["total"]) == (acc, acc_norm, 5)


def test_padded_vocab_ids_can_be_masked_out(mini_examples: list[Example]) -> None:
    tok = WordTokenizer()
    model = UnigramStub(tok)
    with torch.no_grad():
        model.log_p[-1] = 50.0  # the "padding" id soaks up nearly all probability...
    sums, _, _ = completion_losses(model, mini_examples[:1], 64, "cpu")
    assert sums[0, 0] > 40
    masked, _, _ = completion_losses(model, mini_examples[:1], 64, "cpu",
                                     valid_vocab=tok.vocab_size - 1)
    assert masked[0, 0] < 2  # ...unless it is masked as a never-used id


# ---------------------------------------------------------------------------- files


@pytest.mark.parametrize(
    "line,message",
    [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ('["a list"]', r"bad\.jsonl:2: expected a JSON object"),
        ('{"endings": ["a", "b", "c", "d"], "label": 0}', r":2: missing or non-string 'ctx'"),
        ('{"ctx": "x", "endings": ["a", "b", "c"], "label": 0}', r":2: 'endings' must be a list of 4"),
        ('{"ctx": "x", "endings": ["a", "b", "c", "d"]}', r":2: 'label' must be an integer 0-3"),
        ('{"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 4}', r":2: 'label'"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = json.dumps({"ctx": "the man", "endings": ["good", "ok", "bad", "meh"], "label": 0})
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(HellaSwagError, match=message):
        hellaswag.read_jsonl(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(HellaSwagError, match=r"nope\.jsonl: no such HellaSwag file"):
        hellaswag.load_examples(tmp_path / "nope.jsonl", tokenizer=WordTokenizer())
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(HellaSwagError, match="no examples"):
        hellaswag.read_jsonl(tmp_path / "empty.jsonl")


def test_fetch_downloads_once_into_the_cache(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "hellaswag_val.jsonl", MINI_SET[:2])
    cache = tmp_path / "cache"
    url = source.as_uri()  # a file:// URL: urllib fetches it like the real https one
    path = hellaswag.fetch(url, cache)
    assert path == hellaswag.cached_path(url, cache) and path.read_bytes() == source.read_bytes()
    # an address of the user's own keeps a name of its own, whatever its file's name
    assert path.parent == cache and path.name.endswith("-hellaswag_val.jsonl")
    source.unlink()
    assert hellaswag.fetch(url, cache) == path  # served from the cache, not fetched again
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary left
    with pytest.raises(HellaSwagError, match="could not download") as e:
        hellaswag.fetch((tmp_path / "gone.jsonl").as_uri(), cache)
    # offline, the error names where to put a copy and the flag of each command that takes one
    gone = hellaswag.cached_path((tmp_path / "gone.jsonl").as_uri(), cache)
    assert f"copy the file to {gone}" in str(e.value)
    assert "--hellaswag FILE to python -m gpt.evaluate" in str(e.value)
    assert "--hellaswag-file FILE to the trainer" in str(e.value)


# ---------------------------------------------------------------------------- the official set


@pytest.fixture()
def official(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file standing in for the official validation set: the identity the code checks
    (size and sha256) made this file's; the official address is kept as it is."""
    import hashlib

    from gpt.eval import hellaswag_source

    path = write_jsonl(tmp_path / "official.jsonl", MINI_SET)
    monkeypatch.setattr(hellaswag_source, "VAL_BYTES", path.stat().st_size)
    monkeypatch.setattr(hellaswag_source, "VAL_SHA256",
                        hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setattr(hellaswag_source, "_identified", {})
    return path


def test_a_download_of_the_same_file_name_never_stands_in_for_the_official_set(
        tmp_path: Path, official: Path) -> None:
    (tmp_path / "srv").mkdir()  # a mirror's file of the same name, not the official file
    mirror = write_jsonl(tmp_path / "srv" / "hellaswag_val.jsonl", MINI_SET[:2])
    cache = tmp_path / "cache"
    with served_folder(tmp_path / "srv") as base:
        url = f"{base}/hellaswag_val.jsonl"
        mine = hellaswag.load_examples(url, cache, tokenizer=WordTokenizer())
    assert len(mine) == 2 and mine.name == url  # scored under its own name
    assert not (cache / "hellaswag_val.jsonl").exists()  # not where the official set is kept
    # a copy under the official set's own name is not it either: with no network, one line
    (cache / "hellaswag_val.jsonl").write_bytes(mirror.read_bytes())
    from gpt.core import network

    network._answers[("raw.githubusercontent.com", 443)] = "cannot connect (no network)"
    for source in ("val", None, hellaswag.VAL_URL):
        with pytest.raises(HellaSwagError, match=r"the copy at .*hellaswag_val\.jsonl is not "
                           r"HellaSwag's validation set .* cannot be downloaded"):
            hellaswag.load_examples(source, cache, tokenizer=WordTokenizer())
        with pytest.raises(HellaSwagError, match="is not HellaSwag's validation set"):
            hellaswag.check_reachable(source, cache)  # the preflight's question: the same answer
    # the official file, cached: scored as the validation set, under its name
    (cache / "hellaswag_val.jsonl").write_bytes(official.read_bytes())
    hellaswag.check_reachable("val", cache)
    val = hellaswag.load_examples("val", cache, tokenizer=WordTokenizer())
    assert len(val) == 6 and val.name == hellaswag.VAL_NAME == "val"
    # known by its content wherever it is: a local copy of it, and a file that is not it
    assert hellaswag.load_examples(official, tokenizer=WordTokenizer()).name == "val"
    assert hellaswag.load_examples(mirror, tokenizer=WordTokenizer()).name == str(mirror)


def test_what_the_official_address_sends_is_checked_before_it_is_scored(
        tmp_path: Path, official: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt.eval import hellaswag_source

    (tmp_path / "srv").mkdir()  # the official address answering with another file
    served = write_jsonl(tmp_path / "srv" / "hellaswag_val.jsonl", MINI_SET[:3])
    with served_folder(tmp_path / "srv") as base:
        monkeypatch.setattr(hellaswag_source, "VAL_URL", f"{base}/hellaswag_val.jsonl")
        with pytest.raises(HellaSwagError, match=r"is not the official validation set .* not "
                           r"scored as it"):
            hellaswag.load_examples("val", tmp_path / "cache", tokenizer=WordTokenizer())
        served.write_bytes(official.read_bytes())  # the official file: fetched over the bad copy
        val = hellaswag.load_examples("val", tmp_path / "cache", tokenizer=WordTokenizer())
    assert val.name == "val" and len(val) == 6


def test_max_examples(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mini.jsonl", MINI_SET)
    assert len(hellaswag.load_examples(path, tokenizer=WordTokenizer(), max_examples=2)) == 2


# ---------------------------------------------------------------------------- ranks, compile


def tiny_word_model() -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=64, vocab_size=WordTokenizer().vocab_size)).eval()


SPLIT_SET = MINI_SET + MINI_SET[:1]  # 7 examples: the ranks get 4 and 3


def _rank_worker(rank: int, world_size: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank,
                            world_size=world_size)
    try:
        examples = hellaswag.load_examples(Path(folder) / "split.jsonl", rank=rank,
                                           tokenizer=WordTokenizer())
        result = evaluate(tiny_word_model(), examples, "cpu", rank=rank, world_size=world_size,
                          batch_examples=2)
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    path = write_jsonl(tmp_path / "split.jsonl", SPLIT_SET)
    examples = hellaswag.load_examples(path, tokenizer=WordTokenizer())
    single = evaluate(tiny_word_model(), examples, "cpu", batch_examples=2)
    assert single["total"] == 7
    mp.spawn(_rank_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == single


@pytest.mark.slow
def test_compiled_model_compiles_once_for_all_batches(mini_examples: list[Example]) -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    model = tiny_word_model()
    compiled = torch.compile(model, backend=counter)
    eager = evaluate(model, mini_examples, "cpu", batch_examples=2)
    assert evaluate(compiled, mini_examples, "cpu", batch_examples=2) == eager  # 3 batches
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_reference_figure_is_documented() -> None:
    assert hellaswag.REFERENCE_ACC_NORM["gpt2"] == 0.2955 and hellaswag.VAL_EXAMPLES == 10042
    assert os.path.basename(hellaswag.VAL_URL) == "hellaswag_val.jsonl"
