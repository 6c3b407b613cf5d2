"""``oomsight demo`` without a GPU: the labelled replay through the real sidecar."""

import subprocess
import sys


def test_the_demo_replays_the_h200_run_labelled_and_prints_the_report():
    result = subprocess.run(
        [sys.executable, "-c", "from oomsight.tools import demo; demo.main(speed=50)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("REPLAY of a run recorded on an NVIDIA H200 (torch 2.11.0+cu130)") == 2
    assert "scraped /metrics" in out and "oomsight_oom_events_total" in out
    assert "rank 1 (local rank 1, world 2)" in out and "exited (oom)" in out
    assert "cause: leak" in out and "-> FATAL" in out
