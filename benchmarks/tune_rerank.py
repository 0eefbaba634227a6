"""Re-order a committed tune document by perfscope.tune.store.rank, without a GPU.

    PYTHONPATH=. python3 benchmarks/tune_rerank.py [--out reports/reference/h200/tune]

A sweep's document (results.json.xz, tune.md, tune.html) ranks its trials when it is
written. When the ranking changes (2026-12-02: a confirmation outranks a screening, as in
`--config best`), this re-sorts each shape's trials from results.json.xz itself, adds a
note naming the shapes whose best changed (their ncu diffs stay the sweep's, of the old
best), and writes the three files again; the store and its export are not touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tune_h200 import write_document  # noqa: E402

from perfscope.documents import TuneDocument  # noqa: E402
from perfscope.tune.store import rank  # noqa: E402


def rerank(out: Path, when: str) -> list[str]:
    """Re-sort out/results.json.xz's trials by rank and rewrite the document; the shapes
    whose best changed."""
    path = out / "results.json.xz"
    run = json.loads(lzma.decompress(path.read_bytes())).get("run")
    doc = TuneDocument.read(path)
    changed, results = [], []
    for r in doc.results:
        trials = tuple(sorted(r.trials, key=lambda t: (*rank(t.phase, t.ratio.median if t.ratio
                                                                 else None), t.config)))
        if trials and r.trials and trials[0] is not r.trials[0]:
            changed.append(f"{r.dtype} {r.shape}")
        results.append(dataclasses.replace(r, trials=trials))
    notes = doc.notes
    if changed:
        notes = (*notes, f"Re-ranked on {when} without a GPU (the store unchanged): a confirmation "
                 "now outranks a screening in this document as in `--config best` "
                 "(perfscope.tune.store.rank); the best changed at " + ", ".join(changed)
                 + ", whose ncu diffs are of the sweep's screening best.")
    write_document(out, dataclasses.replace(doc, results=tuple(results), notes=notes), run)
    return changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "reference" / "h200" / "tune")
    ap.add_argument("--when", default="2026-12-02")
    args = ap.parse_args()
    changed = rerank(args.out, args.when)
    print("best changed at: " + (", ".join(changed) if changed else "no shape"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
