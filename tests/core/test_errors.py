"""Every command's `error:` line is one line (gpt/core/errors.py), whatever it quotes:
text read from a file is printed with what a terminal would act on escaped
(gpt/core/text.py's one_line)."""

from __future__ import annotations

from gpt.core.errors import UserError
from gpt.core.text import one_line


def test_one_line_escapes_what_a_terminal_would_act_on() -> None:
    assert one_line("  pid 7 on host\n") == "pid 7 on host"
    assert one_line("a\nb\r\tc\x1b[31md\x07\x9b\u202ee\u2028f") == \
        "a\\nb\\r\\tc\\x1b[31md\\x07\\x9b\\u202ee\\u2028f"
    assert one_line("ünïcödé → ok") == "ünïcödé → ok"  # printable text stays as it is
    assert one_line("x" * 400) == "x" * 300 + "..." and len(one_line("x" * 400, None)) == 400


def test_a_user_error_is_one_line_whatever_it_quotes() -> None:
    """The net under every command's `error:` line: a message quoting a file's text (or a
    library's error of several lines) cannot split it or reach the terminal raw."""
    assert str(UserError("bad file: line one\nline two \x1b[2J")) == \
        "bad file: line one\\nline two \\x1b[2J"
