"""Merge a capture of some workloads (``capture.py --only NAME...``) into the committed set.

    python3 benchmarks/external/merge.py NEW_DIR [tests/fixtures/external]

NEW_DIR is an unpacked ``external.tar`` of the partial capture. Its workloads' entries join
``capture.json`` and ``timing.json`` (replacing entries of the same name), each carrying the
command, time and machine of the run that made it (``run``); its groups join ``capture.json`` under
``GROUP@TIME`` with their log renamed to match, and its reports and logs are copied beside
the others. Nothing else in the committed set changes. Run ``manifests.py`` afterwards.
Runs on the CPU.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def merge(new: Path, into: Path) -> list[str]:
    """Merge NEW's capture.json and timing.json into INTO's; return the workloads merged."""
    cap, cap_new = _load(into / "capture.json"), _load(new / "capture.json")
    tim, tim_new = _load(into / "timing.json"), _load(new / "timing.json")
    stamp = cap_new["time"].replace(" UTC", "").replace(" ", "T").replace(":", "")[:15]
    for group, entry in cap_new["groups"].items():
        entry = dict(entry)
        if entry.get("log"):
            log = f"{group}@{stamp}.ncu.log"
            shutil.copyfile(new / entry["log"], into / log)
            entry["log"] = log
        cap["groups"][f"{group}@{stamp}"] = entry
    names = []
    for name, entry in cap_new["workloads"].items():
        cap["workloads"][name] = {**entry, "run": {"command": cap_new["command"],
                                                   "time": cap_new["time"]}}
        report = entry.get("report")
        if report:
            shutil.copyfile(new / report, into / report)
        names.append(name)
    for name, entry in tim_new["workloads"].items():
        # The machine each workload was timed on: a partial capture may come from another
        # card than the set's (manifests.py writes this, not the set's, into its manifest).
        tim["workloads"][name] = {**entry, "run": {"command": tim_new["command"],
                                                   "time": tim_new["time"],
                                                   "environment": tim_new.get("environment", {})}}
    if (new / "timing.log").is_file():
        shutil.copyfile(new / "timing.log", into / f"timing@{stamp}.log")
    (into / "capture.json").write_text(json.dumps(cap, indent=1) + "\n")
    (into / "timing.json").write_text(json.dumps(tim, indent=1) + "\n")
    return names


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    into = Path(argv[1]) if len(argv) == 2 else ROOT / "tests" / "fixtures" / "external"
    try:
        names = merge(Path(argv[0]), into)
    except ValueError as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return 2
    except (OSError, KeyError) as exc:
        print(f"merge: {argv[0]} is not an unpacked partial capture ({exc})", file=sys.stderr)
        return 2
    for name in names:
        print(f"merged {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
