"""The perfscope command line: thin typer commands that parse, call the library, render.

Every command turns a PerfscopeError into one sentence on stderr and a non-zero exit;
nothing a user can cause ends in a traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
