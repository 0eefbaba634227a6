"""A stand-in for `python -m perfscope.tune.worker`: the same JSON-lines protocol, no GPU.

It answers every task with the dry worker's synthetic ratio and misbehaves on purpose when
a task's parameters match one of these (JSON objects in the environment):

    FAKE_TUNE_CRASH   exit with code 11 mid-task (a segfaulting kernel)
    FAKE_TUNE_HANG    never answer (a deadlocked kernel)
    FAKE_TUNE_FATAL   answer an error with fatal=True, then exit (a broken CUDA context)

FAKE_TUNE_FAIL_START makes it refuse to start, as a worker on a GPU CuPy cannot use does.
Each outcome names the CUDA_VISIBLE_DEVICES its process was given.
"""

from __future__ import annotations

import json
import os
import sys
import time

from fakes.tune_fakes import FAKE_ENV, fake_timing, matches

from perfscope.manifest import ERROR, OK
from perfscope.tune.tasks import TrialOutcome, TrialTask, WorkerInfo
from perfscope.tune.worker import synthetic_ratio


def _patterns(name: str) -> list[dict]:
    text = os.environ.get(name)
    return [json.loads(text)] if text else []


def main() -> int:
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
    name = f"fake gpu {device}"

    def send(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    if os.environ.get("FAKE_TUNE_FAIL_START"):
        send({"error": "no GPU: CUDA reports no usable device (fake)"})
        return 3
    send({"hello": WorkerInfo(name, FAKE_ENV, 232448, "sm_90a").to_dict()})
    crash, hang, fatal = (_patterns(n) for n in ("FAKE_TUNE_CRASH", "FAKE_TUNE_HANG", "FAKE_TUNE_FATAL"))
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") == "exit":
            return 0
        task = TrialTask.from_dict(message["task"])
        if matches(task.params, crash):
            os._exit(11)
        if matches(task.params, hang):
            time.sleep(3600)
        if matches(task.params, fatal):
            send({"outcome": TrialOutcome(task.id, ERROR, "CUDA_ERROR_ILLEGAL_ADDRESS", worker=name,
                                          fatal=True).to_dict()})
            return 4
        ratio = synthetic_ratio(task.stage, task.params, task.shape)
        send({"outcome": TrialOutcome(task.id, OK, "", 0.0, fake_timing(task, ratio), 0.0, 0.0,
                                      name).to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
