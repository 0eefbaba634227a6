"""Search strategies: which configurations of one (stage, dtype, shape) to measure next.

A strategy is asked for proposals and told each one's value (the median ratio to cuBLAS,
higher is better; None for a configuration that was pruned, wrong or crashed), and whether
it was measured: one ptxas pruned after compiling cost no GPU time and does not count
against the budget. The coordinator keeps the GPUs busy across strategies; a strategy only
decides order and where to stop. It also says what it is likely to propose next
(``upcoming``), so the coordinator compiles ahead on every core instead of a few
configurations per step: exact for ``exhaustive`` and ``random``, a guess for ``bayes``.

- ``exhaustive``: every configuration left after static pruning, in declaration order;
- ``random``: ``budget`` of them, drawn without replacement from a seeded generator, the
  stage's default first (so the table can say what tuning gained over it);
- ``bayes``: optuna's TPE sampler (the optional ``tune`` extra) over the declared values,
  one categorical dimension per parameter that varies, the default as its first trial; a
  configuration outside the legal set or already known is answered at once, so only new,
  legal configurations reach a GPU and count against the budget.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any, Protocol

from perfscope.errors import PerfscopeError
from perfscope.tune.space import Config

log = logging.getLogger(__name__)

STRATEGIES = ("exhaustive", "random", "bayes")
# A space larger than this is not measured whole unless asked (--strategy exhaustive): with
# no --budget, the search measures this many configurations per shape.
SMALL_SPACE = 64
# A configuration the strategy may not measure is told this value: worse than any ratio
# a kernel that ran can have, so TPE learns to leave that region.
FAILED_VALUE = 0.0


class Strategy(Protocol):
    """What the coordinator asks of a search strategy."""
    name: str
    # Whether upcoming is what propose will return (worth compiling all of it ahead), or
    # a guess (worth compiling only on cores that would otherwise wait).
    foresees: bool

    def propose(self, n: int) -> list[Config]:
        """Up to n configurations to measure next (fewer, or none, near the end)."""

    def observe(self, config: Config, value: float | None, measured: bool = True) -> None:
        """The outcome of a proposed configuration (None: it gave no ratio); measured is
        False when it never reached a GPU (pruned after compiling)."""

    def upcoming(self, n: int) -> list[Config]:
        """Up to n configurations not yet proposed, the likeliest next first (nothing is
        consumed: propose decides)."""

    @property
    def done(self) -> bool:
        """True once nothing more will be proposed."""


class Exhaustive:
    """Every candidate, in order."""

    name = "exhaustive"
    foresees = True

    def __init__(self, candidates: Sequence[Config]) -> None:
        self._todo = list(candidates)

    def propose(self, n: int) -> list[Config]:
        """Up to n configurations to measure next."""
        out, self._todo = self._todo[:n], self._todo[n:]
        return out

    def observe(self, config: Config, value: float | None, measured: bool = True) -> None:
        """The outcome of a proposed configuration."""
        return None

    def upcoming(self, n: int) -> list[Config]:
        """The next n candidates, in order."""
        return self._todo[:n]

    @property
    def done(self) -> bool:
        """True once nothing more will be proposed."""
        return not self._todo


class RandomSearch:
    """budget candidates drawn without replacement (seeded, so a resumed run draws the
    same), first the given one; one pruned after compiling is replaced by another draw."""

    name = "random"
    foresees = True

    def __init__(self, candidates: Sequence[Config], budget: int, seed: int = 0,
                 first: Config | None = None) -> None:
        pool = list(candidates)
        random.Random(seed).shuffle(pool)
        if first is not None and first in pool:
            pool.remove(first)
            pool.insert(0, first)
        self._pool = pool
        self._left = min(budget, len(pool))

    def propose(self, n: int) -> list[Config]:
        """Up to n configurations to measure next."""
        k = min(n, self._left)
        out, self._pool = self._pool[:k], self._pool[k:]
        self._left -= len(out)
        return out

    def observe(self, config: Config, value: float | None, measured: bool = True) -> None:
        """The outcome of a proposed configuration."""
        if not measured:
            self._left += 1

    def upcoming(self, n: int) -> list[Config]:
        """The next n draws, in order (past the budget: the replacements for pruned ones)."""
        return [] if self.done else self._pool[:n]

    @property
    def done(self) -> bool:
        """True once nothing more will be proposed."""
        return self._left <= 0 or not self._pool


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise PerfscopeError("--strategy bayes needs optuna: install perfscope with the 'tune' "
                             "extra (pip install 'perfscope[tune]')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class Bayes:
    """optuna's TPE sampler over the declared values, up to budget legal configurations."""

    name = "bayes"
    foresees = False
    # Asks per proposal before falling back to a legal configuration never measured (the
    # sampler may keep returning points it already knows once the good region is mapped).
    MAX_ASKS = 64

    def __init__(self, candidates: Sequence[Config], budget: int, seed: int = 0,
                 axes: Sequence[tuple[str, tuple[int, ...]]] = (), first: Config | None = None) -> None:
        optuna = _optuna()
        self._optuna = optuna
        self._legal = list(candidates)
        self._legal_set = set(self._legal)
        self._budget = min(budget, len(self._legal))
        self._template = self._legal[0] if self._legal else None
        varying = [(name, vals) for name, vals in axes if len(vals) > 1]
        self._dists = {name: optuna.distributions.CategoricalDistribution(vals)
                       for name, vals in varying}
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, max(2, budget // 3)))
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        self._known: dict[Config, float] = {}
        self._waiting: dict[Config, list[Any]] = {}   # proposed, not yet observed: their trials
        self._proposed = 0
        self._rng = random.Random(seed)
        # What upcoming guesses: the legal configurations in an order of their own (another
        # generator, so the fallback's draws stay as they were), the default first.
        self._guess = list(self._legal)
        random.Random(seed + 1).shuffle(self._guess)
        if first is not None and first in self._legal_set:
            self._guess.remove(first)
            self._guess.insert(0, first)
            self._study.enqueue_trial({k: first.params[k] for k in self._dists})

    def _config_of(self, params: dict[str, Any]) -> Config:
        assert self._template is not None
        merged = {**self._template.params, **{k: int(v) for k, v in params.items()}}
        return Config(tuple((k, merged[k]) for k, _ in self._template.values))

    def _fallback(self) -> Config | None:
        fresh = [c for c in self._legal if c not in self._known and c not in self._waiting]
        return self._rng.choice(fresh) if fresh else None

    def propose(self, n: int) -> list[Config]:
        """Up to n configurations to measure next."""
        out: list[Config] = []
        while len(out) < n and self._proposed < self._budget:
            config = None
            for _ in range(self.MAX_ASKS):
                trial = self._study.ask(self._dists)
                candidate = self._config_of(trial.params)
                if candidate not in self._legal_set:
                    self._study.tell(trial, FAILED_VALUE)
                elif candidate in self._known:
                    self._study.tell(trial, self._known[candidate])
                elif candidate in self._waiting:
                    self._waiting[candidate].append(trial)
                else:
                    self._waiting[candidate] = [trial]
                    config = candidate
                    break
            if config is None:
                config = self._fallback()
                if config is None:
                    break
                self._study.enqueue_trial({k: config.params[k] for k in self._dists})
                self._waiting[config] = [self._study.ask(self._dists)]
            self._proposed += 1
            out.append(config)
        return out

    def observe(self, config: Config, value: float | None, measured: bool = True) -> None:
        """The outcome of a proposed configuration."""
        if not measured:
            self._proposed -= 1
        score = FAILED_VALUE if value is None else value
        self._known[config] = score
        for trial in self._waiting.pop(config, []):
            self._study.tell(trial, score)

    def upcoming(self, n: int) -> list[Config]:
        """A guess (TPE decides as values come in): n legal configurations neither measured
        nor in flight, in a seeded order, the default first."""
        if self.done:
            return []
        out: list[Config] = []
        for config in self._guess:
            if len(out) == n:
                break
            if config not in self._known and config not in self._waiting:
                out.append(config)
        return out

    @property
    def done(self) -> bool:
        """True once nothing more will be proposed."""
        return self._proposed >= self._budget or len(self._known) >= len(self._legal)


def choose(name: str | None, size: int, budget: int | None) -> str:
    """The strategy for a space of size configurations: exhaustive when it fits the budget
    (or no budget is set), else bayes when optuna is installed, else random."""
    if name is not None:
        if name not in STRATEGIES:
            raise PerfscopeError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")
        if name == "exhaustive" and budget is not None and budget < size:
            raise PerfscopeError(f"--strategy exhaustive measures all {size} configurations; drop "
                                 "--budget, or search with --strategy random or bayes")
        if name != "exhaustive" and budget is None:
            raise PerfscopeError(f"--strategy {name} needs --budget N (configurations per shape)")
        return name
    if budget is None or budget >= size:
        return "exhaustive"
    try:
        import optuna  # noqa: F401
    except ImportError:
        log.warning("optuna is not installed; searching %d of %d configurations at random",
                    budget, size)
        return "random"
    return "bayes"


def make(name: str, candidates: Sequence[Config], budget: int | None, seed: int,
         axes: Sequence[tuple[str, tuple[int, ...]]], first: Config | None = None) -> Strategy:
    """The strategy called name over candidates; first (the default) is measured first."""
    if budget is not None and budget < 1:
        raise PerfscopeError(f"--budget must be at least 1, not {budget}")
    if name == "exhaustive":
        return Exhaustive(candidates)
    assert budget is not None
    if name == "random":
        return RandomSearch(candidates, budget, seed, first)
    return Bayes(candidates, budget, seed, axes, first)
