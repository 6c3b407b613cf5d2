"""``benchmarks/bench_predict_real.py`` (issue 34, step 3): predicted peaks against real user programs.

On the GPU it measures ``model.generate()``, ``transformers.Trainer`` and an accelerate loop; here its
``--device cpu`` smoke runs every row's ``oomsight predict`` and its real program at tiny sizes, without
peaks: a check of the code paths the GPU run takes, not a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _bench() -> Any:
    """The script as a module (its imports of torch and transformers are inside its functions)."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    return importlib.import_module("bench_predict_real")


def test_every_row_is_a_command_oomsight_predict_accepts() -> None:
    """Each row's flags, at GPU and CPU sizes, pass ``oomsight predict``'s own parser and checks."""
    from oomsight.predict.job import job_from_args
    from oomsight.tools import predict_command as command

    bench = _bench()
    for name, row in bench.ROWS.items():
        for sized in (row, bench.tiny(row)):
            parser = argparse.ArgumentParser()
            command.add(parser.add_subparsers())
            args = parser.parse_args(["predict", *bench.predict_argv(sized)])
            assert job_from_args(args).batch >= 1, (name, bench.predict_argv(sized))  # InputError otherwise
        assert ("--generate" in bench.predict_argv(row)) == (row.program == "generate")
    real = [r for r in bench.ROWS.values() if not r.bnb]
    assert len(real) >= 5 and {r.program for r in real} == {"generate", "trainer", "accelerate"}
    assert bench.main(["--only", "no-such-row"]) == 2


def test_summary_keeps_emulated_rows_out_of_the_median() -> None:
    bench = _bench()

    def row(name: str, label: str, reserved: float) -> dict[str, Any]:
        return {"name": name, "label": label, "why": "", "error_allocated": 0.0, "error_reserved": reserved,
                "predicted": {}, "measured": {}}  # fmt: skip

    rows = [row(f"r{i}", "real", e) for i, e in enumerate((0.01, -0.02, 0.0, 0.03))]
    rows.append(row("e", "emulated", -0.5))
    rows.append({"name": "s", "label": "skipped", "why": "no PEFT", "predicted": {}, "measured": {}})
    summary = bench.summarize(rows, "cuda")
    assert summary["real"]["rows"] == 4 and summary["real"]["min_error_reserved"] == -0.02
    assert summary["emulated"]["rows"] == 1 and summary["emulated"]["min_error_reserved"] == -0.5
    assert summary["skipped"] == {"s": "no PEFT"} and summary["issue_34_met"] is True
    rows[0]["error_reserved"] = -0.06
    assert bench.summarize(rows, "cuda")["issue_34_met"] is False


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not importable: the real programs cannot run")
def test_cpu_smoke_runs_every_real_program(tmp_path: Any) -> None:
    bench = _bench()
    out = tmp_path / "predict-real.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "exporter"),
                                                                     os.environ.get("PYTHONPATH")]))}  # fmt: skip
    cmd = [sys.executable, os.path.join(BENCH, "bench_predict_real.py"), "--device", "cpu", "--in-process",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["rows"]] == list(bench.ROWS)
    for r in doc["rows"]:
        row = bench.ROWS[r["name"]]
        if r["label"] == "skipped":
            assert row.lora and "PEFT" in r["why"]
            continue
        assert r["label"] == ("emulated" if row.bnb and not bench.importable("bitsandbytes") else "real"), r
        assert r["predicted"]["peak_reserved_bytes"] >= r["predicted"]["peak_allocated_bytes"] > 0, r
        assert "error" not in r["measured"] and r["measured"]["peak_reserved_bytes"] is None, r
        if row.program == "generate":
            assert r["measured"]["generated_tokens"] == 8 and "model.generate()" in r["measured"]["program"]
        else:
            assert r["measured"]["optimizer_steps"] == row.steps, r
    assert doc["summary"]["real"] == {"rows": 0} and "issue_34_met" not in doc["summary"]
