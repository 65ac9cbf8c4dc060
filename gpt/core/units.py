"""Counts and durations written for people: 1.25M tokens, 3h07m12s."""

from __future__ import annotations


def human_count(n: float) -> str:
    """1234567 -> '1.23M'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m05s'."""
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def human_bytes(n: float) -> str:
    """A size in decimal units, as disks are sold: 19_999_490_048 -> '20.0 GB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
