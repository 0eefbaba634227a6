"""The tune store: every compile, verdict and timing of a search, in one SQLite file.

Each result is written in its own transaction the moment it arrives, so an interrupted or
crashed sweep loses at most what was still running, and ``--resume`` measures only what
the store does not hold. The database runs in WAL mode: a reader (``bench --config best``)
never blocks the writer, and a killed writer leaves the file consistent.

Tables (schema version 1):

- ``configs``: one row per (stage, dtype, parameters, arch, source hash, NVRTC version):
  ``ok`` with ptxas's registers, spills and static shared memory and the compile time, or
  ``pruned`` with the reason (before compiling: the space's rules and the target's limits;
  after: ptxas).
- ``trials``: one row per (stage, parameters, M, N, K, dtype, GPU, driver, toolchain, source
  hash): the verification verdict against the float64 reference, its error and detail.
- ``timings``: one row per (trial, phase): ``screen`` for every verified configuration,
  ``confirm`` for the few timed again at length; the whole Timing as JSON plus its median
  ratio to cuBLAS as a column to sort on.
- ``profiles``: best against worst under ncu, per (stage, dtype, shape, run): the diff's
  verdict as JSON.
- ``sessions``: one row per ``perfscope tune`` run: its command, request, environment and
  the wall times of compiling, verifying and timing.

UNIQUE constraints on those keys make a duplicate row impossible.
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.kernels.spec import Shape
from perfscope.locations import LOCAL_ROOT
from perfscope.manifest import OK, Environment, Timing
from perfscope.timing import BenchOptions

SCHEMA_VERSION = 1
DEFAULT_STORE = LOCAL_ROOT / "tune" / "tune.sqlite"
# Results of `perfscope tune --dry` (compiled, never launched) carry this as their GPU, so
# nothing that reads a best configuration for a real GPU can pick them up.
DRY_GPU = "dry run (compiled, never launched)"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS configs (
    id INTEGER PRIMARY KEY,
    stage TEXT NOT NULL, dtype TEXT NOT NULL, params TEXT NOT NULL, arch TEXT NOT NULL,
    source TEXT NOT NULL, nvrtc TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    registers INTEGER, spill_stores INTEGER, spill_loads INTEGER, static_smem INTEGER,
    dynamic_smem INTEGER, compile_s REAL, from_cache INTEGER, created TEXT NOT NULL,
    UNIQUE (stage, dtype, params, arch, source, nvrtc));
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    stage TEXT NOT NULL, params TEXT NOT NULL, m INTEGER NOT NULL, n INTEGER NOT NULL,
    k INTEGER NOT NULL, dtype TEXT NOT NULL, gpu TEXT NOT NULL, driver TEXT NOT NULL,
    toolchain TEXT NOT NULL, source TEXT NOT NULL,
    verdict TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', rel_error REAL, verify_s REAL,
    worker TEXT NOT NULL DEFAULT '', session INTEGER, created TEXT NOT NULL,
    UNIQUE (stage, params, m, n, k, dtype, gpu, driver, toolchain, source));
CREATE TABLE IF NOT EXISTS timings (
    id INTEGER PRIMARY KEY,
    trial INTEGER NOT NULL REFERENCES trials(id), phase TEXT NOT NULL,
    ratio REAL, tflops REAL, timing TEXT NOT NULL, time_s REAL, worker TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    UNIQUE (trial, phase));
CREATE TABLE IF NOT EXISTS profiles (
    id INTEGER PRIMARY KEY,
    stage TEXT NOT NULL, dtype TEXT NOT NULL, m INTEGER NOT NULL, n INTEGER NOT NULL,
    k INTEGER NOT NULL, gpu TEXT NOT NULL, driver TEXT NOT NULL, toolchain TEXT NOT NULL,
    source TEXT NOT NULL, best TEXT NOT NULL, worst TEXT NOT NULL, result TEXT NOT NULL,
    created TEXT NOT NULL,
    UNIQUE (stage, dtype, m, n, k, gpu, driver, toolchain, source, best, worst));
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY, started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
    request TEXT NOT NULL, environment TEXT, stats TEXT);
"""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunKey:
    """What, besides stage, parameters, shape and dtype, a measurement depends on."""

    gpu: str
    driver: str
    toolchain: str


def run_key(env: Environment, l2_flush: str = BenchOptions.l2_flush) -> RunKey:
    """The GPU, driver and toolchain (compiler, CUDA, CuPy, cuBLAS) results are keyed by,
    with the timing's L2 flush: a trial timed after another flush is not this one's."""
    parts = (f"nvrtc {env.nvrtc}", f"cuda {env.cuda_runtime}",
             f"cuda-bindings {env.cuda_bindings}", f"cupy {env.cupy}", f"cublas {env.cublas}",
             f"l2 flush {l2_flush}")
    return RunKey(gpu=env.gpu, driver=env.driver or env.cuda_driver, toolchain="; ".join(parts))


@dataclass(frozen=True)
class TrialKey:
    """One measurement's identity: a UNIQUE row of ``trials``."""

    stage: str
    params: str          # Config.key: JSON with sorted names
    shape: Shape
    dtype: str
    run: RunKey
    source: str          # the stage source's hash (perfscope.build.source_hash)

    def columns(self) -> tuple[Any, ...]:
        """The key's values, in the order of its UNIQUE constraint."""
        s = self.shape
        return (self.stage, self.params, s.m, s.n, s.k, self.dtype, self.run.gpu, self.run.driver,
                self.run.toolchain, self.source)


@dataclass(frozen=True)
class Measured:
    """What a trial found, as the store keeps it: a timing only for a verified one."""

    verdict: str
    detail: str = ""
    rel_error: float | None = None
    verify_s: float | None = None
    worker: str = ""
    timing: Timing | None = None      # the screening timing
    time_s: float | None = None

    def __post_init__(self) -> None:
        if self.timing is not None and self.verdict != OK:
            raise ValueError(f"a {self.verdict} trial carries no timing")


@dataclass(frozen=True)
class ProfileKey:
    """Best against worst of one (stage, dtype, shape) and run: a UNIQUE row of ``profiles``."""

    stage: str
    dtype: str
    shape: Shape
    run: RunKey
    source: str
    best: str            # Config.key
    worst: str

    def columns(self) -> tuple[Any, ...]:
        """The key's values, in the order of its UNIQUE constraint."""
        s = self.shape
        return (self.stage, self.dtype, s.m, s.n, s.k, self.run.gpu, self.run.driver,
                self.run.toolchain, self.source, self.best, self.worst)


@dataclass(frozen=True)
class ConfigKey:
    """One compile's identity: a UNIQUE row of ``configs``."""
    stage: str
    dtype: str
    params: str
    arch: str
    source: str
    nvrtc: str

    def columns(self) -> tuple[Any, ...]:
        """The key's values, in the order of its UNIQUE constraint."""
        return (self.stage, self.dtype, self.params, self.arch, self.source, self.nvrtc)


@dataclass(frozen=True)
class ConfigRow:
    """A configuration's compile (or why it was not compiled)."""

    key: ConfigKey
    status: str                     # "ok" or "pruned"
    reason: str = ""
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    static_smem: int | None = None
    dynamic_smem: int | None = None
    compile_s: float | None = None
    from_cache: bool = False

    @property
    def ok(self) -> bool:
        """True when it compiled and ptxas found nothing to prune it for."""
        return self.status == "ok"


@dataclass(frozen=True)
class TrialRow:
    """A trial as stored, with its timings by phase."""

    id: int
    key: TrialKey
    verdict: str
    detail: str = ""
    rel_error: float | None = None
    verify_s: float | None = None
    worker: str = ""
    created: str = ""
    timings: Mapping[str, Timing] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, int]:
        """The trial's parameters."""
        return json.loads(self.key.params)

    @property
    def timing(self) -> Timing | None:
        """The longest measurement made: the confirmation when there is one."""
        return self.timings.get("confirm") or self.timings.get("screen")

    @property
    def phase(self) -> str | None:
        """The phase its timing comes from (confirm over screen), or None."""
        return "confirm" if "confirm" in self.timings else "screen" if "screen" in self.timings else None

    @property
    def ratio(self) -> float | None:
        """The median ratio to cuBLAS of its longest timing, or None."""
        t = self.timing
        return t.ratio_to_reference.median if t is not None and t.ratio_to_reference else None


class Store:
    """One open tune store. Use as a context manager, or call close()."""

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        self.path = path
        self._db = db

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: str | Path, create: bool = True) -> Store:
        """The store at path (made when create and absent), or one sentence why not."""
        path = Path(path)
        if not path.exists():
            if not create:
                raise PerfscopeError(f"no tune store at {path}; run `perfscope tune` first, or "
                                     "name one with --store FILE")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PerfscopeError(f"cannot make the folder of {path}: {exc.strerror}") from None
        elif not path.is_file():
            raise PerfscopeError(f"{path} is not a file, so it cannot be a tune store")
        try:
            db = sqlite3.connect(path, timeout=30, isolation_level=None)
        except sqlite3.Error as exc:
            raise PerfscopeError(f"cannot open the tune store {path}: {exc}") from None
        store = cls(path, db)
        try:
            store._prepare()
        except sqlite3.DatabaseError as exc:
            db.close()
            raise PerfscopeError(f"{path} is not a perfscope tune store ({exc})") from None
        except PerfscopeError:
            db.close()
            raise
        return store

    def _prepare(self) -> None:
        db = self._db
        # Read first: a file that is not a store is refused before anything is written to it.
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "meta" not in tables:
            raise PerfscopeError(f"{self.path} is an SQLite database but not a perfscope tune "
                                 f"store (its tables: {', '.join(sorted(tables))})")
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed row survives a crash of this process; only a power
        # loss can take the last transactions back, never corrupt the file.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        if "meta" in tables:
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None or int(row[0]) != SCHEMA_VERSION:
                raise PerfscopeError(f"{self.path} is a tune store of schema "
                                     f"{row[0] if row else 'unknown'}, and this perfscope reads "
                                     f"schema {SCHEMA_VERSION}")
            return
        # Statement by statement: executescript() would commit outside this transaction.
        with self._tx():
            for statement in _SCHEMA.strip().split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        """Close the database (every write is already committed)."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ configs

    def record_config(self, row: ConfigRow) -> None:
        """Insert a configuration's compile outcome, or refresh it (one row per key)."""
        values = (row.status, row.reason, row.registers, row.spill_stores, row.spill_loads,
                  row.static_smem, row.dynamic_smem, row.compile_s, int(row.from_cache), _now())
        with self._tx() as db:
            db.execute(
                "INSERT INTO configs (stage, dtype, params, arch, source, nvrtc, status, reason, "
                "registers, spill_stores, spill_loads, static_smem, dynamic_smem, compile_s, "
                "from_cache, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (stage, dtype, params, arch, source, nvrtc) DO UPDATE SET "
                "status=excluded.status, reason=excluded.reason, registers=excluded.registers, "
                "spill_stores=excluded.spill_stores, spill_loads=excluded.spill_loads, "
                "static_smem=excluded.static_smem, dynamic_smem=excluded.dynamic_smem, "
                "compile_s=excluded.compile_s, from_cache=excluded.from_cache",
                (*row.key.columns(), *values))

    def config(self, key: ConfigKey) -> ConfigRow | None:
        """The compile outcome stored for key, or None."""
        r = self._db.execute(
            "SELECT status, reason, registers, spill_stores, spill_loads, static_smem, dynamic_smem, "
            "compile_s, from_cache FROM configs WHERE stage=? AND dtype=? AND params=? AND arch=? "
            "AND source=? AND nvrtc=?", key.columns()).fetchone()
        if r is None:
            return None
        return ConfigRow(key, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]))

    def configs(self, stage: str, dtype: str) -> list[ConfigRow]:
        """Every compile outcome of a stage in a dtype, in the order stored."""
        rows = self._db.execute(
            "SELECT stage, dtype, params, arch, source, nvrtc, status, reason, registers, "
            "spill_stores, spill_loads, static_smem, dynamic_smem, compile_s, from_cache "
            "FROM configs WHERE stage=? AND dtype=? ORDER BY id", (stage, dtype)).fetchall()
        return [ConfigRow(ConfigKey(*r[:6]), r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
                          bool(r[14])) for r in rows]

    # ------------------------------------------------------------------ trials

    def record_trial(self, key: TrialKey, found: Measured, session: int | None = None) -> int:
        """Insert a trial (and its screening timing) in one transaction; its row id.

        A key already stored is left as it is (no duplicate, no overwrite)."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO trials (stage, params, m, n, k, dtype, gpu, driver, toolchain, source, "
                "verdict, detail, rel_error, verify_s, worker, session, created) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (*key.columns(), found.verdict, found.detail, found.rel_error, found.verify_s,
                 found.worker, session, _now()))
            trial_id = self._trial_id(key)
            if found.timing is not None:
                self._insert_timing(db, trial_id, "screen", found.timing, found.time_s, found.worker)
        return trial_id

    def record_timing(self, trial_id: int, phase: str, timing: Timing,
                      time_s: float | None = None, worker: str = "") -> None:
        """Add a timing of a phase to a stored trial (one per phase)."""
        with self._tx() as db:
            self._insert_timing(db, trial_id, phase, timing, time_s, worker)

    @staticmethod
    def _insert_timing(db: sqlite3.Connection, trial_id: int, phase: str, timing: Timing,
                       time_s: float | None, worker: str) -> None:
        ratio = timing.ratio_to_reference.median if timing.ratio_to_reference else None
        db.execute("INSERT INTO timings (trial, phase, ratio, tflops, timing, time_s, worker, created) "
                   "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                   (trial_id, phase, ratio, timing.tflops.median,
                    json.dumps(asdict(timing), allow_nan=False), time_s, worker, _now()))

    def _trial_id(self, key: TrialKey) -> int:
        row = self._db.execute(
            "SELECT id FROM trials WHERE stage=? AND params=? AND m=? AND n=? AND k=? AND dtype=? "
            "AND gpu=? AND driver=? AND toolchain=? AND source=?", key.columns()).fetchone()
        if row is None:
            raise PerfscopeError(f"the tune store {self.path} lost a trial it just wrote")
        return int(row[0])

    _TRIAL_COLUMNS = ("id, stage, params, m, n, k, dtype, gpu, driver, toolchain, source, verdict, "
                      "detail, rel_error, verify_s, worker, created")

    def _rows(self, where: str, args: Sequence[Any]) -> list[TrialRow]:
        rows = self._db.execute(f"SELECT {self._TRIAL_COLUMNS} FROM trials WHERE {where} "
                                "ORDER BY id", tuple(args)).fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        timings: dict[int, dict[str, Timing]] = {}
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            marks = ",".join("?" * len(part))
            for trial, phase, text in self._db.execute(
                    f"SELECT trial, phase, timing FROM timings WHERE trial IN ({marks})", part):
                timings.setdefault(trial, {})[phase] = Timing.from_dict(json.loads(text))
        out = []
        for r in rows:
            key = TrialKey(r[1], r[2], Shape(r[3], r[4], r[5]), r[6], RunKey(r[7], r[8], r[9]), r[10])
            out.append(TrialRow(r[0], key, r[11], r[12], r[13], r[14], r[15], r[16],
                                timings.get(r[0], {})))
        return out

    def trial(self, key: TrialKey) -> TrialRow | None:
        """The trial stored under key, with its timings, or None."""
        rows = self._rows("stage=? AND params=? AND m=? AND n=? AND k=? AND dtype=? AND gpu=? AND "
                          "driver=? AND toolchain=? AND source=?", key.columns())
        return rows[0] if rows else None

    def trials(self, stage: str, dtype: str, shape: Shape, run: RunKey | None = None,
               source: str | None = None) -> list[TrialRow]:
        """The trials of one (stage, dtype, shape), of one run key and source when given."""
        where = "stage=? AND dtype=? AND m=? AND n=? AND k=?"
        args: list[Any] = [stage, dtype, shape.m, shape.n, shape.k]
        if run is not None:
            where += " AND gpu=? AND driver=? AND toolchain=?"
            args += [run.gpu, run.driver, run.toolchain]
        if source is not None:
            where += " AND source=?"
            args.append(source)
        return self._rows(where, args)

    def count(self, table: str) -> int:
        """Rows in one of the store's tables."""
        if table not in ("configs", "trials", "timings", "profiles", "sessions"):
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def best(self, stage: str, dtype: str, shape: Shape, gpu: str | None = None) -> TrialRow | None:
        """The verified trial ranked first by ``rank`` (the latest of equals); None when
        nothing of that stage, dtype and shape was timed."""
        rows = [r for r in self.trials(stage, dtype, shape)
                if r.verdict == OK and r.ratio is not None and r.key.run.gpu != DRY_GPU
                and (gpu is None or r.key.run.gpu == gpu)]
        return min(rows, key=lambda r: (*rank(r.phase, r.ratio), -r.id), default=None)

    # ------------------------------------------------------------------ profiles

    def record_profile(self, key: ProfileKey, result: Mapping[str, Any]) -> None:
        """Store best against worst under ncu (the diff's summary)."""
        with self._tx() as db:
            db.execute("INSERT INTO profiles (stage, dtype, m, n, k, gpu, driver, toolchain, source, "
                       "best, worst, result, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "
                       "ON CONFLICT DO UPDATE SET result=excluded.result, created=excluded.created",
                       (*key.columns(), json.dumps(result, allow_nan=False), _now()))

    def profile(self, key: ProfileKey) -> dict[str, Any] | None:
        """The best-against-worst diff stored for key, or None."""
        row = self._db.execute(
            "SELECT result FROM profiles WHERE stage=? AND dtype=? AND m=? AND n=? AND k=? AND gpu=? "
            "AND driver=? AND toolchain=? AND source=? AND best=? AND worst=?",
            key.columns()).fetchone()
        return json.loads(row[0]) if row else None

    # ------------------------------------------------------------------ sessions

    def begin_session(self, command: str, request: Mapping[str, Any]) -> int:
        """Record the start of a tune run; its session id."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO sessions (started, command, request) VALUES (?,?,?)",
                             (_now(), command, json.dumps(request, default=str)))
            return int(cur.lastrowid or 0)

    def end_session(self, session: int, environment: Mapping[str, Any] | None,
                    stats: Mapping[str, Any]) -> None:
        """Record the end of a tune run: its environment and costs."""
        with self._tx() as db:
            db.execute("UPDATE sessions SET finished=?, environment=?, stats=? WHERE id=?",
                       (_now(), json.dumps(environment, default=str), json.dumps(stats, default=str),
                        session))

    # ------------------------------------------------------------------ export

    def export(self) -> dict[str, Any]:
        """Every table as lists of rows (JSON-ready, in id order): what gets committed."""
        out: dict[str, Any] = {"schema": f"perfscope.tune-store/{SCHEMA_VERSION}"}
        for table in ("configs", "trials", "timings", "profiles", "sessions"):
            cur = self._db.execute(f"SELECT * FROM {table} ORDER BY id")
            names = [d[0] for d in cur.description]
            rows = []
            for r in cur.fetchall():
                row = dict(zip(names, r, strict=True))
                for col in ("timing", "result", "request", "environment", "stats"):
                    if isinstance(row.get(col), str):
                        row[col] = json.loads(row[col])
                rows.append(row)
            out[table] = rows
        return out

    def backup(self, target: str | Path) -> None:
        """A consistent copy of the whole database (SQLite's online backup), WAL folded in."""
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        dest = sqlite3.connect(target)
        try:
            self._db.backup(dest)
        finally:
            dest.close()


def rank(phase: str | None, ratio: float | None) -> tuple[bool, bool, float]:
    """A trial's place among its shape's trials, best first when sorted ascending: timed
    before untimed, a confirmation before a screening (it is the longer measurement, and
    the highest of many short screens is the luckiest), then the higher ratio to cuBLAS.
    The store's best, the tune document's order and its profiled best all follow it, so
    `--config best` runs the configuration the document names."""
    return (ratio is None, phase != "confirm", -(ratio or 0.0))


def best_trial(path: str | Path, stage: str, dtype: str, shape: Shape,
               gpu: str | None = None) -> TrialRow:
    """The best verified trial in the store at path, or a sentence saying there is none
    (what ``bench/profile/diff --config best`` read)."""
    with Store.open(path, create=False) as store:
        best = store.best(stage, dtype, shape, gpu)
    if best is None:
        raise PerfscopeError(f"the tune store {path} holds no verified, timed configuration of "
                             f"{stage} in {dtype} at {shape}; run `perfscope tune {stage} --dtype "
                             f"{dtype} --shape {shape}` first")
    return best


def best_params(path: str | Path, stage: str, dtype: str, shape: Shape,
                gpu: str | None = None) -> dict[str, int]:
    """The parameters of best_trial."""
    return best_trial(path, stage, dtype, shape, gpu).params
