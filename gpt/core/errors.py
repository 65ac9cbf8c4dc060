"""The one base class of the errors a user can fix.

Every command's main() catches UserError alone, prints its message as one line and
exits with its exit_code; anything else is a bug and keeps its traceback. Each module
defines its own subclass (ConfigError in config.py, DataError in shards.py, ...) beside
the code that raises it.
"""

from __future__ import annotations

from gpt.core.text import one_line


class UserError(Exception):
    """A problem the user can fix; the message names the file, flag or value."""

    exit_code = 1

    def __str__(self) -> str:
        # One line, whatever the message quotes (a file's text, a value from a TOML file,
        # a library's error of several lines): control characters escaped, never printed
        return one_line(super().__str__(), limit=None)
