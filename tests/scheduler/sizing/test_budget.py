"""Budgets: sizes, fractions, optimizer state, and clear errors."""

import pytest

from graphs import synthetic
from scheduler import BudgetError, parse_budget, parse_size
from solvers import activation_budget_bytes, simulate


@pytest.mark.parametrize("text,expected", [
    ("6GiB", 6 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("100MB", 10**8),
    ("123456B", 123456), ("2 KiB", 2048), ("1e9", 10**9), ("3gib", 3 * 2**30), ("7B", 7),
    ("2097152", 2097152),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected
    assert parse_budget(text) == expected


def test_integer_bytes():
    assert parse_budget(4096) == 4096


def test_fraction_is_share_of_store_all_activation_peak():
    g = synthetic.transformer(40)
    act = simulate(g).activation_peak_bytes
    assert parse_budget("0.3", g) == activation_budget_bytes(g, 0.3)
    assert parse_budget(0.5, g) - parse_budget(0.3, g) == pytest.approx(0.2 * act, abs=2)
    assert parse_budget("1", g) == simulate(g).peak_bytes
    assert parse_budget("3e-1", g) == parse_budget("0.3", g) < simulate(g).peak_bytes


def test_fraction_never_above_store_all():
    """NOTE [ Fractional budgets ]: a graph whose parameter gradients are large and created late."""
    for g in (synthetic.transformer(40).with_nodes(synthetic.transformer(40).nodes, param_bytes=10**9),
              synthetic.chain(12), synthetic.residual(30)):
        peak = simulate(g).peak_bytes
        assert parse_budget(1.0, g) == peak
        assert all(parse_budget(f, g) < peak for f in (0.05, 0.3, 0.7, 0.99))


@pytest.mark.parametrize("spec,msg", [
    ("6G", "write GiB"), ("lots", "cannot read"), ("6 parsecs", "unknown size unit"), ("-1GiB", "cannot read"),
    ("0", "fraction"), (1.5, "fraction"), (0.0, "fraction"), (-3, "positive"), (True, "size or a fraction"),
    ("1.5", "did you mean 1.5GiB or a fraction"), ("512", "did you mean 512GiB"), ("1e400", "not a finite"),
    ("1e400GiB", "2\\*\\*62"), (2**62, "2\\*\\*62"), (float("nan"), "fraction"), (None, "size or a fraction"),
])
def test_bad_budgets(spec, msg):
    with pytest.raises(BudgetError, match=msg):
        parse_budget(spec, synthetic.chain(4))


def test_fraction_needs_graph():
    with pytest.raises(BudgetError, match="needs the graph"):
        parse_budget("0.3")


def test_optimizer_state_is_subtracted():
    g = synthetic.chain(4).with_nodes(synthetic.chain(4).nodes, param_bytes=1000)
    assert parse_budget(10_000, g, optimizer="adam") == 10_000 - 2000
    assert parse_budget(10_000, g, optimizer="sgd") == 10_000
    # weights 1000 + gradients 1000 + Adam 2000: 4000 bytes before any activation (the step's state, as fit counts it)
    with pytest.raises(BudgetError, match=r"persistent state alone \(3.91 KiB = weights 1000 B .* over the 3.91 KiB budget by 1 B"):
        parse_budget(3999, g, optimizer="adam")
    assert parse_budget(4001, g, optimizer="adam") == 2001
    with pytest.raises(BudgetError, match="unknown optimizer"):
        parse_budget(10_000, g, optimizer="lion9000")
