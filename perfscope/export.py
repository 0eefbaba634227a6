"""Exports of KernelProfiles for the Python API: a long pandas DataFrame, and the diagnose
JSON document (``perfscope.diagnose/2``; its schema is written in perfscope.render.jsondoc).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from perfscope.profile import KernelProfile
from perfscope.render.jsondoc import profiles_document


def to_json(profiles: Sequence[KernelProfile]) -> dict[str, Any]:
    """The diagnose JSON document of profiles (as data; rules not evaluated)."""
    return profiles_document(profiles)


def to_dataframe(profiles: Iterable[KernelProfile]):  # -> pandas.DataFrame
    """Every raw metric of every launch, long: kernel, launch, source, metric, value, unit.

    ``launch`` is the kernel's position in its report, so two launches of one kernel in
    one report stay apart.
    """
    import pandas as pd

    rows = []
    for kp in profiles:
        key = (kp.name, f"{kp.identity.range_index}:{kp.identity.action_index}", kp.identity.source)
        for metric, (value, unit) in kp.metrics.items():
            rows.append((*key, metric, value, unit))
    return pd.DataFrame(rows, columns=["kernel", "launch", "source", "metric", "value", "unit"])
