"""The one base class of the errors a user can fix.

Every command's main() catches UserError alone, prints its message as one line and
exits with its exit_code; anything else is a bug and keeps its traceback. Each module
defines its own subclass (ConfigError in config.py, DataError in shards.py, ...) beside
the code that raises it.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message names the file, flag or value."""

    exit_code = 1
