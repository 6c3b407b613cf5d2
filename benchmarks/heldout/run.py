"""Run the held-out workloads on a GPU, each under ``oomsight run --tape``, like benchmarks/corpus/run.py.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/heldout/run.py --out DIR [--jobs 4] [--only a,b]
    python3 benchmarks/heldout/run.py --out DIR --bare      # without oomsight: only check outcomes/times

The loop (capped workloads on a thread pool, remedy runs for those not labelled ``none``, then the
full-device ones alone) is benchmarks/corpus/run.py's ``main``; this file only points it at
``workloads.py``: the list, the command line of one run, and the workloads that must run alone.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "workloads.py")
FULL_DEVICE_LABELS = ("other_process", "non_pytorch_memory")

_spec = importlib.util.spec_from_file_location("corpus_run", os.path.join(HERE, "..", "corpus", "run.py"))
corpus = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(corpus)  # type: ignore[union-attr]


def workloads() -> list[tuple[str, str, str]]:
    out = subprocess.run([sys.executable, SCRIPT, "--list"], capture_output=True, text=True, check=True)
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]  # type: ignore[misc]


class _Subprocess:
    """corpus/run.py's ``subprocess`` seen through a lens: its scenarios.py command becomes workloads.py
    (and, with --bare, the ``oomsight run ... --`` prefix is dropped)."""

    bare = False

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(subprocess, name)

    def run(self, cmd, **kw):  # type: ignore[no-untyped-def]
        cmd = [SCRIPT if os.path.basename(c) == "scenarios.py" else c for c in cmd]
        if self.bare and "--" in cmd:
            cmd = cmd[cmd.index("--") + 1:]
        return subprocess.run(cmd, **kw)


def main() -> int:
    lens = _Subprocess()
    if "--bare" in sys.argv:
        sys.argv.remove("--bare")
        lens.bare = True
    found = workloads()
    corpus.subprocess = lens
    corpus.scenarios = lambda: found
    corpus.ALONE = tuple(n for n, label, _key in found if label in FULL_DEVICE_LABELS)
    return int(corpus.main())


if __name__ == "__main__":
    sys.exit(main())
