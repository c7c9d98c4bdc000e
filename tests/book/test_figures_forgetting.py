"""The helpers of the chapter on the forget gate (book/09): read-back and precision."""

from __future__ import annotations

import math

import torch

import relbias
from relbias.biases.prepared import ForgettingBias
from relbias.book import forgetting
from relbias.lab.model import TinyLM


def test_difference_errors_match_the_prepared_bias():
    """The split is what the library's dense bias holds; the naive error is F's rounding."""
    torch.manual_seed(0)
    gate = relbias.ForgettingGate(1, 4, bias_init=2.0).double()
    x = torch.randn(1, 3000, 4, dtype=torch.float64)
    with torch.no_grad():
        F_all = gate.cumulative(x)[0, 0]
        dense = ForgettingBias(F_all[None, None]).materialize()[0, 0]
    i = torch.tensor([5, 2999, 2999, 1500])
    j = torch.tensor([0, 2998, 0, 1490])
    errors = forgetting.difference_errors(F_all, i, j)
    exact = F_all[i] - F_all[j]
    assert torch.equal(errors["split"], (dense[i, j].double() - exact).abs())
    naive = (F_all.float()[i] - F_all.float()[j]).double()
    assert torch.equal(errors["naive"], (naive - exact).abs())
    assert torch.equal(errors["rounding"], (exact.float().double() - exact).abs())
    # near the diagonal at |F| in the hundreds, the naive error dwarfs the split's
    assert float(errors["naive"][1]) > 100 * float(errors["split"][1])


def test_gate_row_is_the_last_querys_bias():
    log_f = -torch.rand(20, dtype=torch.float64)
    row = forgetting.gate_row(log_f)
    assert row[-1] == 0 and torch.allclose(row[3], log_f[4:].sum())
    slope = forgetting.gate_row(torch.full((10,), -0.5, dtype=torch.float64))
    assert torch.allclose(slope, -0.5 * torch.arange(9, -1, -1, dtype=torch.float64))


def test_gate_log_forget_reads_each_layers_gate_input():
    """The read-back equals each gate's log f of the input its layer hands it."""
    torch.manual_seed(0)
    model = TinyLM(position="forgetting", dim=16, depth=2, heads=2, train_len=8).eval()
    data = torch.randint(0, 256, (40,), dtype=torch.uint8)
    seen = []
    hooks = [
        blk.norm1.register_forward_hook(lambda _m, _i, out: seen.append(out))
        for blk in model.blocks
    ]
    with torch.no_grad():
        model(data[:32].long().view(4, 8))
    for h in hooks:
        h.remove()
    log_f, ids = forgetting.gate_log_forget(model, data, 8, 4)
    assert log_f.shape == (2, 2, 32) and torch.equal(ids, data[:32].long())
    for layer, (gate, h) in enumerate(zip(model.gates(), seen)):
        with torch.no_grad():
            expected = gate.log_forget(h).permute(1, 0, 2).flatten(1)  # [heads, tokens]
        torch.testing.assert_close(log_f[layer], expected)


def test_forget_by_byte_and_head_rows():
    ids = torch.tensor([10, 32, 97, 10, 32, 97] * 10)
    log_f = torch.tensor([-3.0, -1.0, -0.1] * 20)
    rows = forgetting.forget_by_byte(log_f, ids)
    assert [r[0] for r in rows] == [10, 32, 97] and rows[0][1] == 20
    assert math.isclose(rows[0][2], -3.0)
    table, headers = forgetting.gate_head_rows(log_f.view(1, 1, -1), ids)
    assert len(table) == 1 and len(table[0]) == len(headers)
    assert math.isclose(table[0][4], math.log(2) / (4.1 / 3), rel_tol=1e-6)
    assert table[0][-1] == "newline, space, a"
    assert [forgetting.byte_name(b) for b in (9, 10, 32, 65, 200)] == [
        "tab",
        "newline",
        "space",
        "A",
        "0xc8",
    ]
