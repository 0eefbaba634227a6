"""Where compiles and trials run: one local worker process per GPU, or Ray tasks.

Both executors take the same CompileJobs and TrialTasks and give back the same outcomes;
the coordinator (perfscope.tune.workflow) writes them to the store, so where a result was
measured never changes how it is kept.

- ``LocalExecutor``: compiles in a process pool on this host's cores, and starts one
  ``python -m perfscope.tune.worker`` per visible GPU with ``CUDA_VISIBLE_DEVICES`` set to
  that GPU alone. A worker takes one task at a time; one that crashes, hangs past the task
  timeout, or breaks its CUDA context is replaced, and its task is recorded as an error.
- ``RayExecutor`` (the ``cluster`` extra): compiles as Ray tasks with one CPU each and runs
  the trials on one Ray actor per GPU, each holding ``num_gpus=1`` (Ray sets its
  ``CUDA_VISIBLE_DEVICES``), on a running Ray cluster or a local instance.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perfscope.errors import PerfscopeError
from perfscope.kernels.launch import driver_device_count
from perfscope.manifest import ERROR
from perfscope.tune import worker as worker_mod
from perfscope.tune.compiling import CompileJob, CompileOutcome, CompilePool, compile_one
from perfscope.tune.tasks import TrialOutcome, TrialTask, WorkerInfo

log = logging.getLogger(__name__)

WORKER_MODULE = "perfscope.tune.worker"


class Executor(Protocol):
    """What the coordinator needs of an executor."""

    @property
    def compile_processes(self) -> int:
        """How many compiles run at once."""

    def start(self) -> tuple[WorkerInfo, ...]:
        """Start the GPU workers; each one's introduction."""

    def compile(self, jobs: Sequence[CompileJob]) -> Iterator[CompileOutcome]:
        """Compile jobs in parallel; outcomes as they finish."""

    @property
    def capacity(self) -> int:
        """How many trials are worth having submitted at once."""

    def submit(self, task: TrialTask) -> None:
        """Queue a trial; its outcome comes back from results()."""

    def results(self, timeout: float) -> list[TrialOutcome]:
        """Outcomes that arrived within timeout seconds (maybe none)."""

    @property
    def busy(self) -> int:
        """Trials submitted and not yet answered."""

    def close(self) -> None:
        """Stop every worker (what they measured is already handed back)."""


def visible_devices() -> tuple[str, ...]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries, else every device
    the driver reports (asked without CuPy)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return tuple(d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1")
    return tuple(str(i) for i in range(driver_device_count()))


@dataclass(frozen=True)
class LocalOptions:
    """How the local executor runs its workers."""
    devices: tuple[str, ...]               # one worker per entry, its CUDA_VISIBLE_DEVICES
    dry: bool = False                      # workers compile and answer synthetic timings
    compile_jobs: int | None = None        # compiler processes (default: the host's cores)
    command: tuple[str, ...] | None = None  # the worker's argv (tests substitute a fake)
    task_timeout: float = 300.0            # seconds one trial may take before its worker dies
    start_timeout: float = 180.0
    max_restarts: int = 8                  # per worker, before the run gives up on it


class _Worker:
    """One child process and the threads that read its pipes into the executor's queue."""

    def __init__(self, index: int, device: str, argv: Sequence[str], events: queue.Queue,
                 generation: int) -> None:
        self.index, self.device, self.generation = index, device, generation
        self.task: TrialTask | None = None
        self.deadline = 0.0
        self.ready = False
        self.info: WorkerInfo | None = None
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.started = time.monotonic()
        threading.Thread(target=self._read, args=(events,), daemon=True).start()
        threading.Thread(target=self._log, daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                events.put((self.index, self.generation, json.loads(line)))
            except ValueError:
                log.warning("worker %s wrote a line that is not JSON: %s", self.device, line[:200])
        events.put((self.index, self.generation, None))

    def _log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            log.info("worker %s: %s", self.device, line.rstrip())

    def send(self, message: dict[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.send({"op": "exit"})
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                log.warning("worker %s (pid %d) did not die", self.device, self.proc.pid)


class LocalExecutor:
    """One worker process per GPU of this host, and a compile pool on its cores."""

    def __init__(self, options: LocalOptions) -> None:
        self.options = options
        self._argv = tuple(options.command or (sys.executable, "-m", WORKER_MODULE,
                                               *(["--dry"] if options.dry else [])))
        self._events: queue.Queue = queue.Queue()
        self._workers: list[_Worker] = []
        self._restarts = [0] * len(options.devices)
        self._pending: deque[TrialTask] = deque()
        self._done: list[TrialOutcome] = []
        self._pool = CompilePool(options.compile_jobs or os.cpu_count() or 1)

    # -------------------------------------------------------------- lifecycle

    @property
    def compile_processes(self) -> int:
        """How many compiles run at once."""
        return self._pool.processes

    def start(self) -> tuple[WorkerInfo, ...]:
        """Start the GPU workers; each one's introduction."""
        if not self.options.devices:
            raise PerfscopeError("no GPU to tune on: CUDA reports no device (set "
                                 "CUDA_VISIBLE_DEVICES, or tune on a machine with an NVIDIA GPU)")
        self._workers = [_Worker(i, d, self._argv, self._events, 0)
                         for i, d in enumerate(self.options.devices)]
        deadline = time.monotonic() + self.options.start_timeout
        while not all(w.ready for w in self._workers):
            left = deadline - time.monotonic()
            if left <= 0:
                late = [w.device for w in self._workers if not w.ready]
                self.close()
                raise PerfscopeError(f"the tune worker for GPU {', '.join(late)} did not start "
                                     f"within {self.options.start_timeout:.0f} s")
            try:
                event = self._events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            refusal = self._handle(event, starting=True)
            if refusal:
                self.close()
                raise PerfscopeError(refusal)
        return tuple(w.info for w in self._workers if w.info is not None)

    def close(self) -> None:
        """Stop every worker (what they measured is already handed back)."""
        for w in self._workers:
            w.stop()
        self._pool.close()

    # -------------------------------------------------------------- compiling

    def compile(self, jobs: Sequence[CompileJob]) -> Iterator[CompileOutcome]:
        """Compile jobs in parallel; outcomes as they finish."""
        return self._pool.run(jobs)

    # -------------------------------------------------------------- trials

    @property
    def capacity(self) -> int:
        """How many trials are worth having submitted at once."""
        return 2 * len(self._workers)

    @property
    def busy(self) -> int:
        """Trials submitted and not yet answered."""
        return len(self._pending) + sum(w.task is not None for w in self._workers)

    def submit(self, task: TrialTask) -> None:
        """Queue a trial; its outcome comes back from results()."""
        self._pending.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        for w in self._workers:
            if not self._pending:
                return
            if w.ready and w.task is None and w.proc.poll() is None:
                task = self._pending.popleft()
                w.task, w.deadline = task, time.monotonic() + self.options.task_timeout
                if not w.send({"task": task.to_dict()}):
                    self._fail(w, "its worker's pipe closed before the task was sent")

    def results(self, timeout: float) -> list[TrialOutcome]:
        """Outcomes that arrived within timeout seconds (maybe none)."""
        end = time.monotonic() + timeout
        while True:
            try:
                event = self._events.get(timeout=max(0.0, min(end - time.monotonic(), 0.25)))
                self._handle(event)
            except queue.Empty:
                pass
            self._check_deadlines()
            self._dispatch()
            if self._done or time.monotonic() >= end:
                out, self._done = self._done, []
                return out

    def _handle(self, event: tuple[int, int, dict | None], starting: bool = False) -> str | None:
        index, generation, message = event
        w = self._workers[index]
        if generation != w.generation:
            return None   # a line from a process already replaced
        if message is None:
            code = w.proc.wait()
            if not w.ready:
                return self._start_failed(w, f"exited with code {code} before it said hello",
                                          starting)
            self._fail(w, f"its worker (GPU {w.device}) exited with code {code} while running it")
            return None
        if "hello" in message:
            w.info, w.ready = WorkerInfo.from_dict(message["hello"]), True
            self._restarts[index] = 0
        elif "error" in message:
            return self._start_failed(w, message["error"], starting)
        elif "outcome" in message:
            outcome = TrialOutcome.from_dict(message["outcome"])
            w.task = None
            self._done.append(outcome)
            if outcome.fatal:
                self._replace(w)
        return None

    def _start_failed(self, w: _Worker, why: str, starting: bool) -> str | None:
        sentence = f"the tune worker for GPU {w.device} could not start: {why}"
        if starting:
            return sentence
        log.error("%s", sentence)
        self._replace(w)
        return None

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.task is not None and now > w.deadline:
                w.kill()
                self._fail(w, f"it ran past the {self.options.task_timeout:.0f} s task timeout "
                              "(a hang: its worker was killed)")

    def _fail(self, w: _Worker, why: str) -> None:
        """The worker's task ends as an error, and the worker is replaced."""
        task, w.task = w.task, None
        if task is not None:
            self._done.append(TrialOutcome(task.id, ERROR, why, worker=f"gpu {w.device}"))
        self._replace(w)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        i = w.index
        self._restarts[i] += 1
        if self._restarts[i] > self.options.max_restarts:
            if all(r > self.options.max_restarts for r in self._restarts):
                raise PerfscopeError(f"every tune worker failed {self.options.max_restarts} times "
                                     "in a row; the GPU or its driver is not usable")
            log.error("giving up on the worker for GPU %s", w.device)
            self._workers[i] = _Dead(w)  # type: ignore[assignment]
            return
        self._workers[i] = _Worker(i, w.device, self._argv, self._events, w.generation + 1)


class _Dead:
    """A worker slot given up on: never ready, never busy."""

    def __init__(self, w: _Worker) -> None:
        self.index, self.device, self.generation = w.index, w.device, w.generation + 1
        self.task = None
        self.ready = False
        self.info = w.info
        self.proc = w.proc

    def stop(self, grace: float = 0.0) -> None:
        return None


@dataclass(frozen=True)
class ExecutorChoice:
    """What the command line asked for."""

    name: str = "local"                    # local or ray
    dry: bool = False
    compile_jobs: int | None = None
    ray_address: str | None = None
    devices: tuple[str, ...] | None = None   # default: the visible GPUs
    task_timeout: float = 300.0              # seconds one trial may take (a hang is killed)


EXECUTORS = ("local", "ray")


def make_executor(choice: ExecutorChoice) -> LocalExecutor | RayExecutor:
    """The executor asked for; nothing starts until its start()."""
    if choice.name == "local":
        devices = choice.devices if choice.devices is not None else visible_devices()
        if choice.dry and not devices:
            devices = ("0",)   # a dry worker compiles only; it needs no GPU
        return LocalExecutor(LocalOptions(devices, choice.dry, choice.compile_jobs,
                                          task_timeout=choice.task_timeout))
    if choice.name == "ray":
        return RayExecutor(RayOptions(choice.ray_address, choice.dry, choice.task_timeout))
    raise PerfscopeError(f"unknown executor {choice.name!r}; use one of {', '.join(EXECUTORS)}")


# ------------------------------------------------------------------------------ Ray


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PerfscopeError("--executor ray needs Ray: install perfscope with the 'cluster' extra "
                             "(pip install 'perfscope[cluster]')") from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """Which Ray cluster, and how long a trial may take there."""
    address: str | None = None   # a running cluster ("auto", "ray://..."); None: RAY_ADDRESS or local
    dry: bool = False
    task_timeout: float = 600.0


class RayExecutor:
    """Trials on one ``RayWorker`` actor per GPU of the cluster (``num_gpus=1`` each, so Ray
    places one on every GPU and sets its CUDA_VISIBLE_DEVICES), compiles as Ray tasks of one
    CPU each; the outcomes come back to this process's store. An actor that dies, hangs past
    the task timeout or breaks its CUDA context is replaced, and its task is an error."""

    def __init__(self, options: RayOptions) -> None:
        self.options = options
        self._ray = _ray()
        self._owns = False
        self._actors: list[Any] = []
        self._running: dict[Any, tuple[int, TrialTask, float]] = {}   # ref -> (actor, task, start)
        self._pending: deque[TrialTask] = deque()

    def start(self) -> tuple[WorkerInfo, ...]:
        """Start the GPU workers; each one's introduction."""
        ray = self._ray
        if "ncu_report" in sys.modules and not ray.is_initialized():
            # Seen here: ray.init aborts the process (a std::regex_error) once the reader is in.
            raise PerfscopeError("Nsight Compute's report reader is loaded in this process and Ray "
                                 "cannot start beside it; run the tune in a process that reads no "
                                 "reports")
        if not ray.is_initialized():
            try:
                ray.init(address=self.options.address, include_dashboard=False,
                         log_to_driver=False)
            except Exception as exc:  # Ray raises ConnectionError, ValueError, RuntimeError...
                raise PerfscopeError(f"cannot start or reach a Ray cluster "
                                     f"({self.options.address or 'local'}): {exc}") from None
            self._owns = True
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            self.close()
            raise PerfscopeError("the Ray cluster has no GPU resources; start its nodes with "
                                 "GPUs (ray start --num-gpus N)")
        # A GPU worker holds its GPU and no CPU: its Python only launches and checks, and a
        # CPU held by each actor would leave compiles no core on a node with as many GPUs.
        self._worker_cls = ray.remote(num_gpus=1, num_cpus=0)(worker_mod.RayWorker)
        self._compile = ray.remote(num_cpus=1)(compile_one)
        self._actors = [self._worker_cls.remote(self.options.dry) for _ in range(gpus)]
        try:
            infos = ray.get([a.info.remote() for a in self._actors])
        except Exception as exc:
            self.close()
            raise PerfscopeError(f"a Ray GPU worker could not start: {_ray_error(exc)}") from None
        return tuple(WorkerInfo.from_dict(i) for i in infos)

    def close(self) -> None:
        """Stop every worker (what they measured is already handed back)."""
        for actor in self._actors:
            with contextlib.suppress(Exception):  # an actor that already died
                self._ray.kill(actor)
        self._actors, self._running = [], {}
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns = False

    @property
    def compile_processes(self) -> int:
        """How many compiles run at once."""
        return int(self._ray.cluster_resources().get("CPU", 0)) if self._ray.is_initialized() else 0

    def compile(self, jobs: Sequence[CompileJob]) -> Iterator[CompileOutcome]:
        """Compile jobs in parallel; outcomes as they finish."""
        ray = self._ray
        refs = [self._compile.remote(job) for job in jobs]
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            yield ray.get(done[0])

    @property
    def capacity(self) -> int:
        """How many trials are worth having submitted at once."""
        return 2 * len(self._actors)

    @property
    def busy(self) -> int:
        """Trials submitted and not yet answered."""
        return len(self._running) + len(self._pending)

    def submit(self, task: TrialTask) -> None:
        """Queue a trial; its outcome comes back from results()."""
        self._pending.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        idle = set(range(len(self._actors))) - {a for a, _, _ in self._running.values()}
        for i in sorted(idle):
            if not self._pending:
                return
            task = self._pending.popleft()
            ref = self._actors[i].run.remote(task.to_dict())
            self._running[ref] = (i, task, time.monotonic())

    def _replace(self, i: int) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(self._actors[i])
        self._actors[i] = self._worker_cls.remote(self.options.dry)

    def results(self, timeout: float) -> list[TrialOutcome]:
        """Outcomes that arrived within timeout seconds (maybe none)."""
        ray = self._ray
        if not self._running:
            time.sleep(min(timeout, 0.05))
            return []
        done, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=timeout)
        out = []
        for ref in done:
            i, task, _started = self._running.pop(ref)
            try:
                outcome = TrialOutcome.from_dict(ray.get(ref))
            except Exception as exc:  # the actor died with the task
                outcome = TrialOutcome(task.id, ERROR, f"its Ray worker failed: {_ray_error(exc)}",
                                       worker="ray")
                self._replace(i)
            if outcome.fatal:
                self._replace(i)
            out.append(outcome)
        now = time.monotonic()
        for ref, (i, task, started) in list(self._running.items()):
            if now - started > self.options.task_timeout:
                self._running.pop(ref)
                self._replace(i)
                out.append(TrialOutcome(task.id, ERROR, f"it ran past the "
                                        f"{self.options.task_timeout:.0f} s task timeout", worker="ray"))
        self._dispatch()
        return out


def _ray_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
