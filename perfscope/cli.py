"""The perfscope command line: thin typer commands that parse, call the library, render.

Every command turns a PerfscopeError into one sentence on stderr and a non-zero exit;
nothing a user can cause ends in a traceback.
"""

from __future__ import annotations

import json
import logging
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
def diagnose(
    files: list[Path] = typer.Argument(..., help="Reports (.ncu-rep, .ncu-rep.xz) or folders."),
    kernel: str | None = typer.Option(None, "--kernel", "-k", help="Only kernels matching REGEX."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown for a PR comment."),
) -> None:
    """Summarise every kernel of the given Nsight Compute reports."""
    from perfscope.profile import load_many

    profiles = guarded(lambda: load_many(files, kernel))
    if as_json:
        from perfscope.export import to_json

        typer.echo(json.dumps(to_json(profiles), indent=1, allow_nan=False, default=_json_default))
    elif markdown:
        from perfscope.render.markdown import render

        typer.echo(render(profiles))
    else:
        from perfscope.render.console import render

        render(profiles)


def _json_default(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
