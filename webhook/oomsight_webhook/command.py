"""``oomsight webhook``: registered with the ``oomsight`` command line through the
``oomsight.commands`` entry point (the library never imports this package). Each flag's help
names its variable and default from the webhook's settings table."""

from __future__ import annotations

import argparse
from typing import Any

from oomsight.config.table import flag_help
from oomsight.config.values import port_number
from oomsight.config.variables import WEBHOOK


def register(sub: Any) -> None:
    """Add the ``webhook`` subcommand to the ``oomsight`` parser's subparsers."""
    hook = sub.add_parser(
        "webhook",
        help="the Kubernetes admission webhook that injects the sidecar",
        description="Serve the sidecar-injecting admission webhook over HTTPS (settings: OOMSIGHT_WEBHOOK_*).",
        epilog="example: oomsight webhook --tls-mode files --port 21443",
    )
    hook.add_argument("--host", default=None, help=flag_help(WEBHOOK, "--host", "listen address of HTTPS and metrics"))
    hook.add_argument("--port", type=port_number, default=None, help=flag_help(WEBHOOK, "--port", "HTTPS port"))
    hook.add_argument(
        "--tls-mode",
        choices=("self", "files"),
        default=None,
        help=flag_help(WEBHOOK, "--tls-mode", "certificate source"),
    )
    hook.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from oomsight_webhook.main import main

    return main({"host": args.host, "port": args.port, "tls_mode": args.tls_mode})
