"""The ``oomsight`` command line.

oomsight run [--port N] [--spool DIR] -- python train.py ARGS
oomsight report [--html FILE] DIR
oomsight sidecar --spool DIR [--port N]
oomsight replay TAPE --spool DIR [--speed X]
oomsight demo
oomsight install-startup DIR
oomsight webhook [--port N] [--tls-mode self|files]
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Optional

from oomsight._version import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oomsight", description="See why PyTorch runs out of CUDA memory.")
    p.add_argument("--version", action="version", version=f"oomsight {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a command with the hook loaded; serve /metrics; print a report")
    run.add_argument("--port", type=int, default=None, help="metrics port on localhost (default 21400; 0 picks one)")
    run.add_argument("--host", default="127.0.0.1", help="metrics address (default 127.0.0.1)")
    run.add_argument("--spool", default=None, help="spool directory (default: a new temporary one)")
    run.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    run.add_argument("--tape", default=None, help="also record the spool into this tape file")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")

    rep = sub.add_parser("report", help="print the memory report of a spool directory")
    rep.add_argument("spool")
    rep.add_argument("--html", metavar="FILE", default=None, help="write a self-contained HTML report (with charts)")
    rep.add_argument(
        "--retention-seconds",
        type=float,
        default=10 * 365 * 86400.0,
        help="ignore processes that exited longer ago than this (default: keep all)",
    )

    rp = sub.add_parser("replay", help="replay a recorded spool tape into a spool directory")
    rp.add_argument("tape")
    rp.add_argument("--spool", required=True)
    rp.add_argument("--speed", type=float, default=1.0, help="time factor (10 = ten times faster)")

    prof = sub.add_parser("profile", help="profile the next N optimizer steps of every process of a spool")
    prof.add_argument("--spool", required=True, help="the spool of the running job (oomsight run prints it)")
    prof.add_argument("--steps", type=int, default=5)
    prof.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the results and print them")
    prof.add_argument(
        "--memory-only",
        action="store_true",
        help="trace no CUDA time: CUPTI is never attached, so the job is not slower after the window",
    )

    sub.add_parser("demo", help="the main job: live on a GPU, a labelled replay of an H200 run otherwise")

    inst = sub.add_parser("install-startup", help="copy the zero-code startup folder (for an init container)")
    inst.add_argument("folder")

    _add_plugins(sub)
    return p


PLUGIN_GROUP = "oomsight.commands"
"""Entry points that add subcommands; the sidecar and webhook packages register theirs here."""
PLUGIN_EXTRAS = {"sidecar": "sidecar", "webhook": "sidecar"}
"""Subcommands of the distribution's other packages, and the extra that installs what they need."""


def _add_plugins(sub: Any) -> None:
    found = set()
    for ep in _entry_points(PLUGIN_GROUP):
        try:
            ep.load()(sub)
            found.add(ep.name)
        except Exception as exc:  # a broken plugin must not break the other commands
            logging.getLogger(__name__).debug("oomsight: command %s not loaded: %r", ep.name, exc)
    for name, extra in PLUGIN_EXTRAS.items():
        if name not in found:
            missing = sub.add_parser(name, help=f"(not installed: pip install 'oomsight[{extra}]')")
            missing.set_defaults(handler=_not_installed(name, extra))


def _entry_points(group: str) -> list[Any]:
    from importlib.metadata import entry_points

    eps: Any = entry_points()
    return list(eps.select(group=group) if hasattr(eps, "select") else eps.get(group, []))


def _not_installed(name: str, extra: str) -> Any:
    def handler(_args: argparse.Namespace) -> int:
        print(f"oomsight {name}: not installed here; pip install 'oomsight[{extra}]'", file=sys.stderr)
        return 2

    return handler


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "run":
        return _run(args)
    if args.command == "report":
        return _report(args)
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    if args.command == "replay":
        from oomsight.tools import tape

        tape.replay(args.tape, args.spool, speed=args.speed)
        return 0
    if args.command == "profile":
        return _profile(args)
    if args.command == "demo":
        from oomsight.tools import demo

        return demo.main()
    if args.command == "install-startup":
        from oomsight.hook import startup

        print(startup.install(args.folder, copy=True))
        return 0
    return 2


def _run(args: argparse.Namespace) -> int:
    from oomsight.tools.run import DEFAULT_PORT, RunOptions, run

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("oomsight run: give the command after --, e.g. oomsight run -- python train.py", file=sys.stderr)
        return 2
    port = DEFAULT_PORT if args.port is None else args.port
    return run(
        RunOptions(cmd, port=port, host=args.host, spool_dir=args.spool, report=not args.no_report, tape=args.tape)
    )


def _report(args: argparse.Namespace) -> int:
    import os
    import time

    from oomsight.analysis.inventory import take_inventory
    from oomsight.tools import report
    from oomsight.wire.spool import SpoolReader

    if not os.path.isdir(args.spool):
        print(f"oomsight report: {args.spool} is not a directory", file=sys.stderr)
        return 2
    if args.html:
        return _report_html(args)
    inv = take_inventory(SpoolReader(args.spool).read(), time.time(), retention_seconds=args.retention_seconds)
    sys.stdout.write(report.render(inv, args.spool))
    return 0


def _profile(args: argparse.Namespace) -> int:
    import json
    import time

    from oomsight.analysis.profile_plan import submit
    from oomsight.wire.spool import SpoolReader

    result = submit(args.spool, args.steps, cuda_time=not args.memory_only)
    print(json.dumps(result.body))
    if not result.accepted:
        return 1
    deadline = time.time() + args.wait
    rid, expected = result.body["id"], result.body["processes"]
    while time.time() < deadline:
        done = [p for p in SpoolReader(args.spool).read().profiles if p["request_id"] == rid]
        if len(done) >= expected:
            for p in sorted(done, key=lambda d: d["process"]["rank"]):
                print(
                    f"rank {p['process']['rank']}: steps {p['start_step'] + 1}-{p['start_step'] + p['steps']}, "
                    f"top operators by self CUDA memory:"
                )
                for op in p["top_by_memory"][:5]:
                    print(f"  {op['op']:40s} {op['self_cuda_memory_bytes']:>14d} B  {op['calls']:>6d} calls")
            return 0
        time.sleep(0.2)
    return 0 if not args.wait else 3


def _report_html(args: argparse.Namespace) -> int:
    import time

    try:
        from oomsight.tools import report_html
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        print("oomsight report --html needs matplotlib: pip install 'oomsight[report]'", file=sys.stderr)
        return 1
    page = report_html.build(args.spool, time.time(), args.retention_seconds)
    try:
        report_html.write(args.html, page)
    except OSError as exc:
        print(f"oomsight report: cannot write {args.html}: {exc}", file=sys.stderr)
        return 1
    print(f"oomsight report: wrote {args.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
