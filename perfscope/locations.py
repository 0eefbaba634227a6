"""Where reports live: a user's own runs and the committed reference run (ground floor)."""

from __future__ import annotations

from pathlib import Path

# A user's runs, relative to the working directory (git-ignored in the checkout).
LOCAL_ROOT = Path("reports") / "local"
# The committed reference run inside a checkout of perfscope.
REFERENCE_SUBDIR = Path("reports") / "reference"
CHECKOUT = Path(__file__).resolve().parent.parent


def reference_root(explicit: Path | None = None) -> Path:
    """The reference run to resolve stage names in: the folder given, else the one in the
    working directory, else the one in the checkout perfscope runs from."""
    if explicit is not None:
        return explicit
    here = REFERENCE_SUBDIR
    if here.is_dir():
        return here
    return CHECKOUT / REFERENCE_SUBDIR
