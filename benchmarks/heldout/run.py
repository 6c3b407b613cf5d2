"""Run the held-out workloads on a GPU, each under ``oomsight run --tape``: benchmarks/corpus/run.py's
loop (capped workloads on a thread pool, remedy runs for those not labelled ``none``, then the
full-device ones alone), pointed at ``workloads.py``.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/heldout/run.py --out DIR [--jobs 4] [--only a,b]
    python3 benchmarks/heldout/run.py --out DIR --bare      # without oomsight: only check outcomes/times
    PYTHONPATH=exporter python3 benchmarks/corpus/evaluate.py DIR    # judge the tapes (labels.json)
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

_spec = importlib.util.spec_from_file_location("corpus_run", os.path.join(HERE, "..", "corpus", "run.py"))
corpus = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(corpus)  # type: ignore[union-attr]

if __name__ == "__main__":
    sys.exit(corpus.main(script=os.path.join(HERE, "workloads.py")))
