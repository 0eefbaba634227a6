"""The perfscope command line: thin typer commands that parse, call the library, render.

One error handler (``_Group.invoke``) turns a PerfscopeError into one sentence on stderr
and exit code 2, and Ctrl-C into one sentence and exit code 130; nothing a user can cause
ends in a traceback. Gates and failed checks exit 1.

Imports of the library are made inside the commands on purpose: the report reader
(ncu-report 2025.3) and CuPy cannot share a process on a GPU machine, so `bench` must
never load the reader and `diagnose` never CuPy, and `rules` should not pay for
matplotlib.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from perfscope.errors import PerfscopeError
from perfscope.kernels.epilogue import DEFAULT_QUANT_SCALE
from perfscope.kernels.listing import REFERENCE_BENCHES, bench_files, kernels_table
from perfscope.kernels.spec import parse_params, parse_shape
from perfscope.locations import (
    CHECKOUT,
    LOAD_WORKERS_ENV,
    LOCAL_ROOT,
    existing_reference_root,
    reference_root,
)
from perfscope.render.progress import NcuProgress, TuneProgressBar
from perfscope.version import __version__

log = logging.getLogger("perfscope")


class _Group(TyperGroup):
    """The one place where errors become sentences and exit codes."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PerfscopeError as exc:
            typer.echo(f"perfscope: {exc}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("perfscope: interrupted; what was already written is kept.", err=True)
            raise typer.Exit(130) from None


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="Profile CUDA GEMM kernels under Nsight Compute and say what is slow.")


def _versions() -> str:
    """perfscope's version, the report reader's, and ncu's (where one is found)."""
    from perfscope import ncu  # deferred: the profiler side, only to find and ask ncu
    from perfscope.reader import reader_version  # deferred: kept off the CLI's import path

    reader = reader_version()
    lines = [f"perfscope {__version__} ({CHECKOUT})",
             "report reader: " + (f"ncu-report {reader}" if reader else
                                  "no ncu-report wheel (a local Nsight Compute's extras/python is used)")]
    try:
        exe = ncu.find_ncu()
        lines.append(f"ncu: {'.'.join(map(str, ncu.ncu_version(exe)))} ({exe})")
    except PerfscopeError as exc:
        lines.append(f"ncu: {exc}")
    return "\n".join(lines) + "\n"


def _print_version(value: bool) -> None:
    # Eager: it runs while the arguments are parsed, before any command (and its handler).
    if value:
        _out(_versions())
        raise typer.Exit()


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress."),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print perfscope's, the report reader's and ncu's "
                                       "versions.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(name)s: %(message)s", stream=sys.stderr)


def _out(text: str) -> None:
    typer.echo(text, nl=False)


def _color() -> bool:
    return sys.stdout.isatty()


def _fmt(as_json: bool = False, markdown: bool = False) -> str:
    if as_json and markdown:
        raise PerfscopeError("choose one of --json and --markdown.")
    return "json" if as_json else "markdown" if markdown else "console"


def _show(document: Any, fmt: str = "console", **options: Any) -> None:
    from perfscope.render import render  # deferred: renderers load rich/matplotlib on demand

    if fmt == "console":
        options.setdefault("color", _color())
    _out(render(document, fmt, **options))


def _github(document: Any, fmt: str) -> None:
    """In a GitHub Actions job: annotations on the findings' source lines, and the Markdown
    block appended to the step summary. Outside one, nothing."""
    from perfscope.render import render  # deferred: renderers load rich/matplotlib on demand

    if os.environ.get("GITHUB_ACTIONS") == "true":
        lines = render(document, "github", workspace=os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
        # Workflow commands belong on stdout, unless stdout is a JSON document.
        typer.echo(lines, nl=False, err=fmt == "json")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(render(document, "github", summary=True) + "\n")
        except OSError as exc:
            # The job's own output is what counts; a summary that cannot be written is said.
            typer.echo(f"warning: cannot append to GITHUB_STEP_SUMMARY {summary}: "
                       f"{exc.strerror or exc}", err=True)


_CONFIG_HELP = ("'best': the best configuration the tune store holds for the stage, dtype and "
                "shape (perfscope tune); --param items override it.")
_STORE_HELP = "The tune store --config best reads (default reports/local/tune/tune.sqlite)."


def _params(param: list[str] | None, config: str | None, store: Path | None,
            stages: list[str] | None, dtype: list[str] | None, shape: str | None) -> dict[str, int]:
    """--param items, laid over the tune store's best configuration with --config best."""
    from perfscope.tune import configured  # deferred: reads the tune store only when asked

    return configured.chosen_params(configured.ConfigChoice(
        tuple(param or ()), config, store, tuple(stages or ()), tuple(dtype or ()), shape))


def _command_line(ctx: typer.Context) -> str | None:
    """The command that made a page, when main() recorded it (not under a test runner)."""
    argv = (ctx.find_root().obj or {}).get("argv")
    return "perfscope " + shlex.join(argv) if argv else None


# -- commands (each one thin: parse, call the library, render) --


@app.command()
def sass(
    target: str = typer.Argument(..., help="A stage name, a .cu file (compiled with nvcc), a .cubin, "
                                 "or a report (.ncu-rep[.xz]): its kernels from the cubins it carries "
                                 "(REPORT#ID, REPORT:REGEX or REPORT:REGEX@N: only those launches)."),
    arch: str | None = typer.Option(None, "--arch", help="Compile target: sm_80, sm_90a, sm_100a, "
                                    "sm_103a... (default: the stage's first; sm_90a for a .cu)."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 / fp16 / bf16 (default: the "
                                     "stage's first)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document."),
    save_cubin: Path | None = typer.Option(None, "--save-cubin", help="For a report: write each "
                                           "kernel's cubin (the code that ran) to this folder."),
    listing: bool = typer.Option(False, "--listing", help="For a report: list the hot loop, "
                                 "each instruction with its executions, samples and stalls."),
    listing_share: float | None = typer.Option(
        None, "--listing-share", help="With --listing: list the instructions executed at least "
        "this share (0-1) as often as the most executed one; 0 lists every instruction that "
        "ran (default: the hot loop's 0.5)."),
    param: list[str] | None = typer.Option(None, "--param", help="With a stage name: a template "
                                           "parameter, e.g. STAGES=4 (repeat for more)."),
) -> None:
    """Static SASS audit, no GPU needed: opcode families, registers and spills, the stage's
    fingerprint, and the rules that need no counters; of a report, the code that ran. Exit 1
    if a fingerprint fails."""
    from perfscope.audit import ReportAuditOptions, audit  # deferred: compiles through NVRTC

    doc = audit(target, arch, dtype, ReportAuditOptions(save_cubin, listing, listing_share),
                parse_params(param or ()))
    _show(doc, _fmt(as_json))
    if not doc.ok:
        raise typer.Exit(1)


@app.command()
def report(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="Reports (.ncu-rep, .ncu-rep.xz) or folders of them."),
    html: Path | None = typer.Option(None, "--html", help="Write the self-contained HTML report here."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown summary for a PR comment."),
    bench: Path | None = typer.Option(None, "--bench", help="bench.json for the ladder overview "
                                      "(default: the one in the first folder given)."),
    tune: Path | None = typer.Option(None, "--tune", help="Tune results (`tune --json`) for the "
                                     "Tuning section (default: tune/results.json in the first "
                                     "folder given)."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    title: str | None = typer.Option(None, "--title", help="Page title."),
) -> None:
    """Diagnosis report of a set of kernels: HTML for review, Markdown for a PR comment."""
    from perfscope import review  # deferred: loads the report reader
    from perfscope.render.html import write_page  # deferred: matplotlib

    if html is None and not markdown:
        raise PerfscopeError("say what to write: --html FILE, --markdown, or both.")
    rev = review.collect(paths, bench=bench, kernel=kernel, title=title, command=_command_line(ctx),
                         tune=tune)
    if html is not None:
        write_page(html, rev, inputs=paths)
        # On stderr: stdout may be the page itself (--html /dev/stdout) or the Markdown.
        typer.echo(f"wrote {html} ({len(rev.entries)} kernel(s))", err=True)
        for w in rev.warnings:
            typer.echo(f"warning: {w}", err=True)
    if markdown:
        _show(rev, "markdown", html_name=html.name if html is not None else None)


def _make_reference(missing: Any) -> None:
    """diff's reference on demand: profile the missing cublas/cublaslt report now."""
    from perfscope import profiling  # deferred: the profiler side, only when a reference is missing

    def announce() -> None:
        typer.echo(f"perfscope: no {missing.stage} report in {missing.dtype} at {missing.shape} "
                   f"yet; profiling it now into {missing.folder}", err=True)

    with NcuProgress(total=1) as bar:
        report = profiling.make_reference(missing, bar.update, on_start=announce)
    typer.echo(f"perfscope: wrote {report}", err=True)


@app.command()
def diff(
    a: str = typer.Argument(..., help="Report, REPORT:REGEX[@N], REPORT#ID, or stage name "
                            "(its latest report)."),
    b: str = typer.Argument(..., help="The same, or 'cublas' / 'cublaslt' for A's reference at A's "
                            "shape and dtype (profiled now, beside A, when it is missing)."),
    reference: bool = typer.Option(False, "--reference", help="Resolve stage names in the "
                                   "committed reference run, not reports/local."),
    reference_dir: Path | None = typer.Option(None, "--reference-dir", help="Resolve stage names in "
                                              "this reference run folder."),
    shape: str | None = typer.Option(None, "--shape", help="GEMM shape MxNxK (BxMxNxK: a batch of "
                                     "B) of both kernels, for reports without a run manifest (a "
                                     "manifest's shape wins; a different --shape is refused)."),
    dtype: str | None = typer.Option(None, "--dtype", help="For stage names: which dtype's report."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
    fail_if: list[str] | None = typer.Option(None, "--fail-if", help="Gate, e.g. 'cycles_ratio>1.05'."),
    fail_on_new_findings: bool = typer.Option(False, "--fail-on-new-findings",
                                              help="Fail when A has a finding B has not."),
    param: list[str] | None = typer.Option(None, "--param", help="With a stage name as A: its "
                                           "report for these parameters, e.g. STAGES=4."),
    config: str | None = typer.Option(None, "--config", help="With a stage name as A: " + _CONFIG_HELP),
    store: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
) -> None:
    """A against B, side by side, with the rules' verdict: why A is slower (or what A still
    has that B has not, when A is faster)."""
    from perfscope import diagnosis  # deferred: loads the report reader
    from perfscope import diff as d  # deferred: loads the report reader

    fmt = _fmt(as_json, markdown)
    root = existing_reference_root(reference_dir) if reference or reference_dir else None
    if param or config or store:
        from perfscope.tune import configured  # deferred: only for a tuned configuration

        chosen = _params(param, config, store, [a], [dtype] if dtype else [], shape)
        a = str(configured.configured_report(root or LOCAL_ROOT, a, dtype, shape, chosen))
    options = diagnosis.ResolveOptions(reference=root, dtype=dtype)
    # A committed reference run is read, never added to.
    side_a, side_b = diagnosis.resolve_pair(a, b, options,
                                            make_reference=None if root is not None else _make_reference)
    given = parse_shape(shape) if shape else None
    flops = d.shape_flops(side_a, side_b, (*given.lead, given.m, given.n, given.k)) if given else None
    result = d.compare(side_a, side_b, flops)
    violated = d.check_gates(result, fail_if or [], fail_on_new_findings)
    document = d.DiffDocument(result, tuple(violated))
    _show(document, fmt)
    _github(document, fmt)
    if violated:
        for v in violated:
            typer.echo(f"perfscope: gate failed: {v}", err=True)
        raise typer.Exit(1)


@app.command("rules")
def rules_table(
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """List perfscope's rule table: code, tag, severity, title, source."""
    from perfscope.rules import RuleTable  # deferred: loads the report reader

    _show(RuleTable(), _fmt(as_json))


@app.command()
def kernels(
    bench: Path | None = typer.Option(None, "--bench", help="A bench file the ratios come from, "
                                      "or a reference run's folder (its bench.json, "
                                      "fused/bench-fused.json and fp8/ files; default: the "
                                      "committed H200 reference run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the listing as JSON."),
) -> None:
    """The stages perfscope builds: parent, what each changes, arch, measured ratios."""

    if bench is not None and not bench_files(bench):
        raise PerfscopeError(f"--bench {bench} is neither a bench file nor a folder holding one "
                             f"({', '.join(REFERENCE_BENCHES)})")
    _show(kernels_table(bench if bench is not None else reference_root() / "h200"), _fmt(as_json))


@app.command()
def profile(
    ctx: typer.Context,
    stages: list[str] | None = typer.Argument(None, help="Stage names or 'all'."),
    shape: str | None = typer.Option(None, "--shape", help="Problem size MxNxK (stages: default "
                                     "4096x4096x4096; a program: its kernel's GEMM; BxMxNxK: a "
                                     "batch of B in one launch, cuBLAS's references and programs)."),
    dtype: list[str] | None = typer.Option(None, "--dtype", help="fp32, fp16, bf16 or fp8 (repeat for "
                                           "stages; one for a program's kernel)."),
    param: list[str] | None = typer.Option(None, "--param", help="Template parameter, e.g. STAGES=4."),
    out: Path | None = typer.Option(None, "--out", help="Stages: the output folder (default "
                                    "reports/local/<gpu>). A program: the report file (default "
                                    "reports/local/programs/<script>-<time>.ncu-rep)."),
    section_set: str = typer.Option("perfscope", "--set",
                                     help="perfscope (the declared collection set) or full."),
    clock_control: str = typer.Option("none", "--clock-control", help="none (as found) or base."),
    resume: bool = typer.Option(False, "--resume", help="Skip stages whose report exists and loads."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="A program's kernels to profile: "
                                      "a regex on the function name (ncu -k regex:)."),
    launch_skip: int = typer.Option(0, "--launch-skip", help="A program: matching launches to skip "
                                    "first (ncu -s)."),
    launch_count: int | None = typer.Option(None, "--launch-count", help="A program: matching "
                                            "launches to profile (ncu -c)."),
    nvtx: list[str] | None = typer.Option(None, "--nvtx", help="A program: only launches inside "
                                          "this NVTX range (ncu --nvtx-include; repeat); a range "
                                          "named ...-<dtype>-MxNxK (or BxMxNxK) also gives the shape."),
    replay: str = typer.Option("kernel", "--replay", help="kernel, application or range "
                               "(ncu --replay-mode)."),
    ncu_arg: list[str] | None = typer.Option(None, "--ncu-arg", help="Passed to ncu verbatim "
                                             "(repeat; --ncu-arg=--flag=value)."),
    timed: bool = typer.Option(False, "--time", help="A program: record its kernel's duration "
                              "against its cuBLAS reference's (profiled now if missing)."),
    tensor_maps: bool = typer.Option(False, "--tensor-maps", help="Record the tensor maps the "
                                     "kernels are passed (a preloaded C library, built with the "
                                     "system's compiler): a program's kernels' TMA boxes, and "
                                     "cuBLAS's."),
    timeout: float = typer.Option(1800, "--timeout", help="Stop ncu after this many seconds."),
    program: str | None = typer.Option(None, "--program", hidden=True,
                                       help="JSON argv; what '-- COMMAND...' becomes."),
    config: str | None = typer.Option(None, "--config", help=_CONFIG_HELP),
    store: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
) -> None:
    """Build, verify and profile ladder stages (or '-- COMMAND...') under Nsight Compute."""
    from perfscope import ncu as ncu_mod  # deferred: the profiler side
    from perfscope import profiling  # deferred: the profiler side

    if section_set not in ("perfscope", "full"):
        raise PerfscopeError(f"--set {section_set!r} is not 'perfscope' or 'full'.")
    opts = ncu_mod.NcuOptions(full_set=section_set == "full", clock_control=clock_control,
                              kernel_regex=kernel, launch_skip=launch_skip, launch_count=launch_count,
                              nvtx_include=tuple(nvtx or ()), replay_mode=replay,
                              extra=tuple(ncu_arg or ()))
    stopped: Any = None
    if program is not None:
        if stages or param or resume:
            raise PerfscopeError("stage names, --param and --resume are for ladder stages; a "
                                 "program after -- takes --kernel, --launch-skip/-count and --nvtx.")
        if dtype and len(dtype) > 1:
            raise PerfscopeError("a program's kernel has one dtype; give --dtype once.")
        req = profiling.ProgramRequest(command=tuple(json.loads(program)), ncu=opts, out=out,
                                       shape=shape, dtype=dtype[0] if dtype else None, time=timed,
                                       timeout=timeout, tensor_maps=tensor_maps)
        with NcuProgress() as bar:
            try:
                written = profiling.profile_program(req, bar.update)
            except profiling.ProgramInterrupted as stop:
                stopped = stop
        if stopped is not None:
            typer.echo(f"perfscope: interrupted; {stopped.sentence}.", err=True)
            raise typer.Exit(130)
        typer.echo(f"wrote {written.report} ({written.launches} kernel launch(es)) and its run "
                   f"manifest {written.manifest.name}")
        if written.tensor_maps:
            typer.echo(f"tensor maps: {written.tensor_maps}")
        if written.timing:
            typer.echo(f"timing: {written.timing}")
        if written.timing_error:
            typer.echo(f"perfscope: not timed: {written.timing_error}", err=True)
            raise typer.Exit(2)
        if written.failed:
            marked = (f"; launch(es) {', '.join(f'#{i}' for i in written.untrusted)} are marked not "
                      f"trustworthy in {written.manifest.name}" if written.untrusted else "")
            typer.echo(f"perfscope: the program failed: {written.fault}; the launches before it are "
                       f"kept{marked}.", err=True)
            raise typer.Exit(1)
        return
    if kernel or launch_skip or launch_count is not None or nvtx or timed or replay != "kernel":
        raise PerfscopeError("--kernel, --launch-skip/-count, --nvtx, --replay and --time select a "
                             "program's launches: put the program after -- (stages are picked by "
                             "their NVTX ranges).")
    shape = shape or "4096x4096x4096"
    req = profiling.ProfileRequest(stages=tuple(stages or ["all"]), dtypes=tuple(dtype or []),
                                   shape=shape, params=_params(param, config, store, stages, dtype, shape),
                                   out=out, ncu=opts, resume=resume, timeout=timeout,
                                   tensor_maps=tensor_maps)
    plan = profiling.plan_jobs(req)
    with NcuProgress(total=len(plan.jobs)) as bar:
        try:
            summary = profiling.profile_stages(req, bar.update, plan=plan)
        except profiling.ProfileInterrupted as stop:
            stopped, summary = stop, stop.summary
    _show(summary)
    if stopped is not None:
        again = _command_line(ctx)
        typer.echo(f"perfscope: interrupted; {stopped.sentence}"
                   + (f": {again} --resume" if again and "--resume" not in again else "") + ".",
                   err=True)
        raise typer.Exit(130)
    if summary.failed:
        typer.echo(f"perfscope: {len(summary.failed)} stage(s) failed: {', '.join(summary.failed)}",
                   err=True)
        raise typer.Exit(1)


@app.command()
def bench(
    stages: list[str] | None = typer.Argument(None, help="Stage names, or 'all' (the default)."),
    shape: str = typer.Option("4096x4096x4096", "--shape", help="Problem size MxNxK (BxMxNxK: a "
                                "batch of B, cuBLAS's references only)."),
    dtype: list[str] | None = typer.Option(None, "--dtype", help="fp32, fp16, bf16 or fp8 (repeat)."),
    param: list[str] | None = typer.Option(None, "--param", help="Template parameter, e.g. STAGES=4."),
    out: Path | None = typer.Option(None, "--out", help="Write the bench file (the run manifests) "
                                    "here."),
    as_json: bool = typer.Option(False, "--json", help="Print the bench file as JSON instead of "
                                 "the table."),
    check_only: bool = typer.Option(False, "--check-only", help="Verify only; no timing."),
    runs: int = typer.Option(20, "--runs", help="Timed launches per round."),
    rounds: int = typer.Option(3, "--rounds", help="Alternating stage/cuBLAS rounds."),
    until: float | None = typer.Option(None, "--until", help="Add rounds past --rounds until "
                                       "each ratio's 90% interval of its median is within "
                                       "+-UNTIL of it (0.005: +-0.5%), up to --max-rounds."),
    max_rounds: int = typer.Option(15, "--max-rounds", help="The most rounds --until runs."),
    config: str | None = typer.Option(None, "--config", help=_CONFIG_HELP),
    store: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
    quant_scale: float = typer.Option(DEFAULT_QUANT_SCALE, "--quant-scale",
                                      help="The scale a quantising stage (hgemm_fused_quant) "
                                      "multiplies its outputs by: fp8's per-tensor scale, the "
                                      "base of int8's per-row scales."),
) -> None:
    """Verify stages against a float64 reference and time them against cuBLAS."""
    from perfscope import bench as b  # deferred: CuPy, and never the report reader

    named = next((s for s in stages or [] if s.endswith(".json")), None)
    if named is not None:
        # `bench --json FILE` wrote the file before; --json now prints, --out writes.
        raise PerfscopeError(f"{named} is not a stage: write the bench file with --out {named} "
                             "(--json prints the results as JSON).")
    opts = b.BenchOptions(runs=runs, rounds=rounds, time=not check_only, quant_scale=quant_scale,
                          until=until, max_rounds=max_rounds)
    jobs = b.plan(stages or ["all"], dtype or [], parse_shape(shape),
                  _params(param, config, store, stages, dtype, shape))
    done: list = []
    try:
        done.extend(b.run_jobs(jobs, opts))
    finally:
        # Whatever finished is kept, also when a later stage failed or crashed.
        if out is not None and done:
            b.write_bench_json(out, done, " ".join(sys.argv))
        if done:
            _show(b.summary(done), _fmt(as_json))
    if b.failed(done):
        raise typer.Exit(1)


@app.command()
def diagnose(
    files: list[Path] = typer.Argument(..., help="Reports (.ncu-rep, .ncu-rep.xz), folders, or "
                                       "REPORT#ID for one launch (the id every view prints)."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
    full: bool = typer.Option(False, "--full", help="Every kernel's panel, also for several "
                              "kernels (default: one row each; one kernel always gets its panel)."),
    fail_on: list[str] | None = typer.Option(None, "--fail-on", help="Exit 1 when a kernel has a "
                                             "finding of this severity or worse (info, "
                                             "optimization, warning, error) or of this rule code "
                                             "(PS110); repeat for several."),
) -> None:
    """Summarise every kernel of the given Nsight Compute reports and say what is wrong."""
    from perfscope import record  # deferred: loads the report reader
    from perfscope.diagnosis import diagnose as load  # deferred: loads the report reader

    fmt = _fmt(as_json, markdown)
    records = tuple(load(files, kernel))
    failures = record.failing_findings(records, fail_on or [])
    document = record.DiagnoseDocument(records, full=full or len(records) == 1,
                                       failures=tuple(failures))
    _show(document, fmt)
    _github(document, fmt)
    if failures:
        for f in failures:
            typer.echo(f"perfscope: --fail-on: {f}", err=True)
        raise typer.Exit(1)


@app.command()
def tune(
    ctx: typer.Context,
    stages: list[str] = typer.Argument(..., help="Stages to tune (those that declare a search "
                                       "space: sgemm_pipe, hgemm_bcf_dbf_rw, hgemm_ring, "
                                       "hgemm_tma_wgmma*, hgemm_fp8, hgemm_fused_bias_act)."),
    shape: list[str] | None = typer.Option(None, "--shape", help="Problem size MxNxK (repeat; "
                                           "default 4096x4096x4096)."),
    shapes_file: Path | None = typer.Option(None, "--shapes", help="A file of shapes, one MxNxK "
                                            "per line (# starts a comment)."),
    dtype: list[str] | None = typer.Option(None, "--dtype", help="fp32, fp16, bf16 or fp8 (repeat; "
                                           "default the stage's first)."),
    param: list[str] | None = typer.Option(None, "--param", help="Hold a parameter at one of its "
                                           "declared values, e.g. BN=256 (repeat)."),
    strategy: str | None = typer.Option(None, "--strategy", help="exhaustive, random or bayes "
                                        "(default: exhaustive when every configuration fits "
                                        "--budget, or 64 when none is given; else bayes)."),
    budget: int | None = typer.Option(None, "--budget", help="Configurations to measure per shape."),
    confirm: int = typer.Option(0, "--confirm", help="Time the best K per shape, and the default, "
                                "again at length (--confirm-runs, --confirm-rounds)."),
    profile_best: int = typer.Option(0, "--profile-best", help="Profile the best and the worst K "
                                     "per shape under ncu and diff them."),
    executor: str = typer.Option("local", "--executor", help="local (one worker per visible GPU) "
                                 "or ray (the 'cluster' extra)."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="The Ray cluster to use "
                                           "(default: RAY_ADDRESS, else a local instance)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a sweep: what the store holds "
                                "for this GPU, driver and toolchain is not measured again."),
    store: Path | None = typer.Option(None, "--store", help="The SQLite store (default "
                                      "reports/local/tune/tune.sqlite)."),
    runs: int = typer.Option(10, "--runs", help="Timed launches per round, per configuration."),
    rounds: int = typer.Option(3, "--rounds", help="Alternating configuration/cuBLAS rounds."),
    confirm_runs: int = typer.Option(20, "--confirm-runs", help="Launches per round when confirming."),
    confirm_rounds: int = typer.Option(5, "--confirm-rounds", help="Rounds when confirming."),
    confirm_until: float | None = typer.Option(None, "--confirm-until", help="Confirm with rounds "
                                               "past --confirm-rounds until each ratio's 90% "
                                               "interval is within +-UNTIL of it (bench --until), "
                                               "at most 15."),
    jobs: int | None = typer.Option(None, "--jobs", help="Compiler processes (default: the host's "
                                    "cores)."),
    deadline: float | None = typer.Option(None, "--deadline", help="Stop starting trials after this "
                                          "many seconds (--resume finishes later)."),
    task_timeout: float = typer.Option(300, "--task-timeout", help="Seconds one trial may take "
                                       "before its worker is killed (a hung kernel)."),
    keep_spills: bool = typer.Option(False, "--keep-spills", help="Measure configurations ptxas "
                                     "spills instead of pruning them (a few spilled bytes can "
                                     "cost nothing); the table names the best's spill."),
    seed: int = typer.Option(0, "--seed", help="Inputs and random/bayes draws."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
    html: Path | None = typer.Option(None, "--html", help="Also write the tuning section as a "
                                     "self-contained HTML page here."),
    dry: bool = typer.Option(False, "--dry", hidden=True, help="Compile and prune only; synthetic "
                             "timings under a 'dry run' GPU name (for CI without a GPU)."),
) -> None:
    """Search a stage's declared configurations per shape: compile in parallel, verify, time
    against cuBLAS on every GPU, keep every result in a SQLite store."""
    from perfscope.tune import executors, workflow  # deferred: the GPU side (workers, NVRTC)
    from perfscope.tune.store import DEFAULT_STORE  # deferred: with the rest of tune

    fmt = _fmt(as_json, markdown)
    shapes = [parse_shape(s) for s in shape or []]
    if shapes_file is not None:
        shapes += workflow.read_shapes(shapes_file)
    request = workflow.TuneRequest(
        stages=tuple(stages), shapes=tuple(dict.fromkeys(shapes)) or (parse_shape("4096x4096x4096"),),
        dtypes=tuple(dtype or ()), pins=parse_params(param or []), strategy=strategy,
        budget=budget, seed=seed, screen=workflow.TimingPlan(runs, rounds),
        confirm=confirm, confirm_timing=workflow.TimingPlan(confirm_runs, confirm_rounds, 3,
                                                            until=confirm_until),
        profile_best=profile_best, resume=resume, store=store or DEFAULT_STORE,
        deadline_s=deadline, keep_spills=keep_spills, command=_command_line(ctx) or "")
    workflow.plan_tune(request)   # bad input is refused before any worker starts
    pool = executors.make_executor(executors.ExecutorChoice(executor, dry, jobs, ray_address,
                                                            task_timeout=task_timeout))
    with TuneProgressBar() as bar:
        doc = workflow.run(request, pool, workflow.RunOptions(executor, bar.update))
    if html is not None:
        from perfscope.render.tune import html_page  # deferred: the renderer, once there is a page

        html.write_text(html_page(doc))
        typer.echo(f"perfscope: wrote {html}", err=True)
    _show(doc, fmt)
    unmeasured = [f"{r.stage} {r.dtype} {r.shape}" for r in doc.results if r.best is None]
    for line in doc.notes:
        typer.echo(f"perfscope: {line}", err=True)
    if unmeasured or any(n.startswith("--profile-best") for n in doc.notes):
        if unmeasured:
            typer.echo(f"perfscope: no configuration was verified and timed for "
                       f"{', '.join(unmeasured)}", err=True)
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    """The `perfscope` entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `perfscope profile [OPTIONS] -- COMMAND...`: click would read COMMAND as stage names,
    # so everything after `--` travels as one JSON option instead.
    if args[:1] == ["profile"] and "--" in args:
        cut = args.index("--")
        args = [*args[:cut], "--program", json.dumps(args[cut + 1:])]
    # This entry point is guarded, so folders of reports may be read in worker processes.
    os.environ.setdefault(LOAD_WORKERS_ENV, "auto")
    app(args=args, obj={"argv": list(sys.argv[1:] if argv is None else argv)})


if __name__ == "__main__":
    main()
