"""Where perfscope keeps what it can rebuild: compiled cubins and decompressed reports.

``$PERFSCOPE_CACHE``, else ``$XDG_CACHE_HOME/perfscope``, else ``~/.cache/perfscope``;
cubins live under ``cubin/``, plain copies of ``.ncu-rep.xz`` reports under ``reports/``.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PERFSCOPE_CACHE"


def cache_root() -> Path:
    """The cache folder: $PERFSCOPE_CACHE, else $XDG_CACHE_HOME/perfscope, else ~/.cache/perfscope."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "perfscope"
