"""``oomsight sidecar``: registered with the ``oomsight`` command line through the
``oomsight.commands`` entry point (the library never imports this package)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add the ``sidecar`` subcommand to the ``oomsight`` parser's subparsers."""
    side = sub.add_parser(
        "sidecar",
        help="serve a spool directory as Prometheus metrics",
        description="Serve a spool directory as Prometheus metrics, with /healthz and /readyz.",
        epilog="example: oomsight sidecar --spool /var/run/oomsight --port 21400",
    )
    side.add_argument("--spool", default=None, help="spool directory (default $OOMSIGHT_DIR)")
    side.add_argument("--port", type=int, default=None, help="metrics port (default 21400)")
    side.add_argument("--host", default=None, help="listen address (default 127.0.0.1; injected pods: 0.0.0.0)")
    side.add_argument(
        "--retention-seconds",
        type=float,
        default=None,
        help="how long an exited process's series stay (default 300)",
    )
    side.add_argument(
        "--stale-after-seconds",
        type=float,
        default=None,
        help="a process silent this long is treated as gone (default 30)",
    )
    side.add_argument(
        "--drain-seconds",
        type=float,
        default=None,
        help="after SIGTERM keep serving this long for a last scrape (default 0)",
    )
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
