"""Prose from lists, as the chapters write it."""

from __future__ import annotations

__all__ = ["and_list"]


def and_list(items) -> str:
    """``items`` (strings, in order) as prose: "a", "a and b", "a, b and c"."""
    words = [str(w) for w in items]
    if not words:
        raise ValueError("items must hold at least one entry")
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " and " + words[-1]
