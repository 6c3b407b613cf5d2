"""Run the ``oomsight`` command as a user does — a real process, its own ``$TMPDIR`` — and check
what reaches the user: no traceback, no ``[Errno N]``, no temporary folder left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

PY = sys.executable
OURS = ("oomsight-run-", "oomsight-startup-", "oomsight-demo-")
"""Prefixes of the temporary folders the commands make."""
TOLD_BADLY = ("Traceback (most recent call last)", "[Errno")
PEEKS = """
import torch


class Peeks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y.mean() if y.sum().item() > 0 else y.sum()


def spec():
    return {"build": Peeks, "batch": lambda n, device: torch.randn(n, 8, device=device)}
"""
"""A ``predict --module`` file whose step reads a tensor's value (``.item()``): it cannot be traced."""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    left: list[str]
    """Temporary folders of ours still in ``$TMPDIR`` after the command ended."""


def env_with_tmp(tmp: str, **extra: str) -> dict[str, str]:
    """The environment of a user whose ``$TMPDIR`` is ``tmp`` (so what is left there is ours)."""
    os.makedirs(tmp, exist_ok=True)
    return {**os.environ, "TMPDIR": tmp, **extra}


def left_in(tmp: str) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith(OURS))


def said_well(text: str) -> None:
    """Nothing of oomsight's insides reaches the user."""
    for bad in TOLD_BADLY:
        assert bad not in text, text


def oomsight(*args: str, tmp: str, env: Optional[dict[str, str]] = None, timeout: float = 120, **popen: Any) -> Result:
    """``oomsight ARGS`` to its end, as a user's shell runs it; checked with :func:`said_well`."""
    done = subprocess.run(
        [PY, "-m", "oomsight", *args],
        capture_output=True,
        text=True,
        env=env or env_with_tmp(tmp),
        timeout=timeout,
        **popen,
    )
    said_well(done.stderr)
    return Result(done.returncode, done.stdout, done.stderr, left_in(tmp))


def started(*args: str, tmp: str, env: Optional[dict[str, str]] = None) -> subprocess.Popen[str]:
    """``oomsight ARGS`` running in the background, its output on pipes, in a session of its own:
    no terminal, as under CI or a job runner, also when the tests run in one (a SIGINT sent to it
    is then never taken for a terminal's Ctrl-C)."""
    return subprocess.Popen(
        [PY, "-m", "oomsight", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or env_with_tmp(tmp),
        start_new_session=True,
    )


def with_stdout_closed(*args: str, tmp: str, stream: str = "stdout", timeout: float = 120) -> Result:
    """``oomsight ARGS | head -0``: the reader of ``stream`` has gone before the first write."""
    proc = subprocess.Popen(
        [PY, "-m", "oomsight", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_with_tmp(tmp),
    )
    closed, kept = (proc.stdout, proc.stderr) if stream == "stdout" else (proc.stderr, proc.stdout)
    assert closed is not None and kept is not None
    closed.close()
    other = kept.read()
    proc.wait(timeout)
    said_well(other)
    return Result(
        proc.returncode, other if stream == "stderr" else "", other if stream == "stdout" else "", left_in(tmp)
    )


def wait_for_line(proc: subprocess.Popen[str], stream: str, text: str, timeout: float = 60) -> list[str]:
    """Lines of ``proc``'s ``stream`` up to the first holding ``text``."""
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = pipe.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never came; saw {seen}")
