"""Text read from a file, made fit to print: one line, control characters escaped.

A message that quotes a file (a lock file's holder, a line of a data file, an error a
library raised about a YAML file, a task name from one) must not let that file write to
the terminal: a newline would split the one-line error a script greps for, and an escape
sequence could recolour, clear or retitle the terminal. one_line() is the one spelling of
such text, for every message that carries it.
"""

from __future__ import annotations

import unicodedata


# Unicode's control (Cc), format (Cf: bidirectional overrides, zero-width characters) and
# line/paragraph separator (Zl, Zp) categories: none prints as itself
_UNPRINTED = ("Cc", "Cf", "Zl", "Zp")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_CHARS = 300  # what a message quotes of a file, at most


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if unicodedata.category(ch) not in _UNPRINTED:
        return ch
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text: str, limit: int | None = MAX_CHARS) -> str:
    """`text` as one printable line: surrounding whitespace stripped, every control or
    format character escaped as Python writes it (\\n, \\x1b, \\u202e), and at most
    `limit` characters of it (None: all), with "..." where it was cut."""
    text = text.strip()
    cut = limit is not None and len(text) > limit
    shown = "".join(_escape(ch) for ch in (text[:limit] if cut else text))
    return shown + "..." if cut else shown
