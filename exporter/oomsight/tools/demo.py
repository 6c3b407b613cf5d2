"""``oomsight demo`` (what ``make demo`` runs).

With a CUDA GPU: trains a small model under ``oomsight run`` until a deliberate OOM
and prints the report. Without one: replays a tape recorded on an NVIDIA H200
through the real spool -> sidecar -> /metrics path, labelled as a replay, and prints
the same report. ``--keep`` keeps the replayed spool for ``oomsight report``; otherwise it
goes, whatever ends the demo (Ctrl-C, a closed pipe).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from typing import Any, Optional

from oomsight.analysis.units import format_bytes
from oomsight.tools import report, tape

TAPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "h200-demo.tape.jsonl.gz")
REPLAY_LABEL = "oomsight-demo-replay.txt"
"""A file at the top of a replayed spool (the spool's readers look only into its subfolders): the
replay's banner, which ``oomsight report`` prints again for a kept spool."""
SHOWN = (
    "oomsight_torch_allocated_bytes",
    "oomsight_torch_reserved_bytes",
    "oomsight_oom_events_total",
    "oomsight_steps_total",
)


def main(speed: float = 4.0, keep: bool = False) -> int:
    """Run the demo; ``keep`` keeps its spool and prints the report commands for it."""
    if _gpu_name() is not None:
        return _live(keep)
    return _replay(speed, keep)


def _gpu_name() -> Optional[str]:
    try:
        with warnings.catch_warnings():  # torch without numpy warns at import; the demo needs no numpy
            warnings.simplefilter("ignore")
            import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except Exception:
        return None


def _live(keep: bool) -> int:
    from oomsight.tools.run import RunOptions, run

    print(f"== oomsight demo: LIVE on {_gpu_name()} ==", flush=True)
    spool = tempfile.mkdtemp(prefix="oomsight-demo-") if keep else None
    rc = run(RunOptions([sys.executable, "-m", "oomsight.tools.demo_train"], port=0, spool_dir=spool))
    print(f"demo: the training job exited with code {rc}; the CUDA OOM was deliberate.")
    if spool is not None:
        print(kept_notice(spool))
    return 0 if rc in (0, 1) else rc


def replay_label(spool: str) -> Optional[str]:
    """The line that labels a spool the demo replayed into (kept with ``--keep``), else None."""
    try:
        with open(os.path.join(spool, REPLAY_LABEL)) as fh:
            return f"== {fh.read().strip()} =="
    except OSError:
        return None


def kept_notice(spool: str) -> str:
    """What ``--keep`` prints: where the spool is and the two report commands for it."""
    return (
        f"demo: kept the spool {spool}; read it again with\n"
        f"  oomsight report {spool}\n"
        f"  oomsight report --html oomsight-demo.html {spool}   # needs pip install 'oomsight[report]'"
    )


def _replay(speed: float, keep: bool) -> int:
    header, records = tape.read(TAPE)
    meta = header.get("meta", {})
    process: dict[str, Any] = next((r["doc"]["process"] for r in records if "process" in r["doc"]), {})
    banner = (
        f"== oomsight demo: REPLAY of a run recorded on {meta.get('gpu', 'an NVIDIA H200')} "
        f"(torch {process.get('torch_version', '?')}) -- no GPU here, this is not a live run =="
    )
    spool = tempfile.mkdtemp(prefix="oomsight-demo-")
    with open(os.path.join(spool, REPLAY_LABEL), "w") as fh:  # `oomsight report` of a kept spool says so too
        fh.write(banner.strip("= ") + "\n")
    try:
        print(banner, flush=True)
        _serve_replay(spool, len(records), speed)
        print(banner)
        if keep:
            print(kept_notice(spool))
    finally:
        if not keep:
            shutil.rmtree(spool, ignore_errors=True)
    return 0


def _serve_replay(spool: str, writes: int, speed: float) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from oomsight.metrics.collector import SpoolCollector

    collector = SpoolCollector(spool)
    registry = CollectorRegistry()
    registry.register(collector)
    server = start_http_server(0, addr="127.0.0.1", registry=registry)[0]
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    print(f"serving the replayed spool at {url} ({writes} recorded writes, {speed:g}x speed)", flush=True)
    print(f"({tape.replay_note(speed)})")
    done = threading.Event()
    stop = threading.Event()

    def play() -> None:
        try:
            tape.replay(TAPE, spool, speed=speed, on_record=lambda _rec: _stop_if(stop))
        except _Stopped:
            pass
        finally:
            done.set()

    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        while not done.wait(2.0):
            _show(url)
        _show(url)
        print(report.render(collector.inventory(), spool, title="oomsight memory report (REPLAY)"))
    finally:
        stop.set()
        player.join()  # no write into the spool after it is removed
        server.shutdown()
        server.server_close()


class _Stopped(Exception):
    """The demo ended early (Ctrl-C, a closed pipe): the replay stops writing."""


def _stop_if(stop: threading.Event) -> None:
    if stop.is_set():
        raise _Stopped


def _show(url: str) -> None:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    print(f"[{time.strftime('%H:%M:%S')}] scraped {url}:")
    for line in scraped_lines(text):
        print("   ", line)


def scraped_lines(exposition: str) -> list[str]:
    """One line per rank and device of the scraped values people read: bytes in MiB/GiB,
    counts as whole numbers (the metric names stay, so they can be looked up)."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in SHOWN:
                key = (sample.labels.get("rank", ""), sample.labels.get("device", ""))
                rows.setdefault(key, {})[sample.name] = sample.value
    steps = {rank: vals[SHOWN[3]] for (rank, device), vals in rows.items() if not device and SHOWN[3] in vals}
    out = []
    for (rank, device), values in sorted(rows.items()):
        if not device:
            continue
        parts = [f"rank {rank} cuda:{device}"]
        for name in SHOWN[:2]:
            if name in values:
                parts.append(f"{_short(name)} {format_bytes(values[name])}")
        if SHOWN[2] in values:
            parts.append(f"{_short(SHOWN[2])} {int(values[SHOWN[2]])}")
        if rank in steps:
            parts.append(f"{_short(SHOWN[3])} {int(steps[rank])}")
        out.append(", ".join(parts))
    return out


def _short(name: str) -> str:
    """``oomsight_torch_allocated_bytes`` -> ``torch allocated`` (the words of the metric name)."""
    words = name.removeprefix("oomsight_").split("_")
    return " ".join(w for w in words if w not in ("bytes", "total"))
