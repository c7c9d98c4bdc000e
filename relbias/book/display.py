"""Showing things in a chapter: the library's real source, tables, figures, glued values.

- :func:`show_source` shows the source of a relbias function or class
  (``inspect.getsource``) as a highlighted code block, so the book never pastes a copy
  that could drift; :func:`show_cpp` does the same for one definition of the fused
  kernel's C++ file (:data:`relbias.attention.fused.SOURCE`).
- :func:`show_table` displays a small table as Markdown.
- :func:`show` displays a matplotlib figure as a PNG image (:func:`to_png`: no
  timestamps, no SVG ids), so stored outputs are the same on every run.
- :func:`glue` stores a value for ``{glue:text}`` roles in the prose (myst-nb), and is
  harmless where myst-nb is missing.
"""

from __future__ import annotations

import ast
import inspect
import io
import math
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import torch
from IPython.display import Image
from IPython.display import display as _display

from relbias.attention import fused

__all__ = ["glue", "show", "show_cpp", "show_source", "show_table", "to_png"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


# --- showing the library's source ------------------------------------------------------------


def _qualified_name(obj) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return f"{module}.{name}" if module else name


def _source_file(obj) -> str:
    try:
        # unwrap: a decorated function (e.g. @torch.no_grad()) lives where it is defined
        path = Path(inspect.getsourcefile(inspect.unwrap(obj)) or "").resolve()
    except TypeError:
        return "?"
    try:
        return path.relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        return path.name


def _strip_docstring(source: str) -> str:
    """Drop the first docstring of a def/class source (keeps the signature and body)."""
    match = re.search(r'(\):|:)\s*\n(\s*)[rRbBuU]?("""|\'\'\')', source)
    if not match:
        return source
    quote = match.group(3)
    start = match.end(1)
    end = source.find(quote, match.end(3))
    if end < 0:
        return source
    rest = source[end + len(quote) :]
    if rest.startswith("\n\n"):  # no blank line where the docstring was
        rest = rest[1:]
    return source[:start] + rest


class _Markdown:
    """A display object with Markdown and a plain-text fallback (no HTML, no ids)."""

    def __init__(self, markdown: str, plain: str):
        self.markdown, self.plain = markdown, plain

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": self.markdown, "text/plain": self.plain}

    def __repr__(self) -> str:
        return self.plain


def _fence(code: str, language: str = "python") -> str:
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{code.rstrip()}\n{ticks}"


def _code(header: str, source: str, language: str = "python") -> _Markdown:
    """A code block headed by ``header``: fenced in Markdown, plain in the text form."""
    return _Markdown(f"{header}\n\n{_fence(source, language)}\n", f"{header}\n\n{source}")


def _shown(obj, display: bool):
    """Display ``obj`` and return None; with ``display=False`` return it instead."""
    if not display:
        return obj
    _display(obj)
    return None


def _excerpt(source: str, lines: tuple[str, str]) -> tuple[str, int, int]:
    """The lines of ``source`` from the first containing ``lines[0]`` to the first one
    after it containing ``lines[1]`` (both included), dedented; and their 1-based span."""
    first, last = lines
    rows = source.splitlines()
    start = next((i for i, row in enumerate(rows) if first in row), None)
    if start is None:
        raise ValueError(f"no line contains {first!r}")
    stop = next((i for i in range(start, len(rows)) if last in rows[i]), None)
    if stop is None:
        raise ValueError(f"no line from {first!r} on contains {last!r}")
    return textwrap.dedent("\n".join(rows[start : stop + 1])), start + 1, stop + 1


def show_source(
    obj, *, docstring: bool = True, lines: tuple[str, str] | None = None, display: bool = True
):
    """Show the real source of a relbias function, class or method as highlighted code.

    The code comes from :func:`inspect.getsource`, so the book always shows what the
    library runs. ``docstring=False`` leaves out the first docstring (for long classes).
    ``lines=(first, last)`` shows only an excerpt: the lines from the first one that
    contains the text ``first`` to the next one that contains ``last`` (the formula of a
    longer function, without its argument checks or dispatch); the header says which
    lines of the definition they are.
    Displays Markdown (a fenced code block headed by the qualified name and the file);
    with ``display=False`` returns the display object instead.
    """
    source = inspect.getsource(obj)
    source = inspect.cleandoc("\n" + source) if source[:1].isspace() else source
    if not docstring:
        source = _strip_docstring(source)
    where = ""
    if lines is not None:
        source, start, stop = _excerpt(source, lines)
        where = f" (lines {start}-{stop} of the definition)"
    header = f"`{_qualified_name(obj)}`, from `{_source_file(obj)}`{where}:"
    return _shown(_code(header, source), display)


def show_cpp(name: str, *, display: bool = True):
    """Show the real source of one definition in the fused kernel's C++ file.

    ``name`` is a function or struct of ``relbias/attention/csrc/fused_attention.cpp`` (a
    ``template`` line just above it is included); the definition runs to its closing
    brace. Displays Markdown like :func:`show_source`.
    """
    lines = fused.SOURCE.read_text().splitlines()
    pattern = re.compile(rf"^(struct|[\w:<>]+(\s[\w:<>*&]+)*)\s+{re.escape(name)}\s*[({{]")
    start = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
    if start is None:
        raise ValueError(f"no definition named {name!r} in {fused.SOURCE.name}")
    if start and lines[start - 1].startswith("template"):
        start -= 1
    depth, stop = 0, None
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if "{" in "".join(lines[start : i + 1]) and depth == 0:
            stop = i + 1
            break
    source = "\n".join(lines[start:stop])
    header = f"`{name}`, from `relbias/attention/csrc/{fused.SOURCE.name}`:"
    return _shown(_code(header, source, "cpp"), display)


# --- glue ------------------------------------------------------------------------------------


class _Text:
    """A value shown as its plain text (a string without quotes) by ``{glue:text}``."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _plain(value):
    """Python scalars for tensors/NumPy scalars, so the glued text is '5', not 'tensor(5)'."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


#: Significant digits a glued float keeps (:func:`glue`).
GLUED_DIGITS = 6


def glue(name: str, value, display: bool = False):
    """Store ``value`` under ``name`` for ``{glue:text}`name``` roles in the prose.

    Uses :func:`myst_nb.glue` when myst-nb is installed (as in the book's build), and does
    nothing otherwise (e.g. a bare Colab kernel). Tensors and NumPy scalars are glued as
    Python numbers and strings without quotes. A float is glued rounded to
    :data:`GLUED_DIGITS` significant digits (the prose shows at most four): the stored record
    then does not carry the last digits that another CPU's floating-point path changes.
    Returns None, so a cell may end with it without echoing the value. Format numbers in
    the role: ``{glue:text}`name:.3f```.
    """
    plain = _plain(value)
    if isinstance(plain, float):
        if not math.isfinite(plain):
            raise ValueError(f"glue {name!r}: the value must be a finite number, got {plain}")
        plain = float(f"{plain:.{GLUED_DIGITS}g}")
    if isinstance(plain, str):
        plain = _Text(_pasteable(plain))
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:
        if display:
            _display(plain)
        return None
    _myst_glue(name, plain, display=display)
    return None


def _pasteable(text: str) -> str:
    """``text`` as myst-nb pastes it back unchanged.

    myst-nb reads glued plain text with :func:`ast.literal_eval` before pasting it, so
    "20, 80, 320" would come out as the tuple "(20, 80, 320)" and "2.00, 1.68" as
    "(2.0, 1.68)"; such a string is glued quoted, which the evaluation strips again.
    """
    try:
        value = ast.literal_eval(text)
    except Exception:  # anything it cannot read is pasted as it is
        return text
    return text if str(value) == text else repr(text)


# --- tables ----------------------------------------------------------------------------------


def _cell(value, floatfmt: str) -> str:
    value = _plain(value)
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value).replace("|", "\\|")


def show_table(
    rows: Sequence[Sequence],
    headers: Sequence[str],
    *,
    floatfmt: str = ".3f",
    caption: str | None = None,
    display: bool = True,
):
    """Display ``rows`` as a Markdown table (rendered in Jupyter, Colab and the book).

    Floats are formatted with ``floatfmt``; tensors and NumPy scalars become numbers.
    The plain-text fallback is an aligned text table. With ``display=False`` returns the
    display object instead of showing it.
    """
    body = [[_cell(v, floatfmt) for v in row] for row in rows]
    heads = [str(h) for h in headers]
    if any(len(r) != len(heads) for r in body):
        raise ValueError("every row must have one value per header")
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---:" for _ in heads) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]
    plain = ["  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [heads, *body]]
    markdown = "\n".join(lines)
    text = "\n".join(plain)
    if caption:
        markdown = f"{caption}\n\n{markdown}"
        text = f"{caption}\n{text}"
    return _shown(_Markdown(markdown + "\n", text), display)


# --- figures as PNG -------------------------------------------------------------------------


def to_png(fig, *, dpi: int = 100) -> bytes:
    """Render a matplotlib figure to PNG bytes (no timestamps: identical on every run)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def show(fig, *, dpi: int = 100, display: bool = True):
    """Display a matplotlib figure as a PNG image and close it if pyplot owns it.

    Works for figures from :func:`relbias.book.plots.figure` and from pyplot alike (the
    lab's result plots use pyplot). With ``display=False`` returns the
    ``IPython.display.Image`` instead of showing it.
    """
    image = Image(data=to_png(fig, dpi=dpi), format="png")
    # A figure that pyplot owns was made with pyplot loaded; the book never imports it.
    # pyplot.close leaves a figure it does not own alone.
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)
    return _shown(image, display)
