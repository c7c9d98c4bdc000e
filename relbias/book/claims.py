"""A chapter's claims about the stored runs, each given by the one verdict function.

A chapter states its findings in prose and asserts them in one hidden cell tagged
``claims``: a list of claims, each a verdict of :mod:`relbias.lab.stats` (read from a stored
sweep by :mod:`relbias.lab.readings`; the only rule that
decides "lower", "higher", "at the edge", "cannot be told apart", and a curve's "improves",
"degrades", ...) and the answer the prose states. :func:`check` raises, naming every claim
whose verdict is not the stated one, and returns the verdicts for gluing their numbers::

    longer = load_stored("extrapolation_15000")
    CLAIMS = [
        claims.curve(longer, "alibi", "improves"),
        claims.context(longer, "alibi", "no use of the far context shown"),
        claims.methods(longer, "alibi", "kerple_power", 16, "cannot be told apart"),
    ]
    verdicts = claims.check(CLAIMS)

``tests/book/test_claims.py`` runs every chapter's claims cell on its own (it reads stored
results only), so a claim the function does not give fails the tests without executing the
chapter, and a chapter that orders two results without it fails a lint of the chapters.
"""

from __future__ import annotations

from dataclasses import dataclass

from relbias.lab import readings, stats

__all__ = [
    "Claim",
    "ClaimError",
    "accuracy",
    "check",
    "context",
    "curve",
    "methods",
    "paired",
]


class ClaimError(AssertionError):
    """A chapter states a verdict that the verdict function does not give."""


@dataclass(frozen=True)
class Claim:
    """One stated verdict: its ``name`` (the key :func:`check` returns it under), the
    ``verdict`` the function gives (a dict with ``"answer"``) and the ``expect``\\ ed
    answer the chapter states."""

    name: str
    verdict: dict
    expect: str

    @property
    def holds(self) -> bool:
        return self.verdict["answer"] == self.expect


def _claim(name: str, verdict: dict, expect: str, answers) -> Claim:
    if expect not in answers:
        raise ValueError(f"claim {name!r}: expect must be one of {list(answers)}, got {expect!r}")
    return Claim(name, verdict, expect)


def curve(results: dict, method: str, expect: str, *, name: str | None = None, **kw) -> Claim:
    """``method``'s curve over the stored lengths reads ``expect`` (one of
    :data:`relbias.lab.stats.CURVE_ANSWERS`): :func:`relbias.lab.readings.method_curve`."""
    verdict = readings.method_curve(results, method, **kw)
    return _claim(name or f"{method} curve", verdict, expect, stats.CURVE_ANSWERS)


def context(results: dict, method: str, expect: str, *, name: str | None = None) -> Claim:
    """``method``'s use of the context past the training length reads ``expect`` (one of
    the words of :data:`relbias.lab.readings.CONTEXT_WORDS`):
    :func:`relbias.lab.readings.context_verdict`."""
    verdict = readings.context_verdict(results, method)
    verdict = {**verdict, "answer": verdict["words"], "verdict_answer": verdict["answer"]}
    return _claim(name or f"{method} context", verdict, expect, readings.CONTEXT_WORDS.values())


def methods(
    results: dict,
    a: str,
    b: str,
    factor: int,
    expect: str,
    *,
    other: dict | None = None,
    name: str | None = None,
) -> Claim:
    """``a``'s bits per byte at ``factor`` x the training length lies ``expect`` (one of
    :data:`relbias.lab.stats.ANSWERS`) ``b``'s: :func:`relbias.lab.readings.methods_verdict`
    (paired by seed; ``other``: ``b``'s results when they come from another sweep)."""
    verdict = readings.methods_verdict(results, a, b, factor, other=other)
    return _claim(name or f"{a} vs {b} at {factor}x", verdict, expect, stats.ANSWERS)


def accuracy(
    results: dict,
    a: str,
    b: str,
    length: int,
    expect: str,
    *,
    distance: int | None = None,
    name: str | None = None,
) -> Claim:
    """``a``'s recall accuracy lies ``expect`` ``b``'s at one length and distance:
    :func:`relbias.lab.readings.accuracy_verdict`."""
    verdict = readings.accuracy_verdict(results, a, b, length, distance)
    return _claim(name or f"{a} vs {b} recall at {length}", verdict, expect, stats.ANSWERS)


def paired(name: str, a, b, expect: str, *, error: float | None = None) -> Claim:
    """Any other paired comparison, per-seed values ``a`` against ``b`` (the same seeds in
    the same order, or ``b=None`` for differences against 0): :func:`relbias.lab.stats.verdict`
    with ``paired=True``."""
    return _claim(name, stats.verdict(a, b, paired=True, error=error), expect, stats.ANSWERS)


def check(claims) -> dict:
    """Raise :class:`ClaimError` naming every claim of ``claims`` whose verdict is not the
    stated one; return ``{name: verdict}``."""
    claims = list(claims)
    names = [c.name for c in claims]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"claim names must be unique, got {twice} more than once")
    wrong = [c for c in claims if not c.holds]
    if wrong:
        lines = [
            f"  {c.name}: the chapter says {c.expect!r}, the verdict is {c.verdict['answer']!r}"
            + _numbers(c.verdict)
            for c in wrong
        ]
        raise ClaimError("claims the verdict function does not give:\n" + "\n".join(lines))
    return {c.name: c.verdict for c in claims}


def _numbers(v: dict) -> str:
    if "low" in v and "high" in v and v.get("n", 0) > 1 and "mean" in v:
        gap = v.get("gap")
        err = v.get("error")
        extra = f", gap {gap:.4f}" if isinstance(gap, float) else ""
        extra += f", error {err:.4f}" if isinstance(err, float) else ""
        return f" (difference {v['mean']:.4f} [{v['low']:.4f}, {v['high']:.4f}]{extra})"
    return ""
