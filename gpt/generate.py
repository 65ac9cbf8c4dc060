"""`python -m gpt.generate`: text from a trainer checkpoint or OpenAI's GPT-2 weights.

    python -m gpt.generate --init-from gpt2 --prompt "Hello, I'm a language model,"
    python -m gpt.generate --checkpoint runs/x/ckpt_001000.pt --num-samples 4 --seed 0

Sampling itself (KV cache, top-k, temperature) is gpt/eval/sampling.py. The flags are parsed
before torch is imported, so --help and a bad flag answer at once.
"""

from __future__ import annotations

import argparse
import sys

from gpt.core.cli import OneLineParser, check_at_least_one, finite_float
from gpt.core.errors import UserError


# The logits are divided by the temperature in fp32 (at most 3.4e38): a logit of 1e4 over
# 1e-35 is inf, and the probabilities NaN. Above 100 a sample is as good as uniform noise.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-30, 100.0
# One batch of samples: as many as the trainer's --num-samples allows; a million new
# tokens (past the block size, each one a forward over the whole window: hours already).
MAX_SAMPLES, MAX_NEW_TOKENS = 64, 2**20


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m gpt.generate",
        description="Generate text from a trainer checkpoint or OpenAI's GPT-2 weights.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="PATH", help="a checkpoint written by the trainer")
    src.add_argument(
        "--init-from",
        metavar="NAME|DIR",
        help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (downloaded from the Hugging Face hub) "
        "or a local Hugging Face GPT-2 folder",
    )
    p.add_argument("--prompt", default="Hello, I'm a language model,",
                   help="text to continue; empty starts from <|endoftext|> "
                   "(default: \"Hello, I'm a language model,\")")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens generated per sample (default: 64)")
    p.add_argument("--temperature", type=finite_float(0, MAX_TEMPERATURE), default=1.0,
                   help=f"softmax temperature, 0 (greedy decoding) or {MIN_TEMPERATURE:g} to "
                   f"{MAX_TEMPERATURE:g} (default: 1.0)")
    p.add_argument("--top-k", type=int, default=50,
                   help="sample among the k likeliest tokens; 0: all (default: 50)")
    p.add_argument("--num-samples", type=int, default=1,
                   help="samples generated in one batch (default: 1)")
    p.add_argument("--seed", type=int, default=1337, help="sampling seed (default: 1337)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"],
                   help="auto picks cuda > mps > cpu (default: auto)")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="autocast precision; auto: bf16 on CUDA/MPS, fp32 on CPU (default: auto)")
    p.add_argument("--no-stop-at-eot", dest="stop_at_eot", action="store_false",
                   help="keep generating after <|endoftext|>")
    p.add_argument("--no-cache", dest="use_cache", action="store_false",
                   help="recompute the whole context for each token (slow; for checking)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_at_least_one(parser, args, ("max_new_tokens", "num_samples"))
    if args.num_samples > MAX_SAMPLES:
        parser.error(f"--num-samples must be <= {MAX_SAMPLES}, got {args.num_samples:,} (one "
                     f"batch, as the trainer's; run the command again for more samples)")
    if args.max_new_tokens > MAX_NEW_TOKENS:
        parser.error(f"--max-new-tokens must be <= {MAX_NEW_TOKENS:,}, got "
                     f"{args.max_new_tokens:,}")
    if 0 < args.temperature < MIN_TEMPERATURE:
        parser.error(f"--temperature {args.temperature}: must be 0 (greedy) or at least "
                     f"{MIN_TEMPERATURE:g} (the logits divided by it overflow below that)")
    if args.top_k < 0:
        parser.error(f"--top-k must be >= 0 (0 keeps every token), got {args.top_k}")
    if not 0 <= args.seed < 2**63:
        parser.error(f"--seed must be in [0, 2**63), got {args.seed}")

    import torch  # only once the flags are good: --help answers at once

    from gpt.checkpoint.weights import load_model
    from gpt.data.tokenizer import gpt2_tokenizer
    from gpt.eval.sampling import prompt_ids, sample, sampling_bytes, until_eot
    from gpt.model.sizing import check_free_memory
    from gpt.runtime.device import pick_device, resolve_dtype

    try:
        device = pick_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        tokenizer = gpt2_tokenizer()
        model = load_model(checkpoint=args.checkpoint, init_from=args.init_from, device=device)
        prompt = prompt_ids(tokenizer, args.prompt, model.config.vocab_size)
        check_free_memory(sampling_bytes(model, len(prompt), args.max_new_tokens,
                                         args.num_samples, dtype, args.use_cache), device,
                          f"--num-samples {args.num_samples} x --max-new-tokens "
                          f"{args.max_new_tokens:,} (a {len(prompt):,}-token prompt)",
                          "lower --num-samples or --max-new-tokens")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    gen = torch.Generator().manual_seed(args.seed)
    ids = sample(model, prompt, args.max_new_tokens, num_samples=args.num_samples,
                 temperature=args.temperature, top_k=args.top_k or None,
                 valid_vocab=min(tokenizer.n_vocab, model.config.vocab_size), generator=gen,
                 autocast_dtype=dtype, use_cache=args.use_cache, stop_at_eot=args.stop_at_eot,
                 eot_id=tokenizer.eot_token)
    for i, row in enumerate(ids.tolist()):
        if args.stop_at_eot:
            row = until_eot(row, len(prompt), tokenizer.eot_token)
        print(f"--- sample {i}")
        print(args.prompt + tokenizer.decode(row[len(prompt) :]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
