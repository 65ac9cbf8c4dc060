"""Turn text into the token shards train_gpt2.py reads (format: gpt/data/shards.py).
fineweb.py is its command line (gpt/data/prepare/cli.py).

One pass over the input, in bounded memory:

    records -> pieces -> tasks -> worker processes (tokenize) -> in-order results -> shards

* A *record* is one input document: a ``.txt`` file (or one paragraph of it with
  ``txt_split_on_blank_lines``), one line of a JSON-lines file, one JSON array element,
  one parquet row, one Hugging Face dataset example. Records whose text is empty or null
  (and blank lines) are skipped.
* A record's text is cut into *pieces* of about ``PIECE_CHARS`` characters, only at points
  where GPT-2's pre-tokenizer always splits anyway (see ``split_pieces``), so encoding the
  pieces one by one gives exactly the tokens of the whole text. A huge ``.txt`` file is
  therefore never held in memory, and one long document still spreads over all workers.
* Pieces are grouped into *tasks* of about ``TASK_CHARS`` characters; JSON-lines files go
  to the workers as raw blocks of about ``TASK_CHARS`` bytes of whole lines, which the
  workers parse and cut themselves, so the main process does little more than read files.
  Workers return each task as one compact uint16 array with GPT-2's end-of-text token
  (EOT) before every document, and the results are consumed in input order, so the output
  is byte-identical for any worker count. At most a few tasks are in flight, which bounds
  memory.
* The token stream is cut into ``val_*`` shards (the first ``val_tokens`` tokens; left out,
  the default, or a tenth of an input too small for it: the writer holds the stream's
  start until its size shows) and then ``train_*`` shards of ``shard_tokens`` tokens; the
  last shard may be partial. An input that leaves nothing to train on is refused with
  nothing written. Each shard
  is written atomically, then ``metadata.json`` is rewritten atomically with the shard and
  the stream position (record, piece, token offset) where the next shard starts. A re-run
  with the same settings keeps the finished shards and skips that part of the input
  without tokenizing it; the result is byte-identical to an uninterrupted run.

The stages, one module each, each importing only those above it:

    config     settings, defaults, results, shared constants
    pieces     safe cuts of long texts; a record's text; the tasks the workers get
    hf_source  a Hugging Face dataset -> records -> tasks
    sources    local files (and, through hf_source, datasets) -> records -> tasks
    encode     worker processes: tasks -> tokens, in input order
    writer     the output folder: resume or refuse; shards + metadata.json
    run        prepare(): the stages wired together, with progress
    cli        fineweb.py's flags
"""

from gpt.data.prepare.config import (DEFAULT_DATASET, DEFAULT_OUT, DEFAULT_SHARD_TOKENS,
                                     DEFAULT_SUBSET, DEFAULT_VAL_TOKENS, METADATA_NAME,
                                     PrepareConfig, PrepareError, PrepareResult, available_cpus,
                                     parse_count)
from gpt.data.prepare.encode import encode_pieces
from gpt.data.prepare.pieces import split_paragraphs, split_pieces
from gpt.data.prepare.run import prepare


__all__ = [
    "DEFAULT_DATASET", "DEFAULT_OUT", "DEFAULT_SHARD_TOKENS", "DEFAULT_SUBSET",
    "DEFAULT_VAL_TOKENS", "METADATA_NAME", "PrepareConfig", "PrepareError", "PrepareResult",
    "available_cpus", "encode_pieces", "parse_count", "prepare", "split_paragraphs",
    "split_pieces",
]
