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
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from perfscope.errors import PerfscopeError
from perfscope.kernels.listing import kernels_table
from perfscope.kernels.spec import parse_params, parse_shape
from perfscope.locations import reference_root
from perfscope.render.progress import NcuProgress

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


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress.")) -> None:
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


def _command_line(ctx: typer.Context) -> str | None:
    """The command that made a page, when main() recorded it (not under a test runner)."""
    argv = (ctx.find_root().obj or {}).get("argv")
    return "perfscope " + shlex.join(argv) if argv else None


# -- commands (each one thin: parse, call the library, render) --


@app.command()
def sass(
    target: str = typer.Argument(..., help="A stage name, a .cu file (compiled with nvcc) or a .cubin."),
    arch: str | None = typer.Option(None, "--arch", help="Compile target: sm_80, sm_90a, sm_100a, "
                                    "sm_103a... (default: the stage's first; sm_90a for a .cu)."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 / fp16 / bf16 (default: the "
                                     "stage's first)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document."),
) -> None:
    """Static SASS audit, no GPU needed: opcode families, registers and spills, the stage's
    fingerprint, and the rules that need no counters. Exit 1 if a fingerprint fails."""
    from perfscope.audit import audit  # deferred: compiles through NVRTC

    doc = audit(target, arch, dtype)
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
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    title: str | None = typer.Option(None, "--title", help="Page title."),
) -> None:
    """Diagnosis report of a set of kernels: HTML for review, Markdown for a PR comment."""
    from perfscope import review  # deferred: loads the report reader
    from perfscope.render.html import write_page  # deferred: matplotlib

    if html is None and not markdown:
        raise PerfscopeError("say what to write: --html FILE, --markdown, or both.")
    rev = review.collect(paths, bench=bench, kernel=kernel, title=title, command=_command_line(ctx))
    if html is not None:
        write_page(html, rev, inputs=paths)
        typer.echo(f"wrote {html}", err=markdown)
    if markdown:
        _show(rev, "markdown", html_name=html.name if html is not None else None)


@app.command()
def diff(
    a: str = typer.Argument(..., help="Report, REPORT:REGEX[@N], REPORT#ID, or stage name "
                            "(its latest report)."),
    b: str = typer.Argument(..., help="The same, or 'cublas' for A's cuBLAS reference."),
    reference: bool = typer.Option(False, "--reference", help="Resolve stage names in the "
                                   "committed reference run, not reports/local."),
    reference_dir: Path | None = typer.Option(None, "--reference-dir", help="Resolve stage names in "
                                              "this reference run folder."),
    shape: str | None = typer.Option(None, "--shape", help="GEMM shape MxNxK of both kernels."),
    dtype: str | None = typer.Option(None, "--dtype", help="For stage names: which dtype's report."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
    fail_if: list[str] | None = typer.Option(None, "--fail-if", help="Gate, e.g. 'cycles_ratio>1.05'."),
    fail_on_new_findings: bool = typer.Option(False, "--fail-on-new-findings",
                                              help="Fail when A has a finding B has not."),
) -> None:
    """Why A is slower than B: side by side, with the rules' verdict."""
    from perfscope import diagnosis  # deferred: loads the report reader
    from perfscope import diff as d  # deferred: loads the report reader

    fmt = _fmt(as_json, markdown)
    root = reference_root(reference_dir) if reference or reference_dir else None
    options = diagnosis.ResolveOptions(reference=root, dtype=dtype)
    side_a, side_b = diagnosis.resolve_pair(a, b, options)
    result = d.compare(side_a, side_b, parse_shape(shape).flops if shape else None)
    violated = d.check_gates(result, fail_if or [], fail_on_new_findings)
    _show(d.DiffDocument(result, tuple(violated)), fmt)
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
    bench: Path | None = typer.Option(None, "--bench", help="bench.json (or its folder) the ratios "
                                      "come from (default: the committed H200 reference run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the listing as JSON."),
) -> None:
    """The stages perfscope builds: parent, what each changes, arch, best measured ratio."""

    _show(kernels_table(bench if bench is not None else reference_root() / "h200"), _fmt(as_json))


@app.command()
def profile(
    stages: list[str] | None = typer.Argument(None, help="Stage names or 'all'."),
    shape: str = typer.Option("4096x4096x4096", "--shape", help="Problem size MxNxK."),
    dtype: list[str] | None = typer.Option(None, "--dtype", help="fp32, fp16 or bf16 (repeat)."),
    param: list[str] | None = typer.Option(None, "--param", help="Template parameter, e.g. STAGES=4."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default reports/local/<gpu>)."),
    section_set: str = typer.Option("perfscope", "--set",
                                     help="perfscope (the declared collection set) or full."),
    clock_control: str = typer.Option("none", "--clock-control", help="none (as found) or base."),
    resume: bool = typer.Option(False, "--resume", help="Skip stages whose report exists and loads."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="With a program: kernels to profile."),
    timeout: float = typer.Option(1800, "--timeout", help="Stop ncu after this many seconds."),
    program: str | None = typer.Option(None, "--program", hidden=True,
                                       help="JSON argv; what '-- COMMAND...' becomes."),
) -> None:
    """Build, verify and profile ladder stages (or '-- COMMAND...') under Nsight Compute."""
    from perfscope import ncu as ncu_mod  # deferred: the profiler side
    from perfscope import profiling  # deferred: the profiler side

    if section_set not in ("perfscope", "full"):
        raise PerfscopeError(f"--set {section_set!r} is not 'perfscope' or 'full'.")
    opts = ncu_mod.NcuOptions(full_set=section_set == "full", clock_control=clock_control,
                              kernel_regex=kernel)
    if program is not None:
        target = out or profiling.LOCAL_ROOT / "programs" / "program.ncu-rep"
        with NcuProgress() as bar:
            written = profiling.profile_program(json.loads(program), target, opts, timeout, bar.update)
        typer.echo(f"wrote {written.report} ({written.launches} kernel launch(es))")
        return
    req = profiling.ProfileRequest(stages=tuple(stages or ["all"]), dtypes=tuple(dtype or []),
                                   shape=shape, params=parse_params(param or []), out=out,
                                   ncu=opts, resume=resume, timeout=timeout)
    plan = profiling.plan_jobs(req)
    with NcuProgress(total=len(plan.jobs)) as bar:
        summary = profiling.profile_stages(req, bar.update, plan=plan)
    _show(summary)
    if summary.failed:
        typer.echo(f"perfscope: {len(summary.failed)} stage(s) failed: {', '.join(summary.failed)}",
                   err=True)
        raise typer.Exit(1)


@app.command()
def bench(
    stages: list[str] | None = typer.Argument(None, help="Stage names, or 'all' (the default)."),
    shape: str = typer.Option("4096x4096x4096", "--shape", help="Problem size MxNxK."),
    dtype: list[str] | None = typer.Option(None, "--dtype", help="fp32, fp16 or bf16 (repeat)."),
    param: list[str] | None = typer.Option(None, "--param", help="Template parameter, e.g. STAGES=4."),
    json_file: Path | None = typer.Option(None, "--json", help="Write the run manifests here."),
    check_only: bool = typer.Option(False, "--check-only", help="Verify only; no timing."),
    runs: int = typer.Option(20, "--runs", help="Timed launches per round."),
    rounds: int = typer.Option(3, "--rounds", help="Alternating stage/cuBLAS rounds."),
) -> None:
    """Verify stages against a float64 reference and time them against cuBLAS."""
    from perfscope import bench as b  # deferred: CuPy, and never the report reader

    jobs = b.plan(stages or ["all"], dtype or [], parse_shape(shape), parse_params(param or []))
    opts = b.BenchOptions(runs=runs, rounds=rounds, time=not check_only)
    done: list = []
    try:
        done.extend(b.run_jobs(jobs, opts))
    finally:
        # Whatever finished is kept, also when a later stage failed or crashed.
        if json_file is not None and done:
            b.write_bench_json(json_file, done, " ".join(sys.argv))
        if done:
            _show(b.BenchSummary.of(done))
    if b.failed(done):
        raise typer.Exit(1)


@app.command()
def diagnose(
    files: list[Path] = typer.Argument(..., help="Reports (.ncu-rep, .ncu-rep.xz) or folders."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
) -> None:
    """Summarise every kernel of the given Nsight Compute reports."""
    from perfscope.diagnosis import diagnose as load  # deferred: loads the report reader
    from perfscope.record import DiagnoseDocument  # deferred: loads the report reader

    _show(DiagnoseDocument(tuple(load(files, kernel))), _fmt(as_json, markdown))


def main(argv: list[str] | None = None) -> None:
    """The `perfscope` entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `perfscope profile [OPTIONS] -- COMMAND...`: click would read COMMAND as stage names,
    # so everything after `--` travels as one JSON option instead.
    if args[:1] == ["profile"] and "--" in args:
        cut = args.index("--")
        args = [*args[:cut], "--program", json.dumps(args[cut + 1:])]
    app(args=args, obj={"argv": list(sys.argv[1:] if argv is None else argv)})


if __name__ == "__main__":
    main()
