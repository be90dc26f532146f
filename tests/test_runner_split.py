"""Attention grouping of a real step's decode rows (runner.executor.split_rows): the cheapest contiguous split in
query-length or key-length order, checked against brute force; a batch mixing fresh and long contexts is split by
context (padding every row to the longest context is what a varlen kernel and the profile's KV term never pay)."""
torch = __import__("pytest").importorskip("torch")

import itertools  # noqa: E402

import numpy as np  # noqa: E402

from dsparksim.runner.executor import split_rows  # noqa: E402


def _cost(parts, lens, tk, pen):
    return float(sum(len(p) * float(lens[p].max()) * float(tk[p].max()) + pen for p in parts))


def _brute(lens, tk, pen, max_groups=3):
    best = np.inf
    n = len(lens)
    for key in (lens, tk):
        order = np.argsort(key, kind="stable")
        ks = key[order]
        for g in range(1, max_groups + 1):
            for cuts in itertools.combinations(range(1, n), g - 1):
                if any(ks[c] == ks[c - 1] for c in cuts):
                    continue
                best = min(best, _cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (n,))], lens, tk, pen))
    return best


def test_split_is_a_partition_and_optimal_among_contiguous_splits():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 10))
        lens, tk = rng.integers(1, 9, n), rng.integers(5, 400, n)
        pen = float(rng.choice([0.0, 300.0, 3000.0, 1e6]))
        g = int(rng.integers(2, 7))
        parts = split_rows(lens, tk, pen, g)
        assert sorted(np.concatenate(parts).tolist()) == list(range(n)) and len(parts) <= g
        assert _cost(parts, lens, tk, pen) == _brute(lens, tk, pen, g) or \
            abs(_cost(parts, lens, tk, pen) / _brute(lens, tk, pen, g) - 1) < 1e-9
        assert len(split_rows(lens, tk, pen, 1)) == 1


def test_uniform_verify_length_with_mixed_contexts_is_split_by_context():
    # fixed:7 at 32 users: every row verifies 7, contexts from fresh (20) to long (300). One group pads all 32 rows
    # to 300 keys; three context ranges cut the padded work by about a quarter (uniform spread: to ~2/3 + launches).
    lens = np.full(32, 8)
    tk = np.linspace(20, 300, 32).astype(int)
    parts = split_rows(lens, tk, 3000.0, 3)
    assert len(parts) > 1
    assert _cost(parts, lens, tk, 3000.0) < 0.8 * _cost([np.arange(32)], lens, tk, 3000.0)
    for p in parts:                                    # groups are context ranges
        assert tk[p].max() - tk[p].min() <= 300 - 20
    # a huge per-group penalty (kernel launch cost) keeps one group
    assert len(split_rows(lens, tk, 1e9, 3)) == 1
