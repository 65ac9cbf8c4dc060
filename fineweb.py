"""Prepare GPT-2 token shards for train_gpt2.py.

    python fineweb.py --source input.txt --out data/shakespeare --val-tokens 30000

This version reads local plain-text files and folders of them (each file one document).
"""

from __future__ import annotations

import argparse
import sys
import time

from gpt.data import DataError
from gpt.tokenizer import gpt2_tokenizer
from gpt.prepare import PrepareConfig, text_files, token_stream, write_shards


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", nargs="+", required=True, help=".txt files or folders of them")
    p.add_argument("--out", required=True, help="output folder for train_*/val_* shards")
    p.add_argument("--val-tokens", type=int, default=10_000, help="tokens for validation (first)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    args = p.parse_args(argv)
    if args.val_tokens < 0 or args.shard_tokens < 1:
        p.error("--val-tokens must be >= 0 and --shard-tokens >= 1")
    cfg = PrepareConfig(tuple(args.source), args.out, args.val_tokens, args.shard_tokens)
    t0 = time.perf_counter()
    try:
        files = text_files(cfg.sources)
        paths = write_shards(token_stream(files, gpt2_tokenizer()), cfg)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} shards to {cfg.out_dir} in {time.perf_counter() - t0:.1f}s:")
    for path in paths:
        print(f"  {path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
