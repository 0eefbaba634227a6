"""Where reports live: a user's own runs and the committed reference run (ground floor)."""

from __future__ import annotations

from pathlib import Path

from perfscope.errors import PerfscopeError

# A user's runs, relative to the working directory (git-ignored in the checkout).
LOCAL_ROOT = Path("reports") / "local"
# The committed reference run inside a checkout of perfscope.
REFERENCE_SUBDIR = Path("reports") / "reference"
CHECKOUT = Path(__file__).resolve().parent.parent
# The ladder stages' CUDA sources, installed with the package (the compile's include
# folder too): where the source view finds a stage's lines when the report has none.
KERNEL_SOURCES = Path(__file__).resolve().parent / "kernels"
# How many worker processes read a folder of reports (perfscope.loadpool): a number, or
# "auto" (one a CPU), which the `perfscope` command sets for itself when unset.
LOAD_WORKERS_ENV = "PERFSCOPE_LOAD_WORKERS"


def reference_root(explicit: Path | None = None) -> Path:
    """The reference run to resolve stage names in: the folder given, else the one in the
    working directory, else the one in the checkout perfscope runs from."""
    if explicit is not None:
        return explicit
    here = REFERENCE_SUBDIR
    if here.is_dir():
        return here
    return CHECKOUT / REFERENCE_SUBDIR


def existing_reference_root(explicit: Path | None = None) -> Path:
    """reference_root, refused in one sentence that names the folders searched when it is
    not there (a wheel install has no committed run; --reference-dir names one)."""
    if explicit is not None:
        if not explicit.is_dir():
            raise PerfscopeError(f"the reference run folder {explicit} does not exist.")
        return explicit
    root = reference_root()
    if not root.is_dir():
        raise PerfscopeError(f"no reference run found: looked in {REFERENCE_SUBDIR.absolute()} and "
                             f"{CHECKOUT / REFERENCE_SUBDIR}; name one with --reference-dir DIR.")
    return root


def install_hint(extra: str) -> str:
    """How to install one of perfscope's extras from where this perfscope comes from.

    perfscope is installed from its repository, not from PyPI (an unrelated project holds
    the name there), so the hint names the checkout, never `pip install perfscope[...]`.
    """
    if (CHECKOUT / "pyproject.toml").is_file():
        return f"pip install -e '{CHECKOUT}[{extra}]'"
    return f"pip install -e '.[{extra}]' from a checkout of the perfscope repository"
