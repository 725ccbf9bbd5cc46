"""Sizes in words for the real-size demo's lines: decimal bytes and parameter counts."""

from __future__ import annotations


def gb(nbytes) -> str:
    """Bytes in decimal units (GB for the real size, MB / kB for the tiny preset); n/a for None."""
    if nbytes is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def count(n: int) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"
