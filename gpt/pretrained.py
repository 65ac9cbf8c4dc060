"""`python -m gpt.pretrained export`: a trainer checkpoint as a Hugging Face folder, GPT-2's
GPT2LMHeadModel for a GPT-2-shaped model, else a model with its own code beside it
(loaded with trust_remote_code=True).

    python -m gpt.pretrained export --checkpoint runs/x/ckpt_001000.pt --out hf/my-gpt2

The conversion itself is gpt/checkpoint/export.py's export_hf. The flags are parsed before torch
is imported, so --help and a bad flag answer at once.
"""

from __future__ import annotations

import json
import sys

from gpt.core.cli import OneLineParser
from gpt.core.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m gpt.pretrained",
                           description="Write trainer checkpoints as Hugging Face folders.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    exp = sub.add_parser("export", help="write a checkpoint as a Hugging Face folder: GPT-2's "
                         "model, or one with its own code (trust_remote_code=True)")
    exp.add_argument("--checkpoint", required=True, metavar="PATH", help="trainer checkpoint (.pt)")
    exp.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    exp.add_argument("--vocab-size", type=int, default=None,
                     help="rows of the exported vocabulary (default: 50257, GPT-2's)")
    args = parser.parse_args(argv)
    from gpt.checkpoint.export import TOKENIZER_FILES, export_hf  # torch: only now
    from gpt.checkpoint.export_custom import CODE_FILES
    from gpt.checkpoint.weights import CONFIG_FILE

    try:
        out = export_hf(args.checkpoint, args.out, args.vocab_size)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    # export_hf removed the model files that would disagree: those left are this model's
    names = [n for n in (CONFIG_FILE, "model.safetensors", *CODE_FILES, *TOKENIZER_FILES)
             if (out / n).is_file()]
    print(f"wrote {out}: {', '.join(names)}")
    if (out / CODE_FILES[-1]).is_file():
        print(f"its model is not GPT-2's, so its code is in the folder: load it with transformers' "
              f"AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")
        window = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8")).get("attn_window")
        if window:
            print(f"its attention window: {window} positions, the one its weights were last "
                  f"trained with")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
