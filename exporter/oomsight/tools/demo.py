"""``oomsight demo`` (what ``make demo`` runs).

With a CUDA GPU: trains a small model under ``oomsight run`` until a deliberate OOM
and prints the report. Without one: replays a tape recorded on an NVIDIA H200
through the real spool -> sidecar -> /metrics path, labelled as a replay, and prints
the same report.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Optional

from oomsight.tools import report, tape

TAPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "h200-demo.tape.jsonl.gz")
SHOWN = (
    "oomsight_torch_allocated_bytes",
    "oomsight_torch_reserved_bytes",
    "oomsight_oom_events_total",
    "oomsight_steps_total",
)


def main(speed: float = 4.0) -> int:
    if _gpu_name() is not None:
        return _live()
    return _replay(speed)


def _gpu_name() -> Optional[str]:
    try:
        import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except Exception:
        return None


def _live() -> int:
    from oomsight.tools.run import RunOptions, run

    print(f"== oomsight demo: LIVE on {_gpu_name()} ==", flush=True)
    rc = run(RunOptions([sys.executable, "-m", "oomsight.tools.demo_train"], port=0))
    print(f"demo: the training job exited with code {rc}; the CUDA OOM was deliberate.")
    return 0 if rc in (0, 1) else rc


def _replay(speed: float) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from oomsight.metrics.collector import SpoolCollector

    header, records = tape.read(TAPE)
    meta = header.get("meta", {})
    process: dict[str, Any] = next((r["doc"]["process"] for r in records if "process" in r["doc"]), {})
    banner = (
        f"== oomsight demo: REPLAY of a run recorded on {meta.get('gpu', 'an NVIDIA H200')} "
        f"(torch {process.get('torch_version', '?')}) -- no GPU here, this is not a live run =="
    )
    print(banner, flush=True)
    spool = tempfile.mkdtemp(prefix="oomsight-demo-")
    collector = SpoolCollector(spool)
    registry = CollectorRegistry()
    registry.register(collector)
    server = start_http_server(0, addr="127.0.0.1", registry=registry)[0]
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    print(f"serving the replayed spool at {url} ({len(records)} recorded writes, {speed:g}x speed)")
    done = threading.Event()

    def play() -> None:
        try:
            tape.replay(TAPE, spool, speed=speed)
        finally:
            done.set()

    player = threading.Thread(target=play, daemon=True)
    player.start()
    while not done.wait(2.0):
        _show(url)
    _show(url)
    server.shutdown()
    print(report.render(collector.inventory(), spool, title="oomsight memory report (REPLAY)"))
    print(banner)
    return 0


def _show(url: str) -> None:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    picked = [line for line in text.splitlines() if line.startswith(SHOWN)]
    print(f"[{time.strftime('%H:%M:%S')}] scraped /metrics:")
    for line in picked:
        print("   ", line)
