"""`perfscope tune`: plan, compile and prune, search, confirm, profile, and the document.

    plan      every input is checked before anything starts or is written: stages that
              declare a space, dtypes, shapes each stage can take, pinned parameters, a
              strategy that fits the budget, configurations left after static pruning, ncu
              when profiles are asked for
    start     the executor's GPU workers introduce themselves: GPU, driver, toolchain,
              the shared memory a block may opt into; results are keyed by them
    compile   every configuration a strategy proposes is compiled once per dtype, in
              parallel, and pruned on ptxas's report
    search    one strategy per (stage, dtype, shape); trials go to the workers, shapes in
              order, and each outcome is written to the store the moment it arrives
    confirm   the best few configurations per shape, and the default, timed again at length
    profile   best against worst under ncu, in a child process, and diffed
    document  built from the store, so a resumed run shows everything it holds

The store is the source of truth: a configuration the store already holds for the same
GPU, driver, toolchain and kernel source is never measured again (``--resume``); without
``--resume`` such a sweep is refused rather than silently mixed.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from perfscope.build import nvrtc_version, source_hash
from perfscope.documents import TuneDiff, TuneDocument, TuneShapeResult, TuneStats, TuneTrial
from perfscope.errors import PerfscopeError
from perfscope.kernels.launch import driver_compute_capability
from perfscope.kernels.registry import reference_name
from perfscope.kernels.spec import KernelSpec, Shape, normalize_dtype, parse_shape
from perfscope.manifest import ERROR, OK, WRONG
from perfscope.stage import ResourceUsage
from perfscope.timing import BenchOptions
from perfscope.tune import strategies
from perfscope.tune.compiling import CompileJob
from perfscope.tune.executors import Executor
from perfscope.tune.space import (
    SPILL_REASON,
    Config,
    Limits,
    compiled_prune,
    configurations,
    limits_for,
    static_prune,
    tunable_spec,
)
from perfscope.tune.store import (
    DEFAULT_STORE,
    ConfigKey,
    ConfigRow,
    Measured,
    ProfileKey,
    RunKey,
    Store,
    TrialKey,
    TrialRow,
    rank,
    run_key,
)
from perfscope.tune.tasks import CONFIRM, SCREEN, TrialOutcome, TrialTask, WorkerInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimingPlan:
    """How long a trial times each configuration (launches per round, rounds, warm-up, and
    bench --until's stopping rule: rounds past `rounds` until the ratio settles)."""

    runs: int = 10
    rounds: int = 2
    warmup: int = 2
    until: float | None = None
    max_rounds: int = 15

    def __post_init__(self) -> None:
        if self.runs < 1 or self.rounds < 1 or self.warmup < 0:
            raise PerfscopeError("--runs and --rounds must be at least 1")
        # The same refusals as bench's (one sentence), before any trial runs.
        BenchOptions(runs=self.runs, rounds=self.rounds, warmup=self.warmup, until=self.until,
                     max_rounds=self.max_rounds)


@dataclass(frozen=True)
class TuneRequest:
    """Everything `perfscope tune` was asked: what to tune, how, and where to keep it."""
    stages: tuple[str, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[str, ...] = ()
    pins: Mapping[str, int] = field(default_factory=dict)   # --param: parameters held fixed
    strategy: str | None = None                              # None: exhaustive when it fits
    budget: int | None = None                                # configurations per shape
    seed: int = 0
    screen: TimingPlan = TimingPlan(runs=10, rounds=3, warmup=2)
    confirm: int = 0                                         # best K per shape timed again
    confirm_timing: TimingPlan = TimingPlan(runs=20, rounds=5, warmup=3)
    profile_best: int = 0                                    # best and worst K under ncu
    profile_dtypes: tuple[str, ...] = ()                     # whose shapes (empty: every dtype)
    profile_out: Path | None = None
    profile_timeout: float = 1800.0
    resume: bool = False
    store: Path = DEFAULT_STORE
    arch: str | None = None
    deadline_s: float | None = None                          # stop dispatching after this
    keep_spills: bool = False                                # measure what ptxas spills
    command: str = ""


@dataclass(frozen=True)
class StagePlan:
    """One stage in one dtype: its configurations, those left after static pruning."""

    spec: KernelSpec
    dtype: str
    configs: tuple[Config, ...]
    legal: tuple[Config, ...]
    pruned: Mapping[Config, str]
    strategy: str
    budget: int | None = None      # configurations per shape (None: all of them)

    @property
    def axes(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each parameter with the values its legal configurations take."""
        return tuple((name, tuple(sorted({c.params[name] for c in self.legal})))
                     for name, _ in self.spec.params)


@dataclass(frozen=True)
class Study:
    """What one strategy searches: a stage in a dtype at a shape."""

    index: int
    stage: StagePlan
    shape: Shape

    @property
    def label(self) -> str:
        """'stage dtype MxNxK'."""
        return f"{self.stage.spec.name} {self.stage.dtype} {self.shape}"


@dataclass(frozen=True)
class TunePlan:
    """A checked request: the target, its limits, the stages and their studies."""
    request: TuneRequest
    arch: str
    limits: Limits
    stages: tuple[StagePlan, ...]
    studies: tuple[Study, ...]


@dataclass(frozen=True)
class TuneProgress:
    """One progress event: counts so far and an ETA for the phase running."""

    phase: str              # compile / search / confirm / profile / done
    compiled: int = 0
    to_compile: int = 0
    pruned: int = 0
    verified: int = 0       # right (OK) answers so far
    wrong: int = 0
    errors: int = 0
    timed: int = 0
    resumed: int = 0
    done: int = 0           # trials of this phase finished (resumed ones included)
    planned: int = 0        # trials this phase expects
    eta_s: float | None = None
    message: str = ""


Progress = Callable[[TuneProgress], None]


# ------------------------------------------------------------------------------ plan


def host_arch() -> str | None:
    """The cubin target of this host's first GPU, asked of the driver without CuPy."""
    cc = driver_compute_capability()
    if cc is None:
        return None
    return f"sm_{cc}{'a' if cc in (90, 100, 103) else ''}"


def plan_tune(request: TuneRequest, arch: str | None = None, smem_per_block: int | None = None,
              check_tools: bool = True) -> TunePlan:
    """Check the whole request and lay out its studies; every refusal is one sentence
    (check_tools: also that ncu is there when profiles are asked for)."""
    if not request.stages:
        raise PerfscopeError("name at least one stage to tune")
    if not request.shapes:
        raise PerfscopeError("give at least one shape (--shape MxNxK or --shapes FILE)")
    if request.confirm < 0 or request.profile_best < 0:
        raise PerfscopeError("--confirm and --profile-best take a count of 0 or more")
    if request.budget is not None and request.budget < 1:
        raise PerfscopeError(f"--budget must be at least 1, not {request.budget}")
    specs = [tunable_spec(name) for name in dict.fromkeys(request.stages)]
    dtypes = [normalize_dtype(d) for d in dict.fromkeys(request.dtypes)]
    target = request.arch or arch or specs[0].archs[0]
    limits = limits_for(target, smem_per_block)
    stage_plans: list[StagePlan] = []
    for spec in specs:
        spec.check_arch(target)
        for shape in request.shapes:
            spec.check_shape(shape)
        for dtype in dtypes or [spec.dtypes[0]]:
            spec.check_dtype(dtype)
            stage_plans.append(_stage_plan(spec, dtype, request, limits))
    studies = tuple(Study(i, sp, shape) for i, (sp, shape) in
                    enumerate(itertools.product(stage_plans, request.shapes)))
    if request.profile_best and check_tools:
        check_ncu()   # now, not after minutes of tuning: a missing ncu is bad input
    return TunePlan(request, target, limits, tuple(stage_plans), studies)


def check_ncu() -> None:
    """Refuse --profile-best when ncu is missing, asked in a child process: perfscope.ncu
    loads Nsight Compute's report reader, and Ray (or CuPy) aborts in a process that has it."""
    proc = subprocess.run([sys.executable, "-m", "perfscope.tune.profiled", "--check"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        lines = proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or ["?"]
        raise PerfscopeError(f"--profile-best needs Nsight Compute: {lines[-1]}")


def _stage_plan(spec: KernelSpec, dtype: str, request: TuneRequest, limits: Limits) -> StagePlan:
    configs = configurations(spec, request.pins)
    pruned = {}
    for c in configs:
        why = static_prune(spec, c, dtype, limits)
        if why is not None:
            pruned[c] = why
    legal = tuple(c for c in configs if c not in pruned)
    if not legal:
        example = next(iter(pruned.values()))
        raise PerfscopeError(f"no configuration of {spec.name} ({dtype}) is left after pruning: "
                             f"all {len(configs)} break a limit before compiling, e.g. {example}")
    budget = request.budget
    if budget is None and request.strategy is None and len(legal) > strategies.SMALL_SPACE:
        # Too many to measure them all by default: search the first SMALL_SPACE well instead.
        budget = strategies.SMALL_SPACE
    name = strategies.choose(request.strategy, len(legal), budget)
    return StagePlan(spec, dtype, configs, legal, pruned, name, budget)


def read_shapes(path: Path) -> tuple[Shape, ...]:
    """Shapes from a file: one MxNxK per line; blank lines and # comments are skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PerfscopeError(f"cannot read the shapes file {path}: {exc.strerror}") from None
    shapes = []
    for number, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            shapes.append(parse_shape(item))
        except PerfscopeError as exc:
            raise PerfscopeError(f"{path} line {number}: {exc}") from None
    if not shapes:
        raise PerfscopeError(f"the shapes file {path} names no shape")
    return tuple(dict.fromkeys(shapes))


# ------------------------------------------------------------------------------ run


@dataclass
class _Counters:
    compile_wall: float = 0.0
    compile_serial: float = 0.0
    compiled: int = 0
    cached: int = 0
    pruned_compiled: int = 0
    verify_s: float = 0.0
    time_s: float = 0.0
    run: int = 0
    resumed: int = 0
    confirmed: int = 0
    wrong: int = 0
    errors: int = 0
    verified: int = 0
    timed: int = 0
    search_wall: float = 0.0
    confirm_wall: float = 0.0
    profile_wall: float = 0.0
    stopped: str = ""


class _Sweep:
    """The running tune: store, executor, what is compiled, what is in flight."""

    def __init__(self, plan: TunePlan, store: Store, executor: Executor, run: RunKey,
                 progress: Progress | None, worker_count: int) -> None:
        self.plan, self.store, self.executor, self.run = plan, store, executor, run
        self.progress = progress or (lambda _p: None)
        self.workers = worker_count
        self.sources = {sp.spec.name: source_hash(sp.spec.source_path().read_text(), sp.spec.kernel_dir)
                        for sp in plan.stages}
        self.nvrtc = nvrtc_version()
        self.compiled: dict[tuple[str, str, Config], ConfigRow] = {}
        self.built: set[tuple[str, str, Config]] = set()   # compiled (or cache-read) this run
        self.counts = _Counters()
        self.session: int | None = None
        self.started = time.monotonic()
        self._ids = itertools.count(1)

    # ---------------------------------------------------------------- keys

    def trial_key(self, study: Study, config: Config) -> TrialKey:
        sp = study.stage
        return TrialKey(sp.spec.name, config.key, study.shape, sp.dtype, self.run,
                        self.sources[sp.spec.name])

    def profile_key(self, study: Study, best: TrialRow, worst: TrialRow) -> ProfileKey:
        sp = study.stage
        return ProfileKey(sp.spec.name, sp.dtype, study.shape, self.run, self.sources[sp.spec.name],
                          best.key.params, worst.key.params)

    def config_key(self, sp: StagePlan, config: Config) -> ConfigKey:
        return ConfigKey(sp.spec.name, sp.dtype, config.key, self.plan.arch,
                         self.sources[sp.spec.name], self.nvrtc)

    def past_deadline(self) -> bool:
        limit = self.plan.request.deadline_s
        return limit is not None and time.monotonic() - self.started > limit

    # ---------------------------------------------------------------- refusing a rerun

    def existing(self) -> int:
        """Trials of this sweep the store already holds (same run key and source)."""
        n = 0
        for study in self.plan.studies:
            sp = study.stage
            held = {r.key.params for r in self.store.trials(sp.spec.name, sp.dtype, study.shape,
                                                              self.run, self.sources[sp.spec.name])}
            n += sum(c.key in held for c in sp.legal)
        return n

    # ---------------------------------------------------------------- compiling

    def record_static_prunes(self) -> None:
        for sp in self.plan.stages:
            for config, why in sp.pruned.items():
                key = self.config_key(sp, config)
                if self.store.config(key) is None:
                    self.store.record_config(ConfigRow(key, "pruned", why))

    def compile(self, items: Sequence[tuple[StagePlan, Config]], timed_again: bool = False) -> None:
        """Compile (or find in the store) every item not yet known; prune on ptxas.
        timed_again: the items are to be timed although the store holds their trials (the
        confirmation), so their cubins are wanted all the same."""
        todo: dict[tuple[str, str, Config], tuple[StagePlan, Config]] = {}
        for sp, config in items:
            ident = (sp.spec.name, sp.dtype, config)
            if ident in self.built or ident in todo:
                continue
            row = self.compiled.get(ident)
            if row is None:
                stored = self.store.config(self.config_key(sp, config))
                if stored is not None:
                    row = self.compiled[ident] = self.judged(sp, config, stored)
            # A configuration the store knows is compiled again unless it is pruned or every
            # shape holds its trial: the cubin lives in this host's cache, not the store, and
            # a worker that misses it compiles alone (a resumed sweep on a fresh machine
            # spent 1.4 s a trial so).
            if row is not None and (not row.ok or (not timed_again
                                                   and self.held_everywhere(sp, config))):
                continue
            todo[ident] = (sp, config)
        if not todo:
            return
        jobs = [CompileJob(sp.spec.name, sp.dtype, self.plan.arch, c) for sp, c in todo.values()]
        by_job = {(j.stage, j.dtype, j.config): todo[(j.stage, j.dtype, j.config)] for j in jobs}
        start = time.monotonic()
        c = self.counts
        for outcome in self.executor.compile(jobs):
            job = outcome.job
            sp, config = by_job[(job.stage, job.dtype, job.config)]
            spec = sp.spec.with_params(**config.params)
            key = self.config_key(sp, config)
            c.compiled += 1
            c.cached += outcome.from_cache
            c.compile_serial += outcome.seconds
            if outcome.usage is None:
                row = ConfigRow(key, "pruned", outcome.reason, compile_s=outcome.seconds)
            else:
                u = outcome.usage
                why = self.prune_reason(sp, config, u)
                row = ConfigRow(key, "pruned" if why else "ok", why or "", u.registers,
                                u.spill_stores, u.spill_loads, u.static_smem,
                                spec.dynamic_smem_bytes(), outcome.seconds, outcome.from_cache)
            c.pruned_compiled += not row.ok
            self.store.record_config(row)
            self.compiled[(job.stage, job.dtype, job.config)] = row
            self.built.add((job.stage, job.dtype, job.config))
            self.progress(TuneProgress("compile", compiled=c.compiled, to_compile=len(jobs),
                                       pruned=c.pruned_compiled,
                                       message=f"{job.stage} {job.dtype} {config.text}"))
        c.compile_wall += time.monotonic() - start

    def held_everywhere(self, sp: StagePlan, config: Config) -> bool:
        """Whether the store holds this configuration's trial at every shape of its stage."""
        return all(self.store.trial(self.trial_key(study, config)) is not None
                   for study in self.plan.studies if study.stage is sp)

    def spill_pruned(self) -> int:
        """Configurations this run pruned for ptxas's spills alone."""
        return sum(not r.ok and r.reason.startswith(SPILL_REASON) for r in self.compiled.values())

    def prune_reason(self, sp: StagePlan, config: Config, usage: ResourceUsage) -> str | None:
        """Why ptxas's report prunes config under this run's limits and --keep-spills."""
        return compiled_prune(sp.spec, config, usage, self.plan.limits,
                              self.plan.request.keep_spills)

    def judged(self, sp: StagePlan, config: Config, row: ConfigRow) -> ConfigRow:
        """A stored compile judged again by this run's policy (--keep-spills), from the
        ptxas report the store kept; a configuration that did not compile stays pruned."""
        if row.registers is None:
            return row
        usage = ResourceUsage(row.registers, row.static_smem or 0, 0, row.spill_stores or 0,
                              row.spill_loads or 0)
        why = self.prune_reason(sp, config, usage) or ""
        if why == row.reason:   # an ok row's reason is ""
            return row
        row = replace(row, status="pruned" if why else "ok", reason=why)
        self.store.record_config(row)
        return row

    def config_row(self, sp: StagePlan, config: Config) -> ConfigRow:
        return self.compiled[(sp.spec.name, sp.dtype, config)]

    def is_compiled(self, sp: StagePlan, config: Config) -> bool:
        """Known to this run: compiled by it, or its stored row read (compile reads them)."""
        return (sp.spec.name, sp.dtype, config) in self.compiled

    # ---------------------------------------------------------------- tasks

    def task(self, study: Study, config: Config, phase: str) -> TrialTask:
        sp, t = study.stage, (self.plan.request.screen if phase == SCREEN
                              else self.plan.request.confirm_timing)
        s = study.shape
        return TrialTask(id=next(self._ids), stage=sp.spec.name, dtype=sp.dtype, m=s.m, n=s.n,
                         k=s.k, params=config.params, arch=self.plan.arch, phase=phase,
                         verify=phase == SCREEN, runs=t.runs, rounds=t.rounds, warmup=t.warmup,
                         seed=self.plan.request.seed, until=t.until, max_rounds=t.max_rounds)

    def record(self, study: Study, config: Config, outcome: TrialOutcome) -> float | None:
        """Write a screening outcome; the value its strategy is told."""
        c = self.counts
        c.run += 1
        c.verify_s += outcome.verify_s
        c.time_s += outcome.time_s
        c.wrong += outcome.verdict == WRONG
        c.errors += outcome.verdict == ERROR
        c.verified += outcome.verdict == OK
        c.timed += outcome.timing is not None
        timing = outcome.timing if outcome.verdict == OK else None
        found = Measured(outcome.verdict, outcome.detail, outcome.rel_error, outcome.verify_s,
                         outcome.worker, timing, outcome.time_s)
        self.store.record_trial(self.trial_key(study, config), found, self.session)
        if timing is None or timing.ratio_to_reference is None:
            return None
        return timing.ratio_to_reference.median

    def report(self, phase: str, done: int, planned: int, phase_start: float, ran: int,
               message: str = "") -> None:
        c = self.counts
        elapsed = time.monotonic() - phase_start
        eta = (planned - done) * elapsed / ran if ran and planned > done else None
        self.progress(TuneProgress(phase, c.compiled, c.compiled, c.pruned_compiled, c.verified,
                                   c.wrong, c.errors, c.timed, c.resumed, done, planned, eta,
                                   message))


def _strategy(plan: TunePlan, study: Study) -> strategies.Strategy:
    sp = study.stage
    return strategies.make(sp.strategy, sp.legal, sp.budget,
                           plan.request.seed + study.index, sp.axes, Config.of(sp.spec, {}))


def _ahead(sweep: _Sweep, strats: Mapping[int, strategies.Strategy], room: int,
           taken: Sequence[tuple[StagePlan, Config]]) -> list[tuple[StagePlan, Config]]:
    """Up to room configurations the strategies are likely to propose soon and that are not
    compiled yet (nor in taken), one study after another in turn, the likeliest first."""
    seen = {(sp.spec.name, sp.dtype, c) for sp, c in taken}
    queues = [(study.stage, iter(strats[study.index].upcoming(len(study.stage.legal))))
              for study in sweep.plan.studies]
    out: list[tuple[StagePlan, Config]] = []
    while queues and len(out) < room:
        for entry in list(queues):
            sp, configs = entry
            for config in configs:
                ident = (sp.spec.name, sp.dtype, config)
                if ident not in seen and not sweep.is_compiled(sp, config):
                    seen.add(ident)
                    out.append((sp, config))
                    break
            else:
                queues.remove(entry)
            if len(out) == room:
                break
    return out


def _search(sweep: _Sweep) -> None:
    """Every study's strategy to its end (or the deadline); outcomes stored as they come.

    Compiles run ahead of the proposals: what a strategy foresees (random's draws, within
    its budget) is compiled in one parallel batch first, and a step that must compile fills
    its batch up to the compiler processes with what the strategies will likely ask next,
    so the cores work together and the GPUs wait one compile at most (a few configurations
    per step had kept 16 processes at 1.3x, the GPU idle 90% of a 260 s sweep)."""
    plan, ex = sweep.plan, sweep.executor
    strats = {s.index: _strategy(plan, s) for s in plan.studies}
    processes = max(1, ex.compile_processes)
    first: list[tuple[StagePlan, Config]] = []
    for study in plan.studies:
        strat, sp = strats[study.index], study.stage
        if sp.strategy != "exhaustive":   # an exhaustive study was compiled whole already
            count = sp.budget or len(sp.legal)
            first += [(sp, c) for c in strat.upcoming(count if strat.foresees else processes)]
    sweep.compile(first)

    def expected(study: Study) -> int:
        sp = study.stage
        if sp.strategy != "exhaustive":
            return min(sp.budget or 0, len(sp.legal))
        # Compiled up front: what ptxas pruned is not going to be measured.
        rows = [sweep.compiled.get((sp.spec.name, sp.dtype, c)) for c in sp.legal]
        return sum(r is None or r.ok for r in rows)

    planned = sum(expected(s) for s in plan.studies)
    # Lower study index first: a worker meets its shapes one after another, so the float64
    # reference and the cuBLAS handle it keeps for a shape are reused.
    ready: list[tuple[int, int, Study, Config]] = []
    flying: dict[int, tuple[Study, Config]] = {}
    outstanding = {s.index: 0 for s in plan.studies}
    seq = itertools.count()
    done = ran = 0
    start = time.monotonic()

    def observe(study: Study, config: Config, value: float | None, measured: bool = True) -> None:
        nonlocal done
        strats[study.index].observe(config, value, measured)
        outstanding[study.index] -= 1
        done += measured

    while True:
        # 1. Proposals, from every study that has room, compiled in one batch.
        stop = sweep.past_deadline()
        proposals: list[tuple[Study, Config]] = []
        if not stop:
            for study in plan.studies:
                strat = strats[study.index]
                room = max(1, ex.capacity) - outstanding[study.index]
                if room > 0 and not strat.done:
                    for config in strat.propose(room):
                        outstanding[study.index] += 1
                        proposals.append((study, config))
        needed = [(s.stage, c) for s, c in proposals if not sweep.is_compiled(s.stage, c)]
        if needed:
            needed += _ahead(sweep, strats, processes - len(needed), needed)
        sweep.compile(needed)
        for study, config in proposals:
            held = sweep.store.trial(sweep.trial_key(study, config))
            if held is not None:
                sweep.counts.resumed += 1
                observe(study, config, held.ratio if held.verdict == OK else None)
            elif not sweep.config_row(study.stage, config).ok:
                observe(study, config, None, measured=False)
            else:
                heapq.heappush(ready, (study.index, next(seq), study, config))
        # 2. Keep the workers fed, lowest study first.
        while ready and ex.busy < ex.capacity and not stop:
            _, _, study, config = heapq.heappop(ready)
            task = sweep.task(study, config, SCREEN)
            flying[task.id] = (study, config)
            ex.submit(task)
        if stop and (ready or not all(strats[s.index].done for s in plan.studies)):
            sweep.counts.stopped = (f"the {plan.request.deadline_s:.0f} s deadline passed before "
                                    f"every configuration was measured ({done} were); run again "
                                    "with --resume to finish")
            ready.clear()
        if not flying and not ready:
            # Nothing runs: go on only while the last proposals were all answered at once
            # (held in the store, or pruned), since the strategies may have more.
            if stop or not proposals:
                break
            continue
        # 3. Collect what finished.
        for outcome in ex.results(0.5 if flying else 0.0):
            if outcome.task_id not in flying:
                continue
            study, config = flying.pop(outcome.task_id)
            value = sweep.record(study, config, outcome)
            observe(study, config, value)
            ran += 1
            ratio = "" if value is None else f" {value:.3f}"
            sweep.report("search", done, planned, start, ran,
                         f"{study.label} {config.label(study.stage.spec.param_dict)}: "
                         f"{outcome.verdict}{ratio}")
    sweep.counts.search_wall = time.monotonic() - start


def _confirm(sweep: _Sweep) -> None:
    """Time the best K per study (and the default) again, at length."""
    plan, ex = sweep.plan, sweep.executor
    k = plan.request.confirm
    if k <= 0 or sweep.counts.stopped:
        return
    todo: list[tuple[Study, Config, TrialRow]] = []
    for study in plan.studies:
        sp = study.stage
        rows = [r for r in sweep.store.trials(sp.spec.name, sp.dtype, study.shape, sweep.run,
                                              sweep.sources[sp.spec.name])
                if r.verdict == OK and "screen" in r.timings and r.timings["screen"].ratio_to_reference]
        rows.sort(key=lambda r: -r.timings["screen"].ratio_to_reference.median)  # type: ignore[union-attr]
        default_key = Config.of(sp.spec, {}).key
        chosen = rows[:k] + [r for r in rows[k:] if r.key.params == default_key]
        todo += [(study, Config.from_key(sp.spec, r.key.params), r) for r in chosen
                 if "confirm" not in r.timings]
        sweep.counts.resumed += sum("confirm" in r.timings for r in chosen)
    sweep.compile([(study.stage, config) for study, config, _ in todo], timed_again=True)
    start = time.monotonic()
    flying: dict[int, tuple[Study, Config, TrialRow]] = {}
    queue = list(todo)
    done = 0
    while queue or flying:
        if sweep.past_deadline():
            sweep.counts.stopped = ("the deadline passed during confirmation; run again with "
                                    "--resume to finish")
            queue.clear()
        while queue and ex.busy < ex.capacity:
            study, config, row = queue.pop(0)
            task = sweep.task(study, config, CONFIRM)
            flying[task.id] = (study, config, row)
            ex.submit(task)
        if not flying:
            break
        for outcome in ex.results(0.5):
            if outcome.task_id not in flying:
                continue
            study, config, row = flying.pop(outcome.task_id)
            done += 1
            sweep.counts.time_s += outcome.time_s
            if outcome.verdict == OK and outcome.timing is not None:
                sweep.store.record_timing(row.id, CONFIRM, outcome.timing, outcome.time_s,
                                          outcome.worker)
                sweep.counts.confirmed += 1
            else:
                log.warning("confirming %s %s failed: %s", study.label, config.text, outcome.detail)
            sweep.report("confirm", done, len(todo), start, done, f"{study.label} {config.text}")
    sweep.counts.confirm_wall = time.monotonic() - start


# ------------------------------------------------------------------------------ profiles


def _profile_pairs(sweep: _Sweep) -> list[tuple[Study, TrialRow, TrialRow]]:
    k = sweep.plan.request.profile_best
    pairs = []
    wanted = sweep.plan.request.profile_dtypes
    for study in sweep.plan.studies:
        sp = study.stage
        if wanted and sp.dtype not in wanted:
            continue
        rows = sorted((r for r in sweep.store.trials(sp.spec.name, sp.dtype, study.shape, sweep.run,
                                                      sweep.sources[sp.spec.name])
                       if r.verdict == OK and r.ratio is not None),
                      key=lambda r: rank(r.phase, r.ratio))
        n = min(k, len(rows) // 2)
        pairs += [(study, rows[i], rows[-1 - i]) for i in range(n)]
    return pairs


def _profile(sweep: _Sweep) -> str:
    """Best against worst under ncu, in a child process; "" or why it could not be done."""
    if sweep.plan.request.profile_best <= 0 or sweep.counts.stopped:
        return ""
    start = time.monotonic()
    todo = []
    for study, best, worst in _profile_pairs(sweep):
        if sweep.store.profile(sweep.profile_key(study, best, worst)) is None:
            todo.append((study, best, worst))
    if not todo:
        return ""
    out = sweep.plan.request.profile_out or sweep.store.path.parent / "profiles"
    limit = sweep.plan.request.profile_timeout
    # ncu gets three quarters of the limit; the rest is for diagnosing and diffing the reports.
    request = {"out": str(out), "timeout": 0.75 * limit, "pairs": [
        {"stage": s.stage.spec.name, "dtype": s.stage.dtype, "shape": str(s.shape),
         "best": b.params, "worst": w.params} for s, b, w in todo]}
    sweep.progress(TuneProgress("profile", planned=len(todo),
                                message=f"profiling {len(todo)} best/worst pair(s) under ncu"))
    with tempfile.TemporaryDirectory(prefix="perfscope-tune-") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        try:
            proc = subprocess.run([sys.executable, "-m", "perfscope.tune.profiled", str(req_path),
                                   str(res_path)], timeout=limit)
        except subprocess.TimeoutExpired:
            return "the ncu profiles ran past their timeout"
        if not res_path.is_file():
            return f"the profiling process ended with code {proc.returncode} and wrote no result"
        result = json.loads(res_path.read_text())
    sweep.counts.profile_wall = time.monotonic() - start
    if result.get("error"):
        return result["error"]
    for (study, best, worst), diff in zip(todo, result["pairs"], strict=True):
        sweep.store.record_profile(sweep.profile_key(study, best, worst), diff)
    return ""


# ------------------------------------------------------------------------------ document


def varying_text(spec: KernelSpec, config: Config) -> str:
    """The configuration's parameters that its space lets vary (fixed ones add nothing)."""
    fixed = {n for n, vals in (spec.space.values if spec.space else ()) if len(vals) == 1}
    return " ".join(f"{k}={v}" for k, v in config.values if k not in fixed) or config.text


def _trial_of(row: TrialRow, spec: KernelSpec, config_row: ConfigRow | None) -> TuneTrial:
    config = Config.from_key(spec, row.key.params)
    t = row.timing
    return TuneTrial(config=varying_text(spec, config), label=config.label(spec.param_dict),
                     verdict=row.verdict,
                     detail=row.detail, ratio=t.ratio_to_reference if t else None,
                     tflops=t.tflops.median if t else None,
                     reference_tflops=t.reference_tflops.median if t and t.reference_tflops else None,
                     phase=row.phase, registers=config_row.registers if config_row else None,
                     sm_mhz=t.sm_clock_mhz.median if t and t.sm_clock_mhz else None,
                     spill_bytes=(config_row.spill_stores or None) if config_row else None)


def _diff_of(result: Mapping[str, Any] | None) -> TuneDiff | None:
    if result is None:
        return None
    return TuneDiff(best=result.get("best", ""), worst=result.get("worst", ""),
                    best_report=result.get("best_report", ""),
                    worst_report=result.get("worst_report", ""),
                    cycles_ratio=result.get("cycles_ratio"),
                    verdict=tuple(result.get("verdict", ())),
                    new_findings=tuple(result.get("new_findings", ())),
                    gone_findings=tuple(result.get("gone_findings", ())),
                    error=result.get("error", ""))


@dataclass(frozen=True)
class RunSummary:
    """What a run adds to the store's results in its document."""

    stats: TuneStats
    environment: Mapping[str, str]
    notes: tuple[str, ...] = ()


def document(store: Store, plan: TunePlan, run: RunKey, sources: Mapping[str, str],
             summary: RunSummary) -> TuneDocument:
    """The tune's results as the store holds them, best first per (stage, dtype, shape)."""
    results = []
    for study in plan.studies:
        sp = study.stage
        spec, source = sp.spec, sources[sp.spec.name]
        configs = {r.key.params: r for r in store.configs(spec.name, sp.dtype)
                   if r.key.source == source and r.key.arch == plan.arch}
        rows = store.trials(spec.name, sp.dtype, study.shape, run, source)
        trials = [_trial_of(r, spec, configs.get(r.key.params)) for r in rows]
        trials.sort(key=lambda t: (*rank(t.phase, t.ratio.median if t.ratio else None), t.config))
        wanted = {c.key for c in sp.configs}
        measured = {r.key.params for r in rows}   # a run with --keep-spills may have timed it
        pruned = tuple((Config.from_key(spec, k).label(spec.param_dict), r.reason)
                       for k, r in configs.items() if not r.ok and k in wanted and k not in measured)
        diff = None
        timed = [r for r in rows if r.verdict == OK and r.ratio is not None]
        if len(timed) >= 2:
            best = max(timed, key=lambda r: r.ratio or 0.0)
            worst = min(timed, key=lambda r: r.ratio or 0.0)
            diff = _diff_of(store.profile(ProfileKey(spec.name, sp.dtype, study.shape, run, source,
                                                     best.key.params, worst.key.params)))
        results.append(TuneShapeResult(spec.name, sp.dtype, str(study.shape), sp.strategy,
                                       len(sp.configs), tuple(trials), pruned, diff,
                                       reference_label(spec, sp.dtype, sp.configs)))
    return TuneDocument(tuple(results), summary.stats, tuple(summary.environment.items()),
                        str(store.path), plan.request.command, summary.notes)


def reference_label(spec: KernelSpec, dtype: str, configs: Sequence[Config]) -> str:
    """What a study's ratios are to: "cuBLAS", or for a fused stage the group of launches of
    the epilogue its configurations compute (held or pinned, so the same for all of them)."""
    if spec.family != "fused":
        return "cuBLAS"
    return reference_name(spec.with_params(**configs[0].params) if configs else spec, dtype)


def _environment(info: WorkerInfo, run: RunKey, workers: int) -> dict[str, str]:
    e = info.environment
    out = {"gpu": e.gpu, "gpus": str(workers), "compute capability": e.compute_capability,
           "driver": run.driver, "toolchain": run.toolchain}
    for key in ("sm_clock_max_mhz", "sm_clock_app_mhz", "sm_clock_at_start_mhz", "power_limit_w"):
        if e.extra.get(key):
            out[key.replace("_", " ")] = e.extra[key]
    return out


def _stats(sweep: _Sweep, wall: float, executor: str, pool: int) -> TuneStats:
    c = sweep.counts
    static = sum(len(sp.pruned) for sp in sweep.plan.stages)
    return TuneStats(wall_s=wall, compile_wall_s=c.compile_wall, compile_serial_s=c.compile_serial,
                     compile_processes=pool, compiled=c.compiled, compiled_cached=c.cached,
                     pruned_static=static, pruned_compiled=c.pruned_compiled,
                     search_wall_s=c.search_wall, confirm_wall_s=c.confirm_wall,
                     profile_wall_s=c.profile_wall, verify_s=c.verify_s, time_s=c.time_s,
                     trials_run=c.run, trials_resumed=c.resumed, confirmed=c.confirmed,
                     wrong=c.wrong, errors=c.errors, workers=sweep.workers, executor=executor,
                     stopped=c.stopped)


@dataclass(frozen=True)
class RunOptions:
    """How the run is carried out, beside what it tunes."""

    executor_name: str = "local"
    progress: Progress | None = None


def _check_workers(infos: Sequence[WorkerInfo]) -> WorkerInfo:
    if not infos:
        raise PerfscopeError("no tune worker started")
    kinds = sorted({(i.environment.gpu, i.arch or "") for i in infos})
    if len(kinds) > 1:
        raise PerfscopeError("the workers see different GPUs (" + ", ".join(g for g, _ in kinds)
                             + "); tune one kind at a time (CUDA_VISIBLE_DEVICES)")
    return infos[0]


def run(request: TuneRequest, executor: Executor, options: RunOptions | None = None) -> TuneDocument:
    """The whole tune: see the module docstring. Bad input is refused before the store is
    opened or a worker started; every result is in the store as soon as it is measured."""
    options = options or RunOptions()
    wall = time.monotonic()
    plan = plan_tune(request, request.arch or host_arch())
    store = Store.open(request.store)
    try:
        infos = executor.start()
        try:
            first = _check_workers(infos)
            if first.smem_per_block or (first.arch and request.arch is None):
                # The workers' GPU decides the target and its shared-memory budget.
                plan = plan_tune(request, request.arch or first.arch or plan.arch,
                                 first.smem_per_block, check_tools=False)
            key = run_key(first.environment)
            sweep = _Sweep(plan, store, executor, key, options.progress, len(infos))
            held = sweep.existing()
            if held and not request.resume:
                raise PerfscopeError(
                    f"the store {store.path} already holds {held} result(s) of this sweep (same "
                    "GPU, driver, toolchain and kernel source); pass --resume to continue it "
                    "without measuring them again, or --store NEW.sqlite to start another")
            sweep.session = store.begin_session(request.command, _request_dict(request))
            sweep.record_static_prunes()
            if plan.studies and all(s.stage.strategy == "exhaustive" for s in plan.studies):
                # Everything is known up front: one parallel batch for the whole space.
                sweep.compile([(sp, c) for sp in plan.stages for c in sp.legal])
            _check_compiled(sweep)
            _search(sweep)
            _confirm(sweep)
            processes = executor.compile_processes
        finally:
            executor.close()
        # Profiles need the GPUs the workers held: they start once the workers are gone.
        profile_error = _profile(sweep)
        stats = _stats(sweep, time.monotonic() - wall, options.executor_name, processes)
        env = _environment(first, key, len(infos))
        store.end_session(sweep.session, env, asdict(stats))
        notes = [f"--profile-best: {profile_error}"] if profile_error else []
        if stats.stopped:
            notes.append(stats.stopped)
        spilled = sweep.spill_pruned()
        if spilled:
            notes.append(f"{spilled} configuration(s) pruned because ptxas spills registers; "
                         "--keep-spills measures them too (a few spilled bytes can cost nothing)")
        sweep.progress(TuneProgress("done"))
        return document(store, plan, key, sweep.sources, RunSummary(stats, env, tuple(notes)))
    finally:
        store.close()


def _check_compiled(sweep: _Sweep) -> None:
    """After the up-front batch: a stage whose every configuration ptxas pruned is refused."""
    for sp in sweep.plan.stages:
        rows = [sweep.compiled.get((sp.spec.name, sp.dtype, c)) for c in sp.legal]
        if rows and all(r is not None and not r.ok for r in rows):
            example = rows[0].reason if rows[0] is not None else ""
            raise PerfscopeError(f"no configuration of {sp.spec.name} ({sp.dtype}) is left after "
                                 f"pruning: all {len(rows)} that pass the limits fail after "
                                 f"compiling, e.g. {example}")


def _request_dict(request: TuneRequest) -> dict[str, Any]:
    d = asdict(request)
    d["shapes"] = [str(s) for s in request.shapes]
    return d
