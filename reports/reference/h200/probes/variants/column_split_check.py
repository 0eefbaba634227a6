"""Verify the column split (STREAMK=4) against float64 at many shapes, in one process.

    PYTHONPATH=. python3 PROBES/variants/column_split_check.py OUT.json   (from a tree with
    column-split.patch applied)
"""

import json
import sys
import time
from pathlib import Path

from perfscope.kernels import get_spec
from perfscope.kernels.launch import prepare
from perfscope.kernels.spec import parse_shape
from perfscope.verify import verify

BASE = get_spec("hgemm_tma_wgmma_persistent")
CONFIGS = [dict(STREAMK=4), dict(STREAMK=4, STAGES=4, GROUP=4, BOXES=1, DEFER=1),
           dict(STREAMK=4, BOXES=2, STAGES=4)]
SHAPES = ["4096x4096x4096", "8192x8192x8192", "4000x4040x4096", "6144x6144x4096",
          "3968x4096x2048", "1000x8192x520", "4096x14336x4096", "8200x4104x136"]
# fp16 at every shape for the default configuration, at two for the others
FP16_SHAPES = ("4096x4096x4096", "4000x4040x4096")


def main() -> None:
    """Verify every configuration at every shape, one line per case."""
    rows = []
    for cfg in CONFIGS:
        spec = BASE.with_params(**cfg)
        for s in SHAPES:
            for d in ("bf16", "fp16"):
                if cfg is not CONFIGS[0] and d == "fp16" and s not in FP16_SHAPES:
                    continue
                t = time.time()
                try:
                    v = verify(prepare(spec, d, parse_shape(s)), 1)
                    row = dict(cfg=cfg, shape=s, dtype=d, verdict=v.verdict, err=v.rel_fro_error,
                               bad=v.bad_elements, detail=v.detail)
                except Exception as exc:   # a probe: record it and go on
                    row = dict(cfg=cfg, shape=s, dtype=d, verdict="error", detail=repr(exc)[:300])
                row["s"] = round(time.time() - t, 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
