"""``oomsight sidecar``: registered with the ``oomsight`` command line through the
``oomsight.commands`` entry point (the library never imports this package). Each flag's help
names its variable and default from the sidecar's settings table."""

from __future__ import annotations

import argparse
from typing import Any

from oomsight.config.table import flag_help
from oomsight.config.values import port_number
from oomsight.config.variables import SIDECAR


def register(sub: Any) -> None:
    """Add the ``sidecar`` subcommand to the ``oomsight`` parser's subparsers."""
    side = sub.add_parser(
        "sidecar",
        help="serve a spool directory as Prometheus metrics",
        description="Serve a spool directory as Prometheus metrics, with /healthz and /readyz.",
        epilog="example: oomsight sidecar --spool /var/run/oomsight --port 21400",
    )
    side.add_argument("--spool", default=None, help=flag_help(SIDECAR, "--spool", "spool directory"))
    side.add_argument("--port", type=port_number, default=None, help=flag_help(SIDECAR, "--port", "metrics port"))
    side.add_argument("--host", default=None, help=flag_help(SIDECAR, "--host", "listen address"))
    for flag, text in (
        ("--retention-seconds", "how long an exited process's series stay"),
        ("--stale-after-seconds", "a process silent this long is treated as gone"),
        ("--drain-seconds", "after SIGTERM keep serving this long for a last scrape"),
    ):
        side.add_argument(flag, type=float, default=None, help=flag_help(SIDECAR, flag, text))
    side.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from oomsight_sidecar.main import main

    return main(
        {
            "spool_dir": args.spool,
            "port": args.port,
            "host": args.host,
            "retention_seconds": args.retention_seconds,
            "stale_after_seconds": args.stale_after_seconds,
            "drain_seconds": args.drain_seconds,
        }
    )
