"""A measured child of `prepare` (gpt/bench/prepare/throughput.py): one method run once on
one input, and its figures printed as one JSON line (tokens, seconds, the token stream's
SHA-256, CPU seconds of this process and of its workers).

    python -m gpt.bench.prepare.child --child ours --input X.jsonl --workers 2 --work DIR

The methods: ``baseline`` (``multiprocessing.Pool.imap`` of encode_ordinary, one document
per item, into one growing numpy buffer), ``ours`` (gpt.data.prepare.prepare end to end,
shards written and fsynced) and ``ceiling`` (forked processes encoding their shares of the
documents already in memory, no IPC). Its own module, away from the parent's, so that every
child imports gpt.data.prepare and no torch and all start from the same memory floor; the
parent starts each in a fresh process and samples its memory from outside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np

from gpt.data.prepare import PrepareConfig, prepare
from gpt.data.shards import read_shard
from gpt.data.tokenizer import gpt2_tokenizer

METHODS = ("baseline", "ours", "ceiling")

_enc = None


def _init_baseline() -> None:
    global _enc
    _enc = gpt2_tokenizer()


def _encode_doc(text: str) -> list[int]:
    return _enc.encode_ordinary(text)


def _docs(path: Path):
    with open(path, "rb") as f:
        for line in f:
            yield json.loads(line)["text"]


def run_baseline(path: Path, workers: int, work: Path) -> tuple[int, str]:
    eot = gpt2_tokenizer().eot_token
    buf = np.empty(1 << 20, dtype=np.uint16)
    n = 0
    with mp.Pool(workers, initializer=_init_baseline) as pool:
        for ids in pool.imap(_encode_doc, _docs(path), chunksize=16):
            end = n + 1 + len(ids)
            if end > buf.size:  # grow by doubling, as a list would
                bigger = np.empty(max(end, 2 * buf.size), dtype=np.uint16)
                bigger[:n] = buf[:n]
                buf = bigger
            buf[n] = eot
            buf[n + 1 : end] = ids
            n = end
    return n, hashlib.sha256(buf[:n].tobytes()).hexdigest()


def run_ours(path: Path, workers: int, work: Path) -> tuple[int, str]:
    cfg = PrepareConfig(sources=(str(path),), out_dir=str(work / "shards"), val_tokens=100_000,
                        shard_tokens=1_000_000, workers=workers, progress=False, overwrite=True)
    res = prepare(cfg)
    return res.tokens, ""


_ceiling_docs: list[str] = []


def _ceiling_part(part: tuple[int, int]) -> int:
    i, n = part
    return sum(_enc.encode_to_numpy(d, disallowed_special=()).size + 1 for d in _ceiling_docs[i::n])


def run_ceiling(path: Path, workers: int, work: Path) -> tuple[int, str]:
    """`workers` forked processes, each encoding its share of documents already in memory,
    with no IPC but a count: what any method could reach on these cores at this moment."""
    global _ceiling_docs
    _ceiling_docs = list(_docs(path))  # inherited by the forked workers
    with mp.Pool(workers, initializer=_init_baseline) as pool:
        pool.map(abs, range(workers))  # the workers are up before the clock starts
        t0 = time.perf_counter()
        tokens = sum(pool.map(_ceiling_part, [(i, workers) for i in range(workers)], chunksize=1))
        return tokens, str(time.perf_counter() - t0)


def stream_hash(out: Path) -> str:
    h = hashlib.sha256()
    for split in ("val", "train"):
        for p in sorted(out.glob(f"{split}_*.bin")):
            h.update(read_shard(p).tobytes())
    return h.hexdigest()


def child(method: str, path: Path, workers: int, work: Path) -> None:
    gpt2_tokenizer()  # loading the BPE tables (~1 s) is the same fixed cost for both: not timed
    fn = {"baseline": run_baseline, "ours": run_ours, "ceiling": run_ceiling}[method]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, t0 = time.process_time(), time.perf_counter()
    tokens, digest = fn(path, workers, work)
    seconds = time.perf_counter() - t0
    main_cpu = time.process_time() - cpu0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's workers, once joined
    workers_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if method == "ours":
        digest = stream_hash(work / "shards")  # after the clock stops
    if method == "ceiling":
        seconds, digest = float(digest), ""
    print(json.dumps({"tokens": tokens, "seconds": seconds, "sha256": digest,
                      "main_cpu_s": main_cpu, "workers_cpu_s": workers_cpu}))


def main() -> None:
    """The command line the parent (throughput.measure) runs."""
    parser = argparse.ArgumentParser(prog="python -m gpt.bench.prepare.child")
    parser.add_argument("--child", choices=METHODS, required=True, help="the method to run")
    parser.add_argument("--input", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--work", required=True)
    a = parser.parse_args()
    child(a.child, Path(a.input), a.workers, Path(a.work))


if __name__ == "__main__":
    main()
