"""``oomsight demo`` without a GPU: the labelled replay through the real sidecar."""

import subprocess
import sys

from clirun import said_well


def test_the_demo_replays_the_h200_run_labelled_and_prints_the_report():
    result = subprocess.run(
        [sys.executable, "-c", "from oomsight.tools import demo; demo.main(speed=50)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    said_well(result.stderr)  # no traceback, no [Errno N], no warning of torch's (the demo needs no numpy)
    assert result.stderr == ""
    out = result.stdout
    assert out.count("REPLAY of a run recorded on an NVIDIA H200 (torch 2.11.0+cu130)") == 2
    scraped = [line.strip() for line in out.splitlines() if line.startswith("    rank ")]
    assert "rank 1 cuda:0, torch allocated 6.86 GiB, torch reserved 6.97 GiB, oom events 1, steps 1980" in scraped
    assert not [line for line in out.splitlines() if "e+0" in line], "numbers people read, not 1.34283264e+08"
    assert "rank 1 (local rank 1, world 2)" in out and "exited (oom)" in out
    assert "cause: leak" in out and "-> FATAL" in out
    assert "oomsight profile" not in out  # nothing to profile in a replay


def test_scraped_values_are_shown_in_binary_units_per_rank_and_device():
    from oomsight.tools.demo import scraped_lines

    text = "\n".join(
        [
            'oomsight_torch_allocated_bytes{device="0",gpu_uuid="G",local_rank="0",rank="0"} 1.34283264e+08',
            'oomsight_torch_reserved_bytes{device="0",gpu_uuid="G",local_rank="0",rank="0"} 2.147483648e+09',
            'oomsight_oom_events_total{device="0",gpu_uuid="G",local_rank="0",rank="0"} 2.0',
            'oomsight_steps_total{local_rank="0",rank="0"} 12.0',
            "",
        ]
    )
    assert scraped_lines(text) == [
        "rank 0 cuda:0, torch allocated 128.06 MiB, torch reserved 2.00 GiB, oom events 2, steps 12"
    ]
