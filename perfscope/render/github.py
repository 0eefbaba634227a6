"""GitHub Actions: annotations on the source lines findings point at, and the step summary.

    render(document, "github", workspace=".")          # ::warning file=...,line=...::... lines
    render(document, "github", summary=True)           # Markdown for $GITHUB_STEP_SUMMARY

An annotation is a workflow command on a line of its own: ``::error``, ``::warning`` or
``::notice`` (perfscope's error, warning, and optimization/info severities), with the
source file and line of the finding (:func:`perfscope.record.source_line`) made relative
to the workspace so GitHub can place it on the pull request's diff; a kernel compiled
without line information gets an annotation without a file. GitHub shows only the first
annotations of each kind per step, so the most severe and costliest come first.
Whether to emit at all (``GITHUB_ACTIONS``, ``GITHUB_STEP_SUMMARY``) is the CLI's call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from perfscope.record import incomplete_reports, source_line
from perfscope.render.markdown import RENDERERS as MARKDOWN
from perfscope.render.markdown import diagnose_table
from perfscope.render.summary import evidence_value, gain, md_cell

if TYPE_CHECKING:
    from perfscope.diff import DiffDocument
    from perfscope.record import Diagnosed, DiagnoseDocument
    from perfscope.rules import Finding

COMMAND = {"error": "error", "warning": "warning", "optimization": "notice", "info": "notice"}
_RANK = {"error": 0, "warning": 1, "optimization": 2, "info": 3}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, message: str, *, title: str, where: tuple[str, int] | None = None) -> str:
    """One workflow command line: ``::kind file=F,line=L,title=T::message``."""
    props = [] if where is None else [f"file={_escape_property(where[0])}", f"line={where[1]}"]
    props.append(f"title={_escape_property(title)}")
    return f"::{kind} {','.join(props)}::{_escape_data(message)}"


def _relative(where: tuple[str, int] | None, workspace: str | None) -> tuple[str, int] | None:
    if where is None or workspace is None:
        return where
    file, line = where
    root = os.path.abspath(workspace)
    path = os.path.abspath(file)
    if os.path.commonpath([root, path]) == root:
        return os.path.relpath(path, root).replace(os.sep, "/"), line
    return where


def _finding_message(r: Diagnosed, f: Finding) -> str:
    evidence = "; ".join(f"{e.metric} = {evidence_value(e.value)}" for e in f.evidence[:2])
    return (f"{r.label} ({r.launch_id}): {f.title}, {gain(f.estimated_gain)}"
            + (f"; {evidence}" if evidence else "") + f". Fix: {f.fix}")


def _annotations(pairs: Iterable[tuple[Diagnosed, Finding]], workspace: str | None) -> list[str]:
    ranked = sorted(pairs, key=lambda p: (_RANK.get(p[1].severity, 9), -(p[1].estimated_gain or 0.0)))
    return [command(COMMAND.get(f.severity, "notice"), _finding_message(r, f),
                    title=f"perfscope {f.code}: {f.title}",
                    where=_relative(source_line(r, f), workspace))
            for r, f in ranked]


def _lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


# ------------------------------------------------------------------------ diagnose


def _diagnose(doc: DiagnoseDocument, summary: bool = False, workspace: str | None = None) -> str:
    if summary:
        head = [f"### perfscope diagnose: {len(doc.records)} kernel launch(es)", ""]
        head += [f"> warning: {md_cell(w)}" for w in doc.warnings]
        head += [f"> **failed:** {md_cell(x)}" for x in doc.failures]
        return "\n".join([*head, "", *diagnose_table(doc)]) + "\n"
    lines = [command("warning", w, title="perfscope: incomplete report") for w in doc.warnings]
    lines += _annotations(((r, f) for r in doc.records for f in r.evaluation.findings), workspace)
    return _lines(lines)


# ---------------------------------------------------------------------------- diff


def _diff(doc: DiffDocument, summary: bool = False, workspace: str | None = None) -> str:
    if summary:
        return MARKDOWN["diff"](doc)
    diff = doc.diff
    lines = [command("error", g, title="perfscope gate failed") for g in doc.gate_failures]
    # Only the warnings that put the numbers in doubt; "shape unknown" is not one.
    lines += [command("warning", w, title="perfscope: incomplete report")
              for w in incomplete_reports((diff.a, diff.b))]
    # A's findings that B has not: what the change under review brought in.
    lines += _annotations(((diff.a, f) for f in diff.new_findings), workspace)
    return _lines(lines)


RENDERERS: dict[str, Callable[..., str]] = {"diagnose": _diagnose, "diff": _diff}
