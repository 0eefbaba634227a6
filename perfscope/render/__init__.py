"""Renderers: a finished document in, text out; they read values and compute nothing new.

    from perfscope.render import render
    text = render(document, "markdown")

A document is any value with a ``kind`` ("diagnose", "diff", "review", "rules", "audit",
"kernels", "bench", "profile", "tune"). Each format is one module here with a ``RENDERERS``
table from kind to function; ``render`` picks the module by format name and the function by
kind. Format modules are imported when first asked for, so printing a rule table does not
load matplotlib. (render/tune.py holds the tune document's console, Markdown and HTML-section
renderers; console and markdown list them in their tables.)
"""

from __future__ import annotations

import importlib
from typing import Any

from perfscope.errors import PerfscopeError

FORMATS: dict[str, str] = {"console": "perfscope.render.console",
                           "markdown": "perfscope.render.markdown",
                           "json": "perfscope.render.jsondoc",
                           "html": "perfscope.render.html",
                           "github": "perfscope.render.github"}


def render(document: Any, fmt: str = "console", **options: Any) -> str:
    """The text of document in format fmt; options go to the format's renderer."""
    if fmt not in FORMATS:
        raise PerfscopeError(f"unknown output format {fmt!r}; formats: {', '.join(FORMATS)}.")
    table = importlib.import_module(FORMATS[fmt]).RENDERERS
    fn = table.get(document.kind)
    if fn is None:
        raise PerfscopeError(f"a {document.kind} cannot be written as {fmt}; "
                             f"it can be: {', '.join(f for f in FORMATS if _has(f, document.kind))}.")
    return fn(document, **options)


def _has(fmt: str, kind: str) -> bool:
    return kind in importlib.import_module(FORMATS[fmt]).RENDERERS
