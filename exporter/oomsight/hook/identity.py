"""Who this process is: rank, local rank and a unique id, from the launcher's environment."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Mapping

from oomsight._version import __version__
from oomsight.wire.schema import ProcessInfo

# torchrun / torch.distributed first, then SLURM and Open MPI launchers.
_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return default


def rank_of(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local_rank, world_size); a plain single process is (0, 0, 1)."""
    e = os.environ if env is None else env
    rank = _first_int(e, _RANK_VARS, 0)
    return rank, _first_int(e, _LOCAL_RANK_VARS, rank), _first_int(e, _WORLD_VARS, 1)


def describe_process(
    torch_version: str = "",
    cuda_version: str = "",
    allocator_backend: str = "native",
    expandable_segments: bool = False,
) -> ProcessInfo:
    rank, local_rank, world = rank_of()
    pid = os.getpid()
    return ProcessInfo(
        id=f"{pid}-{secrets.token_hex(4)}",
        pid=pid,
        hostname=socket.gethostname(),
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        started_at=time.time(),
        argv0=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
        torch_version=torch_version,
        cuda_version=cuda_version,
        oomsight_version=__version__,
        allocator_backend=allocator_backend,
        expandable_segments=expandable_segments,
    )
