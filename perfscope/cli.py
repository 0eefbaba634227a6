"""The perfscope command line: thin typer commands that parse, call the library, render.

Every command turns a PerfscopeError into one sentence on stderr and a non-zero exit;
nothing a user can cause ends in a traceback.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer

from perfscope.errors import PerfscopeError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile CUDA GEMM kernels under Nsight Compute and say what is slow.")
log = logging.getLogger("perfscope")

T = TypeVar("T")


def guarded(fn: Callable[[], T]) -> T:
    """Run fn; a PerfscopeError becomes one sentence on stderr and exit code 2."""
    try:
        return fn()
    except PerfscopeError as exc:
        typer.echo(f"perfscope: {exc}", err=True)
        raise typer.Exit(2) from None


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(name)s: %(message)s", stream=sys.stderr)


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
    from perfscope.sass.audit import audit, render_text

    audits = guarded(lambda: audit(target, arch, dtype))
    if as_json:
        typer.echo(json.dumps([a.to_dict() for a in audits], indent=1, allow_nan=False,
                              default=_json_default))
    else:
        typer.echo(render_text(audits), nl=False)
    if not all(a.fingerprint_ok for a in audits):
        raise typer.Exit(1)


@app.command()
def report(
    paths: list[Path] = typer.Argument(..., help="Reports (.ncu-rep, .ncu-rep.xz) or folders of them."),
    html: Path | None = typer.Option(None, "--html", help="Write the self-contained HTML report here."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown summary for a PR comment."),
    bench: Path | None = typer.Option(None, "--bench", help="bench.json for the ladder overview "
                                      "(default: the one in the first folder given)."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    title: str | None = typer.Option(None, "--title", help="Page title."),
) -> None:
    """Diagnosis report of a set of kernels: HTML for review, Markdown for a PR comment."""
    from perfscope.render import html as h
    from perfscope.render import report_markdown
    from perfscope.render.report import collect

    if html is None and not markdown:
        guarded(lambda: _refuse("say what to write: --html FILE, --markdown, or both."))
    # The page records the command that made it (capture conditions); not under a test runner.
    command = "perfscope " + shlex.join(sys.argv[1:]) if "report" in sys.argv[1:] else None
    rep = guarded(lambda: collect(paths, bench=bench, kernel=kernel, title=title, command=command))
    if html is not None:
        guarded(lambda: _write_html(h, html, rep))
        log.info("wrote %s", html)
    if markdown:
        typer.echo(report_markdown.render(rep, html.name if html is not None else None))


def _write_html(h, path: Path, rep) -> None:
    try:
        h.write_atomic(path, h.render_html(rep))
    except OSError as exc:
        raise PerfscopeError(f"cannot write {path}: {exc.strerror or exc}.") from None


@app.command()
def diff(
    a: str = typer.Argument(..., help="Report, REPORT:REGEX, or stage name (its latest report)."),
    b: str = typer.Argument(..., help="The same, or 'cublas' for A's cuBLAS reference."),
    reference: bool = typer.Option(False, "--reference", help="Resolve stage names in the "
                                   "committed reference run, not reports/local."),
    shape: str | None = typer.Option(None, "--shape", help="GEMM shape MxNxK of both kernels."),
    dtype: str | None = typer.Option(None, "--dtype", help="For stage names: which dtype's report."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
    fail_if: list[str] | None = typer.Option(None, "--fail-if", help="Gate, e.g. 'cycles_ratio>1.05'."),
    fail_on_new_findings: bool = typer.Option(False, "--fail-on-new-findings",
                                              help="Fail when A has a finding B has not."),
) -> None:
    """Why A is slower than B: side by side, with the rules' verdict."""
    from perfscope import diff as d

    def build():
        side_a = d.resolve(a, reference=reference, dtype=dtype)
        side_b = d.resolve(b, reference=reference, like=side_a, dtype=dtype)
        flops = None
        if shape:
            from perfscope.kernels import parse_shape

            s = parse_shape(shape)
            flops = s.flops
        result = d.compare(side_a, side_b, flops)
        return result, d.check_gates(result, fail_if or [])

    result, violated = guarded(build)
    if fail_on_new_findings and result.new_findings:
        violated.append("A has findings B has not: "
                        + ", ".join(f"{f.code} {f.title}" for f in result.new_findings))
    if as_json:
        typer.echo(json.dumps({**d.to_dict(result), "gate_failures": violated}, indent=1,
                              default=_json_default))
    elif markdown:
        from perfscope.render.diff import render_markdown

        typer.echo(render_markdown(result, violated))
    else:
        from perfscope.render.diff import render_console

        render_console(result)
    if violated:
        for v in violated:
            typer.echo(f"perfscope: gate failed: {v}", err=True)
        raise typer.Exit(1)


@app.command("rules")
def rules_table(
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """List perfscope's rule table: code, tag, severity, title, source."""
    from perfscope.rules import REGISTRY

    if as_json:
        rows = [{"code": r.code, "tag": r.tag, "severity": r.severity, "title": r.title,
                 "metrics": list(r.metrics), "fix": r.fix, "source": r.reference,
                 "nsight_compute": list(r.ncu), "doc": r.doc} for r in REGISTRY]
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("code", "tag", "severity", "title", "source")
    for r in REGISTRY:
        table.add_row(r.code, r.tag, r.severity, r.title, r.reference)
    Console().print(table)


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
    from perfscope import ncu as ncu_mod
    from perfscope import profiling
    from perfscope.render.progress import NcuProgress

    if section_set not in ("perfscope", "full"):
        guarded(lambda: _refuse(f"--set {section_set!r} is not 'perfscope' or 'full'."))
    opts = guarded(lambda: ncu_mod.NcuOptions(output=Path("unused"), full_set=section_set == "full",
                                              clock_control=clock_control, kernel_regex=kernel))
    if program is not None:
        argv = json.loads(program)
        target = out or profiling.LOCAL_ROOT / "programs" / "program.ncu-rep"
        with NcuProgress() as bar:
            report = guarded(lambda: profiling.profile_command(argv, target, opts, timeout, bar.update))
        from perfscope.profile import load

        # Read it back now: an unreadable report is this command's failure, not diagnose's.
        kernels = guarded(lambda: load(report))
        typer.echo(f"wrote {report} ({len(kernels)} kernel launch(es))")
        return
    from perfscope.bench import parse_params

    req = guarded(lambda: profiling.ProfileRequest(
        stages=tuple(stages or ["all"]), dtypes=tuple(dtype or []), shape=shape,
        params=parse_params(param or []), out=out, ncu=opts, resume=resume, timeout=timeout))
    planned, _ = guarded(lambda: profiling.plan_jobs(req))
    with NcuProgress(total=len(planned)) as bar:
        out_dir, results = guarded(lambda: profiling.profile_stages(req, bar.update))
    _print_profile_results(out_dir, results)
    if any(r.failed for r in results):
        raise typer.Exit(1)


def _refuse(sentence: str) -> None:
    raise PerfscopeError(sentence)


def _print_profile_results(out_dir: Path, results: list) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("stage", "verdict", "report", "detail", title=f"perfscope profile -> {out_dir}")
    for r in results:
        table.add_row(r.stem, r.verdict, r.report.name if r.report else "-", r.detail)
    Console().print(table)
    failed = [r.stem for r in results if r.failed]
    if failed:
        typer.echo(f"perfscope: {len(failed)} stage(s) failed: {', '.join(failed)}", err=True)


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
    from rich.console import Console
    from rich.table import Table

    from perfscope import bench as b
    from perfscope.kernels import parse_shape

    jobs, opts = guarded(lambda: (
        b.plan(stages or ["all"], dtype or [], parse_shape(shape), b.parse_params(param or [])),
        b.BenchOptions(runs=runs, rounds=rounds, time=not check_only)))
    done: list = []
    try:
        guarded(lambda: done.extend(b.run_jobs(jobs, opts)))
    finally:
        # Whatever finished is kept, also when a later stage failed or crashed.
        if json_file is not None and done:
            guarded(lambda: b.write_bench_json(json_file, done, " ".join(sys.argv)))
        if done:
            table = Table(*b.SUMMARY_COLUMNS)
            for row in b.summary_rows(done):
                table.add_row(*row)
            Console().print(table)
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
    from perfscope.profile import load_many
    from perfscope.rules import evaluate_all

    profiles = guarded(lambda: load_many(files, kernel))
    evaluations = evaluate_all(profiles)
    if as_json:
        from perfscope.export import to_json

        doc = to_json(profiles, findings=[[f.to_dict() for f in e.findings] for e in evaluations],
                      not_evaluated=[[n.to_dict() for n in e.not_evaluated] for e in evaluations])
        typer.echo(json.dumps(doc, indent=1, allow_nan=False, default=_json_default))
    elif markdown:
        from perfscope.render.markdown import render

        typer.echo(render(profiles, evaluations))
    else:
        from perfscope.render.console import render

        render(profiles, evaluations=evaluations)


def _json_default(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # `perfscope profile [OPTIONS] -- COMMAND...`: click would read COMMAND as stage names,
    # so everything after `--` travels as one JSON option instead.
    if args[:1] == ["profile"] and "--" in args:
        cut = args.index("--")
        args = [*args[:cut], "--program", json.dumps(args[cut + 1:])]
    app(args=args)


if __name__ == "__main__":
    main()
