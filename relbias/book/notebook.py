"""Helpers shared by every chapter notebook of the book.

They keep the notebooks short and their stored outputs reproducible (nbval compares
them with a fresh run):

- :func:`runtime_banner` picks the device and the quick/full configuration, seeds
  everything, selects PNG figures and prints which, in words that are the same on every
  CPU run.
- :func:`show_source` shows the library's *real* source (``inspect.getsource``) as a
  highlighted code block, so the book never pastes a copy that could drift.
- :func:`glue` stores a value for ``{glue:text}`` roles in the prose (myst-nb), and is
  harmless where myst-nb is missing.
- :func:`show_table` displays a small table as Markdown; :func:`show` displays a
  matplotlib figure as a PNG image (deterministic, no SVG ids).
- :func:`explorer` builds an ipywidgets explorer that redraws a figure when a slider
  moves (live kernels only); the static book shows a figure drawn by the same function.
- :func:`plot_bias_matrix` and :func:`plot_bias_by_offset` are the static figures of a
  bias: PE(i, j) as a matrix per head, and PE against the offset i - j per head;
  :func:`plot_bias_gallery` puts several biases side by side, and
  :func:`plot_index_matrix` labels every cell of an offset or bucket matrix (u_5, ...).

Figures are built with :class:`matplotlib.figure.Figure` directly (not pyplot), so a
helper never leaves a figure behind that Jupyter would display a second time.

``python -m relbias.book.notebook execute book/<chapter>.ipynb ...`` stores the outputs of a
fresh top-to-bottom run (``CI=1``: the quick configuration on the CPU), without widget
state or timings: the outputs that nbval then compares.
"""

from __future__ import annotations

import ast
import inspect
import io
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "Runtime",
    "explorer",
    "figure",
    "glue",
    "in_colab",
    "plot_bias_by_offset",
    "plot_bias_gallery",
    "plot_bias_matrix",
    "plot_index_matrix",
    "runtime_banner",
    "show",
    "show_cpp",
    "show_source",
    "show_table",
    "to_png",
]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


# --- the runtime ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Runtime:
    """What :func:`runtime_banner` chose: the torch device and the training configuration."""

    device: torch.device
    config: object  # relbias.lab.training.Config

    @property
    def quick(self) -> bool:
        return getattr(self.config, "name", "quick") == "quick"


def in_colab() -> bool:
    """True inside Google Colab."""
    import sys

    return "google.colab" in sys.modules


def _use_png_figures() -> None:
    """Inline figures as PNG (SVG output carries random ids that differ on every run)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with every kernel
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "run_line_magic"):
        try:
            shell.run_line_magic("config", "InlineBackend.figure_formats = ['png']")
        except Exception:  # noqa: BLE001 - a shell without the inline backend
            pass


def runtime_banner(config: str | None = None, *, seed: int = 0, verbose: bool = True) -> Runtime:
    """Pick the device and configuration, seed everything, and print which were chosen.

    - configuration: ``config`` if given, else :func:`relbias.lab.training.get_config`'s
      choice: ``quick`` whenever the ``CI`` environment variable is set or there is no
      GPU, ``full`` on a GPU;
    - device: the CPU whenever ``CI`` is set (the stored outputs of the book come from a
      CPU run, and CI must reproduce them), else CUDA, then Apple MPS, then the CPU;
    - seeds Python, NumPy and torch with ``seed`` and selects PNG inline figures.

    The printed line names only the device type and the configuration, so that it is
    identical on every CPU run. Returns a :class:`Runtime`.
    """
    from relbias.lab.training import get_config, pick_device, seed_everything

    cfg = get_config(config)
    if os.environ.get("CI"):
        device = torch.device("cpu")
    else:
        device = pick_device(verbose=False)
    seed_everything(seed)
    _use_png_figures()
    if verbose:
        where = {"cpu": "CPU", "cuda": "GPU (CUDA)", "mps": "Apple GPU (MPS)"}.get(
            device.type, device.type
        )
        print(
            f"relbias {_version()} | device: {where} | configuration: {cfg.name} "
            f"(train_len={cfg.train_len}, {cfg.steps} steps)"
        )
        print("(quick on a CPU and whenever CI is set; full on a GPU)")
    return Runtime(device=device, config=cfg)


def _version() -> str:
    from relbias import __version__

    return __version__


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


def show_source(obj, *, docstring: bool = True, display: bool = True):
    """Show the real source of a relbias function, class or method as highlighted code.

    The code comes from :func:`inspect.getsource`, so the book always shows what the
    library runs. ``docstring=False`` leaves out the first docstring (for long classes).
    Displays Markdown (a fenced code block headed by the qualified name and the file);
    with ``display=False`` returns the display object instead.
    """
    source = inspect.getsource(obj)
    source = inspect.cleandoc("\n" + source) if source[:1].isspace() else source
    if not docstring:
        source = _strip_docstring(source)
    header = f"`{_qualified_name(obj)}`, from `{_source_file(obj)}`:"
    shown = _Markdown(f"{header}\n\n{_fence(source)}\n", f"{header}\n\n{source}")
    if not display:
        return shown
    _display(shown)
    return None


def show_cpp(name: str, *, display: bool = True):
    """Show the real source of one definition in the fused kernel's C++ file.

    ``name`` is a function or struct of ``relbias/attention/csrc/fused_attention.cpp`` (a
    ``template`` line just above it is included); the definition runs to its closing
    brace. Displays Markdown like :func:`show_source`.
    """
    from relbias.attention.fused import SOURCE

    lines = SOURCE.read_text().splitlines()
    pattern = re.compile(rf"^(struct|[\w:<>]+(\s[\w:<>*&]+)*)\s+{re.escape(name)}\s*[({{]")
    start = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
    if start is None:
        raise ValueError(f"no definition named {name!r} in {SOURCE.name}")
    if start and lines[start - 1].startswith("template"):
        start -= 1
    depth, stop = 0, None
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if "{" in "".join(lines[start : i + 1]) and depth == 0:
            stop = i + 1
            break
    source = "\n".join(lines[start:stop])
    header = f"`{name}`, from `relbias/attention/csrc/{SOURCE.name}`:"
    shown = _Markdown(f"{header}\n\n{_fence(source, 'cpp')}\n", f"{header}\n\n{source}")
    if not display:
        return shown
    _display(shown)
    return None


def _display(obj) -> None:
    from IPython.display import display

    display(obj)


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


def glue(name: str, value, display: bool = False):
    """Store ``value`` under ``name`` for ``{glue:text}`name``` roles in the prose.

    Uses :func:`myst_nb.glue` when myst-nb is installed (as in the book's build), and does
    nothing otherwise (e.g. a bare Colab kernel). Tensors and NumPy scalars are glued as
    Python numbers and strings without quotes. Returns None, so a cell may end with it
    without echoing the value. Format numbers in the role: ``{glue:text}`name:.3f```.
    """
    plain = _plain(value)
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
    except Exception:  # noqa: BLE001 - anything it cannot read is pasted as it is
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
    shown = _Markdown(markdown + "\n", text)
    if not display:
        return shown
    _display(shown)
    return None


# --- figures ---------------------------------------------------------------------------------


def figure(
    width: float = 7.0, height: float = 3.2, *, nrows: int = 1, ncols: int = 1, **subplot_kw
):
    """A matplotlib Figure and its axes, built without pyplot (nothing is auto-displayed).

    Returns ``(fig, axes)``; ``axes`` is a single Axes for 1 x 1, else a 2-D array.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=nrows * ncols == 1, **subplot_kw)
    return fig, axes


def to_png(fig, *, dpi: int = 100) -> bytes:
    """Render a matplotlib figure to PNG bytes (no timestamps: identical on every run)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def show(fig, *, dpi: int = 100, display: bool = True):
    """Display a matplotlib figure as a PNG image and close it if pyplot owns it.

    Works for figures from :func:`figure` and from pyplot alike. With ``display=False``
    returns the ``IPython.display.Image`` instead of showing it.
    """
    from IPython.display import Image

    image = Image(data=to_png(fig, dpi=dpi), format="png")
    try:
        import matplotlib.pyplot as plt

        if plt.fignum_exists(getattr(fig, "number", -1)):
            plt.close(fig)
    except ImportError:  # pragma: no cover
        pass
    if not display:
        return image
    _display(image)
    return None


def _bias_tensor(bias, q_len: int, k_len: int | None, q_start: int | None) -> torch.Tensor:
    from relbias.biases.base import RelativeBias

    if isinstance(bias, RelativeBias):
        with torch.no_grad():
            return bias(q_len, k_len, q_start=q_start).detach().float().cpu()
    if isinstance(bias, torch.Tensor):
        t = bias.detach().float().cpu()
        return t[None] if t.dim() == 2 else t
    raise TypeError(f"bias must be a relbias.RelativeBias or a tensor, got {type(bias).__name__}")


def plot_bias_matrix(
    bias,
    q_len: int = 16,
    k_len: int | None = None,
    *,
    q_start=None,
    heads: Sequence[int] | None = None,
    causal: bool = True,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = "viridis",
    width: float | None = None,
):
    """PE(i, j) as a matrix per head: rows are queries i, columns keys j.

    ``bias`` is a :class:`~relbias.RelativeBias` (called with the lengths) or a tensor
    ``[heads, q_len, k_len]`` (or ``[q_len, k_len]``). With ``causal=True`` the future
    keys (j > i), which the mask removes, are left blank. ``annotate`` writes the values
    in the cells (default: for at most 10 x 10 cells and two heads). Returns the Figure.
    """
    values = _bias_tensor(bias, q_len, k_len, q_start)
    n_heads, rows, cols = values.shape
    first = (cols - rows) if q_start is None else q_start
    heads = list(range(min(n_heads, 4))) if heads is None else list(heads)
    if annotate is None:
        annotate = rows <= 10 and cols <= 10 and len(heads) <= 2
    i = torch.arange(first, first + rows)[:, None]
    j = torch.arange(cols)[None, :]
    future = j > i
    panel = 2.4 if len(heads) > 1 else 3.6
    fig, axes = figure(
        width or panel * len(heads) + 0.6,
        0.3 + panel * min(rows / cols, 1.4) + 0.5,
        ncols=len(heads),
    )
    axes = [axes] if len(heads) == 1 else list(axes.flat)
    shown = values[heads].clone()
    if causal:
        shown[:, future] = float("nan")
    finite = shown[torch.isfinite(shown)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 1.0, vmax + 1.0
    image = None
    for ax, h, mat in zip(axes, heads, shown):
        image = ax.imshow(
            mat.numpy(),
            cmap=cmap,
            vmin=vmin,
            vmax=vmax,
            aspect="equal",
            extent=(-0.5, cols - 0.5, first + rows - 0.5, first - 0.5),
        )
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("key position j")
        if annotate:
            for r in range(rows):
                for c in range(cols):
                    v = float(mat[r, c])
                    if math.isfinite(v):
                        ax.text(
                            c,
                            first + r,
                            f"{v + 0.0:.2g}",
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="white" if v < (vmin + vmax) / 2 else "black",
                        )
    axes[0].set_ylabel("query position i")
    fig.colorbar(image, ax=axes, shrink=0.8, label="PE(i, j)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_bias_by_offset(
    bias,
    max_offset: int = 64,
    *,
    min_offset: int = 0,
    heads: Sequence[int] | None = None,
    mark: Sequence[int] = (),
    title: str | None = None,
    ax=None,
    step: bool = False,
):
    """PE against the offset i - j, one line per head.

    ``bias`` is an offset-only :class:`~relbias.RelativeBias` (its ``offset_table``) or a
    tensor ``[heads, offsets]`` holding offsets ``min_offset ..``. ``mark`` draws
    vertical lines (e.g. the last trained offset). ``step=True`` draws a staircase (for
    bucketed biases). Draws into ``ax`` if given; returns the Figure.
    """
    from relbias.biases.base import RelativeBias

    if isinstance(bias, RelativeBias):
        with torch.no_grad():
            table = bias.offset_table(min_offset, max_offset).detach().float().cpu()
    elif isinstance(bias, torch.Tensor):
        table = bias.detach().float().cpu()
        table = table[None] if table.dim() == 1 else table
    else:
        raise TypeError(
            f"bias must be a relbias.RelativeBias or a tensor, got {type(bias).__name__}"
        )
    offsets = torch.arange(min_offset, min_offset + table.shape[1])
    heads = list(range(table.shape[0])) if heads is None else list(heads)
    if ax is None:
        fig, ax = figure(6.4, 3.2)
    else:
        fig = ax.figure
    for h in heads:
        if step:
            ax.step(offsets.numpy(), table[h].numpy(), where="mid", lw=1.2, label=f"head {h}")
        else:
            ax.plot(offsets.numpy(), table[h].numpy(), lw=1.2, label=f"head {h}")
    for x in mark:
        ax.axvline(x, color="grey", lw=0.8, linestyle="--")
    ax.set_xlabel("offset i - j")
    ax.set_ylabel("PE(i, j)")
    if len(heads) > 1:
        ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_index_matrix(
    index,
    *,
    first_query: int = 0,
    label: str = "u",
    highlight=None,
    causal: bool = True,
    title: str | None = None,
    ax=None,
    size: float | None = None,
):
    """An integer matrix ``[q_len, k_len]`` (offsets, buckets) with each cell labelled.

    Every cell shows ``label_value`` (e.g. :math:`u_5`), coloured by its value. Queries sit
    at positions ``first_query ..`` and keys at ``0 ..``. ``highlight`` is a boolean matrix
    of cells to stress (the others are faded); ``causal=True`` blanks the future keys.
    Draws into ``ax`` if given; returns the Figure.
    """
    import numpy as np
    from matplotlib import colormaps

    index = torch.as_tensor(index)
    rows, cols = index.shape
    i = torch.arange(first_query, first_query + rows)[:, None]
    j = torch.arange(cols)[None, :]
    future = (j > i) if causal else torch.zeros(rows, cols, dtype=torch.bool)
    if ax is None:
        size = size or max(4.2, 0.42 * rows)
        fig, ax = figure(size * min(cols / rows, 1.6) + 0.4, size)
    else:
        fig = ax.figure
    values = index.numpy().astype(float)
    low, high = float(values.min()), float(values.max())
    span = high - low or 1.0
    cmap = colormaps["viridis"]
    rgba = cmap((values - low) / span)
    if highlight is not None:
        fade = ~torch.as_tensor(highlight, dtype=torch.bool).numpy()
        rgba[fade] = 0.25 * rgba[fade] + 0.75
    rgba[future.numpy()] = (1.0, 1.0, 1.0, 1.0)
    ax.imshow(rgba, extent=(-0.5, cols - 0.5, first_query + rows - 0.5, first_query - 0.5))
    fontsize = 8 if max(rows, cols) <= 16 else 6
    for r in range(rows):
        for c in range(cols):
            if future[r, c]:
                continue
            v = int(index[r, c])
            shade = np.asarray(rgba[r, c][:3]).mean()
            ax.text(
                c,
                first_query + r,
                f"${label}_{{{v}}}$",
                ha="center",
                va="center",
                fontsize=fontsize,
                color="black" if shade > 0.5 else "white",
            )
    ax.set_xticks(range(cols))
    ax.set_yticks(range(first_query, first_query + rows))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_bias_gallery(
    biases: dict,
    q_len: int = 12,
    *,
    head: int = 0,
    ncols: int = 4,
    causal: bool = True,
    title: str | None = None,
):
    """PE(i, j) of one head for several biases side by side (one panel each, own colours).

    ``biases`` maps a panel title to a :class:`~relbias.RelativeBias` or a tensor
    ``[heads, q_len, k_len]``. Returns the Figure.
    """
    n = len(biases)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = figure(2.5 * ncols + 0.5, 2.5 * nrows + 0.3, nrows=nrows, ncols=ncols)
    flat = [axes] if n == 1 else list(axes.flat)
    i = torch.arange(q_len)[:, None]
    j = torch.arange(q_len)[None, :]
    for ax, (name, bias) in zip(flat, biases.items()):
        mat = _bias_tensor(bias, q_len, None, None)[head].clone()
        if causal:
            mat[j > i] = float("nan")
        image = ax.imshow(mat.numpy(), cmap="viridis")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(image, ax=ax, shrink=0.75)
    for ax in flat[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


# --- explorers -------------------------------------------------------------------------------


def _control(name: str, spec):
    """An ipywidgets control from a widget, a (min, max[, step]) tuple or a list of options."""
    import ipywidgets as widgets

    if isinstance(spec, widgets.Widget):
        return spec
    style = {"description_width": "initial"}
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        low, high = spec[0], spec[1]
        integer = all(isinstance(v, int) and not isinstance(v, bool) for v in spec)
        step = spec[2] if len(spec) == 3 else 1 if integer else (high - low) / 100
        slider = widgets.IntSlider if integer else widgets.FloatSlider
        return slider(
            value=low,
            min=low,
            max=high,
            step=step,
            description=name,
            continuous_update=False,
            style=style,
        )
    if isinstance(spec, list):
        return widgets.Dropdown(options=spec, value=spec[0], description=name, style=style)
    if isinstance(spec, bool):
        return widgets.Checkbox(value=spec, description=name, style=style)
    raise TypeError(
        f"control {name!r}: give a widget, a (min, max[, step]) tuple, a list "
        f"of options or a bool, got {spec!r}"
    )


def explorer(draw: Callable, *, title: str = "explorer", initial: dict | None = None, **controls):
    """An interactive explorer: sliders that redraw ``draw(**values)`` (a matplotlib Figure).

    Each keyword names an argument of ``draw`` and gives its control: an ipywidgets
    widget, an ``(min, max[, step])`` tuple (int or float slider), a list of options
    (dropdown) or a bool (checkbox). ``initial`` sets starting values. The figure is
    drawn as a PNG into an Output widget: first when the explorer is built, again after
    every change. In the static book widgets do not run; show ``draw(...)`` for a few
    settings next to it instead.

    Returns the explorer (an ``ipywidgets.VBox`` whose plain-text form is a short,
    fixed description), to be displayed as a cell's last expression. Without ipywidgets
    it returns a short text saying so.
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return _Text(f"{title}: install ipywidgets to use the sliders")
    from IPython.display import Image

    if in_colab():  # Colab renders ipywidgets 8 through its custom widget manager
        try:
            from google.colab import output

            output.enable_custom_widget_manager()
        except Exception:  # noqa: BLE001 - an older Colab: the sliders may not show
            pass
    boxes = {name: _control(name, spec) for name, spec in controls.items()}
    for name, value in (initial or {}).items():
        boxes[name].value = value
    out = widgets.Output()

    def redraw(_change=None):
        fig = draw(**{name: box.value for name, box in boxes.items()})
        image = Image(data=to_png(fig), format="png")
        out.outputs = ()
        out.append_display_data(image)

    for box in boxes.values():
        box.observe(redraw, names="value")
    redraw()
    names = ", ".join(boxes)
    return _Explorer(
        [widgets.HTML(f"<b>{title}</b>"), *boxes.values(), out],
        description=f"{title} (controls: {names}; live in Jupyter or Colab)",
    )


_EXPLORER_CLASS = None


def _Explorer(children, *, description: str):  # noqa: N802 - builds an instance
    """An ``ipywidgets.VBox`` whose text form is a fixed description (stable outputs)."""
    global _EXPLORER_CLASS
    if _EXPLORER_CLASS is None:
        import ipywidgets as widgets

        class Explorer(widgets.VBox):
            def __init__(self, children, *, description: str):
                super().__init__(children)
                self._description = description

            def __repr__(self) -> str:
                return f"Explorer: {self._description}"

        _EXPLORER_CLASS = Explorer
    return _EXPLORER_CLASS(children, description=description)


# --- executing the chapters ------------------------------------------------------------------


def execute_notebook(path, *, timeout: int = 1800, kernel_name: str = "python3") -> float:
    """Run a chapter top to bottom in the quick configuration and store its outputs.

    The kernel runs with ``CI=1`` (the quick configuration on the CPU, as nbval in CI),
    in the notebook's folder (as nbval and the book's build run it). Widget state and
    cell timings are not stored, so the notebook changes only when its outputs do.
    Returns the wall time in seconds.
    """
    import time

    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("CI")
    os.environ["CI"] = "1"
    start = time.perf_counter()
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            store_widget_state=False,
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        if old is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = old
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv=None) -> int:
    """``python -m relbias.book.notebook execute book/02_offset_bias.ipynb ...``"""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m relbias.book.notebook",
        description="Execute book chapters in place (CI=1: quick configuration, CPU).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("execute", help="run notebooks top to bottom and store outputs")
    run.add_argument("notebooks", nargs="+", type=Path)
    run.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    for nb_path in args.notebooks:
        if not nb_path.is_file():
            parser.error(f"no such notebook: {nb_path}")
    for nb_path in args.notebooks:
        seconds = execute_notebook(nb_path, timeout=args.timeout)
        print(f"{nb_path}: executed in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
