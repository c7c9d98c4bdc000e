"""Chapter 3 (T5 buckets): the book's literal bucket formula against T5's code, the buckets
each side of a bidirectional table uses, and the learned tables drawn in the book's units.

The book's Eq. (2.79) with :math:`n_b + 1` buckets and :math:`h = (n_b + 1)/2` exact ones is
compared three ways: computed literally in double precision (:func:`literal_bucket`, the
code the chapter shows), in exact integer arithmetic (:func:`exact_bucket`), and by the
reference code (:func:`relbias.t5_bucket`, float32 as HuggingFace computes it).
"""

from __future__ import annotations

import math

import torch

from relbias.biases.t5 import t5_bucket
from relbias.book.figures import plot_t5_far_end
from relbias.book.words import and_list

__all__ = [
    "LIBRARY_BIAS_LABEL",
    "bucket_sides",
    "exact_bucket",
    "formula_against_reference",
    "in_library_units",
    "literal_bucket",
    "lab_setting_text",
    "plot_learned_tables",
    "provenance",
    "whole_at",
]

#: The axis label of a bias the library computes: it adds its number after the 1/sqrt(d)
#: scaling, so that number is the book's PE(i, j) divided by sqrt(d) (T5's own u_b, which
#: does not scale at all: the book's footnote 16).
LIBRARY_BIAS_LABEL = r"$\mathrm{PE}(i,j)/\sqrt{d}$"


def literal_bucket(offset: int, n_b: int, dist_max: int):
    """The book's b(i - j) for an offset >= 0, literally, in double precision (a fraction
    where the formula gives one: it indexes no parameter)."""
    half = (n_b + 1) / 2
    if offset < half:
        return offset
    scaled = (math.log(offset) - math.log(half)) / (math.log(dist_max) - math.log(half)) * half
    bucket = min(n_b, half + math.floor(scaled))
    return int(bucket) if bucket == int(bucket) else bucket


def _exact_starts(n_b: int, dist_max: int) -> list[int]:
    """For odd ``n_b``: the first offset x of each logarithmic step k = 1 .. h, the least
    integer with (x/h)^h >= (dist_max/h)^k, i.e. x^h h^k >= dist_max^k h^h (integers only)."""
    h = (n_b + 1) // 2
    starts = []
    for k in range(1, h + 1):
        x = max(h, math.ceil(h * (dist_max / h) ** (k / h)) - 2)  # a float guess, then exact
        while x**h * h**k < dist_max**k * h**h:
            x += 1
        while x > h and (x - 1) ** h * h**k >= dist_max**k * h**h:
            x -= 1
        starts.append(x)
    return starts


def whole_at(offset: int, n_b: int, dist_max: int) -> bool:
    """Whether the scaled logarithm of Eq. (2.79) is exactly a whole number k >= 1 at
    ``offset`` (odd ``n_b``): (offset/h)^h = (dist_max/h)^k, in integers. There a computed
    logarithm's last bit decides the floor, and two correct programs may differ by one
    bucket."""
    h = (n_b + 1) // 2
    return any(offset**h * h**k == dist_max**k * h**h for k in range(1, h + 1))


def exact_bucket(offsets: torch.Tensor, n_b: int, dist_max: int) -> torch.Tensor:
    """The book's b(i - j) for odd ``n_b`` at every offset (>= 0) of ``offsets``, in exact
    integer arithmetic: the floor of the scaled logarithm is the number of logarithmic
    steps whose first offset has been reached."""
    if n_b % 2 == 0:
        raise ValueError(f"the literal formula needs an odd n_b, got {n_b}")
    h = (n_b + 1) // 2
    starts = torch.tensor(_exact_starts(n_b, dist_max))
    offsets = offsets.long()
    steps = torch.searchsorted(starts, offsets, right=True)
    return torch.where(offsets < h, offsets, (h + steps).clamp(max=n_b))


def formula_against_reference(n_bs, dist_maxes, *, reach: int = 4) -> dict:
    """Compare the book's formula, literally (double precision) and exactly (integers), with
    the reference code (:func:`relbias.t5_bucket` with ``n_b + 1`` causal buckets) at every
    offset ``0 .. reach * dist_max``, for every odd ``n_b`` of ``n_bs`` and every
    ``dist_max`` of ``dist_maxes`` above its ``(n_b + 1)/2`` exact buckets.

    Returns ``configurations`` (how many were compared), ``offsets`` (offsets compared in
    all), and ``literal_off`` and ``exact_off``: one ``(n_b, dist_max, offset, formula's
    bucket, reference's bucket)`` per configuration where they disagree, at its first
    disagreeing offset; ``literal_offsets`` counts every disagreeing offset."""
    configurations = offsets_seen = literal_offsets = 0
    literal_off, exact_off = [], []
    for n_b in n_bs:
        if n_b % 2 == 0:
            continue
        for dist_max in dist_maxes:
            if dist_max <= (n_b + 1) // 2:
                continue
            configurations += 1
            offsets = torch.arange(0, reach * dist_max + 1)
            offsets_seen += len(offsets)
            reference = t5_bucket(
                offsets, num_buckets=n_b + 1, max_distance=dist_max, bidirectional=False
            )
            exact = exact_bucket(offsets, n_b, dist_max)
            literal = torch.tensor([literal_bucket(o, n_b, dist_max) for o in offsets.tolist()])
            for found, name in ((literal, "literal"), (exact, "exact")):
                off = (found != reference).nonzero().flatten()
                if len(off):
                    o = int(off[0])
                    row = (n_b, dist_max, o, int(found[o]), int(reference[o]))
                    (literal_off if name == "literal" else exact_off).append(row)
                    if name == "literal":
                        literal_offsets += len(off)
    return {
        "configurations": configurations,
        "offsets": offsets_seen,
        "literal_off": literal_off,
        "literal_offsets": literal_offsets,
        "exact_off": exact_off,
    }


def bucket_sides(num_buckets: int = 32, max_distance: int = 128, reach: int = 1024) -> dict:
    """Which buckets a bidirectional table uses on each side (offsets ``-reach .. reach``):
    ``{"past": ..., "future": ...}``, each with ``buckets`` (sorted) and ``own`` (the
    offsets that have a bucket to themselves, nearest first), and ``unused`` (buckets of
    ``0 .. num_buckets - 1`` that no offset reaches). Past keys are offsets >= 0 (offset 0,
    the query's own position, counts as past), future keys offsets < 0."""
    offsets = torch.arange(-reach, reach + 1)
    buckets = t5_bucket(offsets, num_buckets=num_buckets, max_distance=max_distance)
    out = {}
    for side, chosen in (("past", offsets >= 0), ("future", offsets < 0)):
        offs, bs = offsets[chosen], buckets[chosen]
        own = [int(o) for o, b in zip(offs.tolist(), bs.tolist()) if int((bs == b).sum()) == 1]
        out[side] = {"buckets": sorted(set(bs.tolist())), "own": sorted(own, key=abs)}
    used = set(buckets.tolist())
    out["unused"] = [b for b in range(num_buckets) if b not in used]
    return out


def in_library_units(fig):
    """Label every panel's y axis of a bias figure drawn from the library's numbers with
    :data:`LIBRARY_BIAS_LABEL` (the library adds its bias after the scaling); returns
    ``fig``."""
    for ax in fig.axes:
        if ax.get_ylabel():
            ax.set_ylabel(LIBRARY_BIAS_LABEL)
    return fig


def plot_learned_tables(ablation: dict, longer: dict, **kw):
    """:func:`relbias.book.figures.plot_t5_far_end` (the learned table of every head of one
    seed, after a short and a long training, with the far buckets set to each head's
    minimum) with its axis in the book's units: the library's number is
    PE(i, j)/sqrt(d)."""
    return in_library_units(plot_t5_far_end(ablation, longer, **kw))


def provenance(kind: str) -> str:
    """One line of plain text giving a stored sweep's files, seeds, steps and commits, and how
    to read it (:func:`relbias.lab.results.load_stored`). Plain: an inline ``{glue:md}`` role
    renders neither code spans nor maths."""
    from relbias.lab.results import STORED, describe, load_stored

    names = STORED[kind] if isinstance(STORED[kind], tuple) else (STORED[kind],)
    files = [n if isinstance(n, str) else n[0] for n in names]
    info = describe(load_stored(kind))
    steps = f"{info.get('probe_steps', info['steps']):,}"
    return (
        f'load_stored("{kind}"): {info["seeds"]} seeds, {steps} steps, '
        f"training length {info['train_len']} bytes; stored in {len(files)} "
        + ("file" if len(files) == 1 else "files")
        + " of relbias/lab/results/ (named in relbias.lab.results.STORED), made at "
        + f"commit{'s' if ',' in info['commit'] else ''} "
        + info["commit"]
    )


def lab_setting_text(findings) -> str:
    """The setting box of a lab-notes page (MyST): the book, the model, the text and the
    stored sweeps ``findings`` (kinds of :func:`relbias.lab.results.load_stored`, or
    ``(kind, name)`` pairs that name a sweep with no words of its own) that its sections
    read; unlike :func:`relbias.book.setting.setting_text` it names no live run."""
    from relbias.book import setting
    from relbias.lab import get_config

    medium = get_config("medium")
    sweeps = []
    for entry in findings:
        kind, name = (entry, None) if isinstance(entry, str) else entry
        words = setting._sweep_words(kind)
        if name is not None:  # "<kind> (m_l, steps, seeds)" -> "<name> (kind: m_l, ...)"
            words = f"{name} (`{kind}`: " + words.split(" (", 1)[1]
        sweeps.append(words)
    runs = "**The runs** read here: " + and_list(sweeps)
    lines = [
        setting._model_line(medium),
        setting._text_line(medium),
        runs + ". {ref}`Chapter 1 <sec-setting>` says more.",
    ]
    body = "\n".join(f"- {line}" for line in lines)
    return f":::{{admonition}} The setting\n:class: note\n\n{body}\n:::\n"
