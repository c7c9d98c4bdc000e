"""Kerple (Chi et al., 2022): kernelised relative positional biases, power and logarithmic."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch
from torch import nn

from relbias._checks import check_bool, check_positive_float, compute_dtype
from relbias.biases.base import RelativeBias

__all__ = ["KerpleLog", "KerplePower", "project_after_steps"]


def _projected(p: torch.Tensor, low: float, high: float | None) -> torch.Tensor:
    """``p`` clamped to ``[low, high]``, its gradient passed straight through (as to a
    parameter projected in place)."""
    return p + (p.clamp(min=low, max=high) - p).detach()


class _Kerple(RelativeBias):
    """Shared machinery: learnable ``r1``, ``r2`` per head, projected onto their constraints.

    The constraints are enforced the way the reference code does, by clamping the
    stored parameters in place (:meth:`project_`) whenever the module uses them, so
    every bias it computes obeys them. Training code that wants them to hold right
    after each step of its own optimiser too attaches :func:`project_after_steps` to
    it; nothing is registered for other optimisers. The formula is even in ``i - j``,
    so it serves causal and bidirectional attention.
    """

    r2_max: float | None = None

    def __init__(
        self, num_heads, *, eps=1e-2, r1_init=None, r2_init=None, learn_r1=True, learn_r2=True
    ):
        super().__init__(num_heads, bidirectional=True)
        self.eps = check_positive_float("eps", eps)
        if self.r2_max is not None and self.eps >= self.r2_max:
            raise ValueError(f"eps must be < {self.r2_max}, got {self.eps}")
        # The reference initialises uniformly: the multiplier-like parameter in (0, 2),
        # the other in (0, 1); see each subclass. A given start draws no random numbers.
        r1 = self._init_r1() if r1_init is None else self._start("r1_init", r1_init, None)
        r2 = self._init_r2() if r2_init is None else self._start("r2_init", r2_init, self.r2_max)
        self.r1 = nn.Parameter(r1, requires_grad=check_bool("learn_r1", learn_r1))
        self.r2 = nn.Parameter(r2, requires_grad=check_bool("learn_r2", learn_r2))
        self.project_()

    def _start(self, name: str, value, maximum: float | None) -> torch.Tensor:
        """A start value: one number for every head or a sequence of ``num_heads`` numbers,
        each inside the family's constraint (``>= eps``, and ``<= maximum`` if given)."""
        values = [value] * self.num_heads if isinstance(value, numbers.Real) else value
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            raise TypeError(
                f"{name} must be a number or a sequence of {self.num_heads} numbers, got {value!r}"
            ) from None
        upper = float("inf") if maximum is None else maximum
        if (
            len(values) != self.num_heads
            or isinstance(value, bool)
            or not all(self.eps <= v <= upper for v in values)
        ):
            allowed = f"in [{self.eps}, {maximum}]" if maximum is not None else f">= {self.eps}"
            raise ValueError(
                f"{name} must be a number or {self.num_heads} numbers (one per head), each "
                f"{allowed}, got {value!r}"
            )
        return torch.tensor(values, dtype=torch.float32)

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp ``r1`` and ``r2`` in place onto the family's constraints.

        Only a parameter that breaks its constraint is written to: an in-place write
        bumps the tensor's version, which would invalidate the autograd graph of any
        earlier forward that saved the parameter (calling the module twice, e.g. from
        two layers, before one backward).
        """
        if (self.r1 < self.eps).any():
            self.r1.clamp_(min=self.eps)
        r2_max = float("inf") if self.r2_max is None else self.r2_max
        if ((self.r2 < self.eps) | (self.r2 > r2_max)).any():
            self.r2.clamp_(min=self.eps, max=self.r2_max)

    def _constrained(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``r1`` and ``r2`` on their constraints.

        Eagerly the stored parameters are projected (:meth:`project_`). Under
        ``torch.compile`` the test of :meth:`project_` would break the graph, so the values
        are projected instead, with the gradient passed straight through: the same values
        and the same gradients as the projected parameters; the stored ones are projected
        by :func:`project_after_steps` or the next eager call.
        """
        if torch.compiler.is_compiling():
            r2_max = self.r2_max
            return _projected(self.r1, self.eps, None), _projected(self.r2, self.eps, r2_max)
        self.project_()
        return self.r1, self.r2

    def _distance(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r1, r2 = self._constrained()
        dtype = compute_dtype(r1)
        r1, r2 = r1.to(dtype)[:, None], r2.to(dtype)[:, None]
        return r1, r2, offsets.abs().to(dtype)[None, :]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, eps={self.eps}"


class KerplePower(_Kerple):
    r"""Kerple, power form: :math:`\mathrm{PE}(i,j) = -r_1\,|i-j|^{r_2}`.

    Constraints: :math:`r_1 > 0` and :math:`0 < r_2 \le 2`.

    :math:`r_1, r_2` are learned per head (the book's Table 2.4 calls them
    :math:`\beta_1, \beta_2`). ``r_2 \le 2`` keeps :math:`-|i-j|^{r_2}` a conditionally
    positive definite kernel; :math:`r_2 = 1` is ALiBi with a learned slope.
    Initialised as the reference: :math:`r_1 \sim U(0,1)`, :math:`r_2 \sim U(0,2)`;
    ``r1_init``/``r2_init`` (a number, or one per head) start elsewhere, and
    ``learn_r1``/``learn_r2=False`` keep a parameter at its start (``r2_init=1,
    learn_r2=False`` with ALiBi's slopes as ``r1_init``: ALiBi with learned slopes).
    Chi et al. (2022).
    """

    r2_max = 2.0

    def _init_r1(self):
        return torch.rand(self.num_heads)

    def _init_r2(self):
        return torch.rand(self.num_heads) * 2

    def _offset_values(self, offsets):
        r1, r2, distance = self._distance(offsets)
        return -r1 * distance.pow(r2)


class KerpleLog(_Kerple):
    r"""Kerple, logarithmic form: :math:`\mathrm{PE}(i,j) = -r_1 \log(1 + r_2 |i-j|)`.

    Constraints: :math:`r_1, r_2 > 0`.

    Learned per head. Initialised as the reference: :math:`r_1 \sim U(0,2)`,
    :math:`r_2 \sim U(0,1)`; ``r1_init``, ``r2_init``, ``learn_r1``, ``learn_r2`` as in
    :class:`KerplePower`. (The reference code names the multiplier ``bias_p`` here,
    the name it gives the exponent in the power form.) Chi et al. (2022).
    """

    def _init_r1(self):
        return torch.rand(self.num_heads) * 2

    def _init_r2(self):
        return torch.rand(self.num_heads)

    def _offset_values(self, offsets):
        r1, r2, distance = self._distance(offsets)
        return -r1 * torch.log1p(r2 * distance)


def project_after_steps(optimizer: torch.optim.Optimizer, modules):
    """Clamp the Kerple biases among ``modules`` onto their constraints after every step
    of ``optimizer`` (and of no other optimiser).

    ``modules`` is a module (searched recursively, e.g. a whole model) or an iterable of
    modules. After each ``optimizer.step()`` every Kerple bias found whose ``r1`` or
    ``r2`` the optimiser holds is projected (:meth:`KerplePower.project_`). Returns the
    hook's handle: ``handle.remove()`` detaches it. The modules project themselves
    whenever they compute a bias anyway; this keeps the stored parameters valid between
    steps too (for a checkpoint, or code that reads them).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if isinstance(modules, nn.Module):
        modules = [modules]
    if not isinstance(modules, Iterable):
        raise TypeError(f"modules must be a module or an iterable of modules, got {modules!r}")
    kerples = []
    for module in modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"modules must hold torch.nn.Module objects, got {module!r}")
        kerples.extend(m for m in module.modules() if isinstance(m, _Kerple))

    def project(opt, args, kwargs) -> None:
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        for module in kerples:
            if id(module.r1) in held or id(module.r2) in held:
                module.project_()

    return optimizer.register_step_post_hook(project)
