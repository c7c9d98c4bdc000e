"""Chapter 6's reading of FIRE's inputs and of the stored FIRE ablation.

- :func:`psi`, :func:`trained_offset_alike`: FIRE's log transform, and which offset of a
  training row gives a key of a longer row its input (the squeeze past the threshold);
- :func:`eval_input_range`, :func:`clamp_applies`: whether an ablation's clamp changes any
  input of a reading at all (a clamp into a range that already holds every input the
  reading needs is empty by construction: its reading *is* the model as trained);
- :func:`clamp_cell`, :func:`plot_fire_clamps`: the clamped readings as a table cell and a
  figure, with "n/a" where a clamp is empty;
- :func:`learned_c_L`, :func:`near_gap_offsets`: a stored run's learned ``c`` and ``L``
  (every stored FIRE record keeps them), and which offsets of a long row get an input below
  any that the training rows produce at the learned ``c`` and ``L``;
- :func:`stored_fire`, :func:`trained_rows`, :func:`plot_trained_rows`: a stored trained
  FIRE (the 3,000-step sweep keeps its weights), its MLP input and bias at given queries,
  and the figure of both (the mechanism on the trained model);
- :func:`context_against`: one method's context-use difference minus another's, paired by
  seed, against the text's error of that difference of differences.

The ablation's records (:func:`relbias.lab.ablations.fire_variants`) keep, per seed, the
learned ``c`` and ``L`` and the smallest and largest nonzero input the training rows
produce at them (``min_trained_input``, ``max_trained_input``); a clamp lifts the inputs
below the first to it (``clamp_near``), lowers those above the second to it (``clamp_far``),
or both.
"""

from __future__ import annotations

import math
import re

import torch

from relbias.book.plots import figure
from relbias.book.sweeps import show_interval
from relbias.lab.interventions import intervention_at, intervention_effect
from relbias.lab.readings import at_factor, row_at
from relbias.lab.stats import text_error, verdict

__all__ = [
    "FIRE_CLAMPS",
    "clamp_applies",
    "clamp_cell",
    "context_against",
    "eval_input_range",
    "learned_c_L",
    "near_gap_offsets",
    "plot_fire_clamps",
    "plot_trained_rows",
    "psi",
    "stored_fire",
    "trained_offset_alike",
    "trained_rows",
]

#: The clamps of the stored FIRE ablation, in the order its records hold them.
FIRE_CLAMPS = ("clamp_near", "clamp_far", "clamp_both")
#: Inputs are stored with 5 decimals: closer than this counts as the same input.
TOLERANCE = 1e-4


def psi(c: float, x: float) -> float:
    """FIRE's log transform ``log(|c| x + 1)``."""
    return math.log1p(abs(c) * x)


def trained_offset_alike(c: float, L: float, offset: float, query: int, train_len: int) -> float:
    """The offset ``d'`` whose input in the last row of training (query ``train_len - 1``)
    equals the input of ``offset`` at ``query``:
    ``psi(d') / psi(max(L, m_l - 1)) = psi(offset) / psi(max(L, query))``. In that row
    itself ``d' = offset``; a key of a later query past the threshold reads the input that
    training gave a nearer key (``d' < offset``)."""
    if offset < 0 or query < 0 or train_len < 1:
        raise ValueError(
            f"offset and query must be >= 0 and train_len >= 1, got {offset}, {query}, {train_len}"
        )
    target = psi(c, offset) * psi(c, max(L, train_len - 1)) / psi(c, max(L, query))
    return math.expm1(target) / abs(c)


def eval_input_range(record: dict, length: int) -> tuple[float, float]:
    """The smallest nonzero and the largest MLP input of a reading of ``length`` tokens by the
    model of ``record`` (one seed of the ablation: its learned ``c`` and ``L``): offset 1 and
    the farthest key of the last query ``length - 1``, over ``psi(max(L, length - 1))``."""
    if length < 2:
        raise ValueError(f"length must be >= 2 (a nonzero offset), got {length}")
    c, L = record["c"], record["L"]
    last = length - 1
    denominator = psi(c, max(L, last))
    return psi(c, 1) / denominator, psi(c, last) / denominator


def clamp_applies(ablation: dict, variant: str, clamp: str, factor: int) -> bool:
    """Whether ``clamp`` changes any input of ``variant``'s reading at ``factor`` x the
    training length in at least one seed: ``clamp_near`` where the reading's smallest nonzero
    input lies below the smallest trained one, ``clamp_far`` where its largest lies above the
    largest trained one, ``clamp_both`` where either does. Where it changes none the clamped
    reading is the model as trained, by construction (a table shows "n/a")."""
    if clamp not in FIRE_CLAMPS:
        raise ValueError(f"clamp must be one of {FIRE_CLAMPS}, got {clamp!r}")
    applies = []
    for record in ablation["methods"][variant]["seeds"].values():
        low, high = eval_input_range(record, row_at(record, factor)["length"])
        near = low < record["min_trained_input"] - TOLERANCE
        far = high > record["max_trained_input"] + TOLERANCE
        applies.append({"clamp_near": near, "clamp_far": far, "clamp_both": near or far}[clamp])
    return any(applies)


def clamp_cell(ablation: dict, variant: str, clamp: str, factor: int) -> str:
    """A table cell: what ``clamp`` does to ``variant``'s bits per byte at ``factor`` x, the
    paired change (clamped minus as trained, the same weights read twice:
    :func:`relbias.lab.interventions.intervention_effect`) with 4 decimals and its verdict,
    or ``"n/a (changes no input)"`` where the clamp is empty by construction."""
    if not clamp_applies(ablation, variant, clamp, factor):
        return "n/a (changes no input)"
    effect = intervention_effect(ablation, variant, clamp, factor)
    return f"{show_interval(effect, 4)}: {effect['answer']}"


def plot_fire_clamps(
    ablation: dict, variants, factor: int, clamps=("clamp_near", "clamp_far"), *, width=8.0
):
    """Bits per byte at ``factor`` x for each variant as trained and with each clamp that
    changes any of its inputs (mean over seeds, bar: 95 % interval), one group per variant;
    a clamp that changes no input is not drawn and reads "n/a". A dotted line per group marks
    the variant's reading at the training length."""
    fig, ax = figure(width, 3.4)
    readings = ["as trained", *clamps]
    step = 0.8 / len(readings)
    handles = {}
    for k, variant in enumerate(variants):
        trained = at_factor(ablation, variant, factor)
        ax.hlines(
            at_factor(ablation, variant, 1)["mean"],
            k - 0.45,
            k + 0.45,
            colors="grey",
            linestyles=":",
            lw=1,
        )
        for r, reading in enumerate(readings):
            x, color = k - 0.4 + step * (r + 0.5), f"C{r}"
            if reading != "as trained" and not clamp_applies(ablation, variant, reading, factor):
                ax.annotate(
                    "n/a", (x, trained["mean"]), ha="center", va="center", fontsize=8, color=color
                )
                continue
            iv = (
                trained
                if reading == "as trained"
                else intervention_at(ablation, variant, reading, factor)
            )
            err = [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]
            handles[reading] = ax.errorbar(
                [x], [iv["mean"]], yerr=err, fmt="o", ms=4, capsize=3, color=color
            )
    ax.set_xticks(range(len(variants)), list(variants))
    ax.set_ylabel(f"bits per byte at {factor}x")
    shown = [r for r in readings if r in handles]
    fig.legend(
        [handles[r] for r in shown], shown, loc="outside lower center", ncol=len(shown), fontsize=8
    )
    return fig


def learned_c_L(record: dict) -> tuple[float, float]:
    """The learned ``(c, L)`` of one seed's FIRE record: the ablation's records hold them as
    ``c`` and ``L``; every sweep record holds the trained module's description in
    ``learned_bias["module"]`` (``FIRE(num_heads=.., hidden=.., c=0.4145, L=126.1)``: ``c``
    to 4 decimals, ``L`` to 1), which is read here."""
    if "c" in record and "L" in record:
        return float(record["c"]), float(record["L"])
    text = record.get("learned_bias", {}).get("module", "")
    found = re.search(r"\bc=([-\d.e]+), L=([-\d.e]+)", text)
    if not found:
        raise ValueError("the record keeps no learned c and L of a FIRE module")
    return abs(float(found.group(1))), float(found.group(2))


def near_gap_offsets(c: float, L: float, query: int, train_len: int) -> list[int]:
    """The nonzero offsets of the row of ``query`` whose MLP input lies below the smallest
    nonzero input the training rows produce at this c and L (offset 1 at the last training
    query ``train_len - 1``): the *near gap*, where the final MLP was never fitted (our
    reading: early rows, at the starting c and L, reached it)."""
    if query < 1 or train_len < 2:
        raise ValueError(f"query must be >= 1 and train_len >= 2, got {query}, {train_len}")
    smallest = psi(c, 1) / psi(c, max(L, train_len - 1))
    denominator = psi(c, max(L, query))
    return [d for d in range(1, query + 1) if psi(c, d) / denominator < smallest - TOLERANCE]


def stored_fire(seed: int = 0):
    """The trained FIRE bias of the stored 3,000-step sweep's model of ``seed`` (the sweep
    that keeps its weights: :func:`relbias.book.heuristic_attention.stored_model`), on the
    CPU, without gradients."""
    from relbias.book.heuristic_attention import stored_model

    bias = stored_model("fire", seed).bias
    bias.requires_grad_(False)
    return bias


@torch.no_grad()
def trained_rows(bias, queries) -> dict:
    """``{query: (inputs, values)}`` for a FIRE module: its MLP input ``[offsets]`` and its
    bias ``[heads, offsets]`` (the library's number, added after the scaling) at offsets
    ``0 .. query`` of one query at position ``query``."""
    rows = {}
    for q in queries:
        x = bias.normalized_input(1, q + 1, q_start=q)[0].flip(0)
        v = bias(1, q + 1, q_start=q)[:, 0].flip(-1)
        rows[q] = (x.float(), v.float())
    return rows


def plot_trained_rows(bias, queries=(127, 2047), *, key: int = 100, train_len: int = 128):
    """Two panels for a trained FIRE module at two query positions (the last training query
    and a far one): left, the MLP input against the offset, with the path from ``key`` at
    the far query to the offset of the training row that has its input, and the near gap
    shaded; right, every head's bias against the offset at both queries (solid: the first
    query, dashed: the second). Offsets on a log scale, from 1."""
    first, far = queries
    rows = trained_rows(bias, queries)
    c, L = float(bias.c.detach().abs()), float(bias.L.detach())
    fig, axes = figure(8.0, 3.6, ncols=2)
    left, right = axes.flat
    for q, style in zip(queries, ("-", "--")):
        x, _ = rows[q]
        left.plot(
            range(1, q + 1),
            x[1:].numpy(),
            style,
            color="C0" if q == first else "C1",
            label=f"query {q}",
        )
    alike = trained_offset_alike(c, L, key, far, train_len)
    value = psi(c, key) / psi(c, max(L, far))
    left.plot([key, key, alike], [0, value, value], ":", color="grey", lw=1)
    left.plot([alike], [value], "o", color="C0", ms=4)
    left.plot([key], [value], "o", color="C1", ms=4)
    left.annotate(
        f"offset {key} at {far}",
        (key, value),
        textcoords="offset points",
        xytext=(4, -12),
        fontsize=8,
    )
    smallest = psi(c, 1) / psi(c, max(L, train_len - 1))
    left.axhspan(0, smallest, color="C3", alpha=0.15, lw=0, label="near gap")
    left.set(xscale="log", xlabel="offset $i - j$ (bytes)", ylabel="MLP input", ylim=(0, 1.02))
    left.legend(fontsize=8, loc="upper left")
    for q, style in zip(queries, ("-", "--")):
        _, v = rows[q]
        for h in range(v.shape[0]):
            right.plot(
                range(1, q + 1),
                v[h, 1:].numpy(),
                style,
                color=f"C{h}",
                lw=1,
                label=f"head {h + 1}" if q == first else None,
            )
    right.set(xscale="log", xlabel="offset $i - j$ (bytes)", ylabel=r"$\mathrm{PE}(i, j)/\sqrt{d}$")
    right.legend(fontsize=8, ncol=2, title=f"solid: query {first}, dashed: {far}", title_fontsize=8)
    for ax in (left, right):
        ax.set_xlim(1, far + 1)
    return fig


def context_against(results: dict, method: str, other: str) -> dict:
    """``method``'s context-use difference (long minus sliding on the bytes past ``m_l``:
    :func:`relbias.lab.readings.context_verdict`) minus ``other``'s, paired by seed: the
    verdict of the per-seed differences against the text's error of that difference
    (:func:`relbias.lab.stats.text_error` with ``minus`` the other method's spans)."""

    def measures(m):
        seeds = results["methods"][m]["seeds"]
        found = {}
        for s in sorted(seeds, key=int):
            rows = [r for r in seeds[s]["eval"] if "context" in r]
            if not rows:
                raise ValueError(f"{m} seed {s} has no context-use measure in these results")
            found[s] = rows[-1]["context"]
        return found

    a, b = measures(method), measures(other)
    if set(a) != set(b):
        raise ValueError(f"{method} and {other} hold different seeds")
    keys = sorted(a, key=int)
    return verdict(
        [a[s]["difference"] - b[s]["difference"] for s in keys],
        error=text_error(
            [a[s]["difference_by_span"] for s in keys],
            minus=[b[s]["difference_by_span"] for s in keys],
        ),
    )
