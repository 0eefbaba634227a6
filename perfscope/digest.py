"""The source hash a compile records (ground floor).

The build hashes a kernel's source with the local headers it includes and writes the
hash into the run manifest; the source view (perfscope.source) hashes the checkout's
copy the same way to tell whether the lines it shows are the lines that were compiled.
One recipe in one place, so the two can never disagree.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

_LOCAL_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def local_headers(source: str, include_dir: Path | None, seen: set[str] | None = None
                  ) -> list[tuple[str, str]]:
    """(name, text) of every quoted include reachable from source that include_dir holds."""
    if include_dir is None:
        return []
    seen = set() if seen is None else seen
    out = []
    for name in _LOCAL_INCLUDE_RE.findall(source):
        path = include_dir / name
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        text = path.read_text()
        out.append((name, text))
        out.extend(local_headers(text, include_dir, seen))
    return out


def source_hash(source: str, include_dir: Path | None = None) -> str:
    """sha256 over the source and the local headers it includes (hex, 16 digits)."""
    h = hashlib.sha256(source.encode())
    for name, text in local_headers(source, include_dir):
        h.update(b"\0" + name.encode() + b"\0" + text.encode())
    return h.hexdigest()[:16]
