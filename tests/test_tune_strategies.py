"""The search strategies on a synthetic objective (no compiler, no GPU)."""

from __future__ import annotations

import itertools
import math

import pytest

from perfscope.errors import PerfscopeError
from perfscope.tune import strategies
from perfscope.tune.space import Config

AXES = (("BN", (64, 128, 256)), ("STAGES", (2, 3, 4, 5, 6)), ("GROUP", (1, 2, 4, 8, 16)))
ALL = [Config(tuple(zip((n for n, _ in AXES), combo, strict=True)))
       for combo in itertools.product(*(v for _, v in AXES))]
# A "space rule": BN=256 holds at most 3 stages (as shared memory allows on the H200).
LEGAL = [c for c in ALL if not (c.params["BN"] == 256 and c.params["STAGES"] > 3)]
DEFAULT = Config((("BN", 256), ("STAGES", 3), ("GROUP", 8)))


def objective(c: Config) -> float:
    """Smooth, one peak at BN=128 STAGES=4 GROUP=4 (ratio 1.05), like a real tile sweep."""
    p = c.params
    d = ((math.log2(p["BN"]) - 7) ** 2 + 0.5 * (p["STAGES"] - 4) ** 2
         + 0.3 * (math.log2(p["GROUP"]) - 2) ** 2)
    return 1.05 - 0.04 * d


BEST = max(LEGAL, key=objective)


def drive(strategy: strategies.Strategy, batch: int = 2, skip=()) -> list[Config]:
    """Run a strategy to its end, batch proposals at a time; skip: pruned after compiling."""
    seen = []
    while not strategy.done:
        got = strategy.propose(batch)
        if not got:
            break
        for c in got:
            if c in skip:
                strategy.observe(c, None, measured=False)
                continue
            seen.append(c)
            strategy.observe(c, objective(c))
    return seen


def test_exhaustive_measures_every_legal_configuration_once_in_order():
    seen = drive(strategies.Exhaustive(LEGAL), batch=7)
    assert seen == LEGAL
    assert max(seen, key=objective) == BEST


def test_random_draws_the_budget_without_repeats_default_first():
    s = strategies.RandomSearch(LEGAL, budget=12, seed=3, first=DEFAULT)
    seen = drive(s)
    assert len(seen) == 12 and len(set(seen)) == 12 and seen[0] == DEFAULT
    assert set(seen) <= set(LEGAL)
    # The same seed draws the same configurations (a resumed run asks for the same ones).
    assert drive(strategies.RandomSearch(LEGAL, budget=12, seed=3, first=DEFAULT)) == seen


def test_random_replaces_what_ptxas_pruned():
    skip = set(LEGAL[:40])
    seen = drive(strategies.RandomSearch(LEGAL, budget=10, seed=1), skip=skip)
    assert len(seen) == 10 and not set(seen) & skip


def test_bayes_finds_the_peak_of_a_smooth_objective_within_a_third_of_the_space():
    pytest.importorskip("optuna")
    budget = len(LEGAL) // 3
    s = strategies.Bayes(LEGAL, budget=budget, seed=0, axes=AXES, first=DEFAULT)
    seen = drive(s, batch=2)
    assert seen[0] == DEFAULT
    assert len(seen) == budget and len(set(seen)) == budget
    assert set(seen) <= set(LEGAL), "an illegal configuration reached a GPU"
    found = max(objective(c) for c in seen)
    assert found >= objective(BEST) - 0.005, (found, objective(BEST))


def test_bayes_does_better_than_random_on_average():
    pytest.importorskip("optuna")
    budget = 12
    bayes = [max(map(objective, drive(strategies.Bayes(LEGAL, budget, seed, AXES)))) for seed in range(4)]
    rand = [max(map(objective, drive(strategies.RandomSearch(LEGAL, budget, seed)))) for seed in range(4)]
    assert sum(bayes) >= sum(rand)


def test_bayes_does_not_count_what_ptxas_pruned_against_the_budget():
    pytest.importorskip("optuna")
    skip = {c for c in LEGAL if c.params["BN"] == 64}
    seen = drive(strategies.Bayes(LEGAL, budget=10, seed=2, axes=AXES), skip=skip)
    assert len(seen) == 10 and not set(seen) & skip


def test_bayes_stops_when_the_legal_space_is_exhausted():
    pytest.importorskip("optuna")
    small = LEGAL[:5]
    seen = drive(strategies.Bayes(small, budget=50, seed=0, axes=AXES))
    assert sorted(seen, key=lambda c: c.key) == sorted(small, key=lambda c: c.key)


def test_choose():
    assert strategies.choose(None, 35, None) == "exhaustive"
    assert strategies.choose(None, 35, 40) == "exhaustive"
    assert strategies.choose(None, 300, 20) in ("bayes", "random")
    with pytest.raises(PerfscopeError, match="exhaustive measures all 35"):
        strategies.choose("exhaustive", 35, 10)
    with pytest.raises(PerfscopeError, match="needs --budget"):
        strategies.choose("random", 35, None)
    with pytest.raises(PerfscopeError, match="unknown strategy 'grid'"):
        strategies.choose("grid", 35, None)
    with pytest.raises(PerfscopeError, match="at least 1"):
        strategies.make("random", LEGAL, 0, 0, AXES)


def test_upcoming_is_what_exhaustive_and_random_propose_next():
    for s, n in ((strategies.Exhaustive(LEGAL), len(LEGAL)),
                 (strategies.RandomSearch(LEGAL, 12, seed=3, first=DEFAULT), 12)):
        assert s.foresees
        ahead = s.upcoming(n)
        assert drive(s, batch=5) == ahead
        assert s.upcoming(4) == []                     # done: nothing more to compile ahead


def test_random_upcoming_reaches_past_the_budget_for_replacements():
    s = strategies.RandomSearch(LEGAL, 4, seed=1)
    ahead = s.upcoming(6)
    skip = set(ahead[:2])                              # ptxas prunes the first two draws
    assert drive(s, batch=1, skip=skip) == ahead[2:6]


def test_bayes_upcoming_is_a_guess_of_fresh_legal_configurations():
    pytest.importorskip("optuna")
    s = strategies.Bayes(LEGAL, budget=10, seed=0, axes=AXES, first=DEFAULT)
    assert not s.foresees
    guess = s.upcoming(5)
    assert guess[0] == DEFAULT and len(set(guess)) == 5 and set(guess) <= set(LEGAL)
    proposed = s.propose(3)
    assert not set(proposed) & set(s.upcoming(len(LEGAL)))   # in flight: not guessed again
    for c in proposed:
        s.observe(c, objective(c))
    assert not set(proposed) & set(s.upcoming(len(LEGAL)))   # measured: neither
