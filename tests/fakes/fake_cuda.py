"""A stand-in for a CuPy CUDA event, for tests of timing code on a machine with no GPU."""

from __future__ import annotations


class DoneEvent:
    """A cupy.cuda.Event whose work is always done: record and synchronize do nothing."""

    done = True

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass
