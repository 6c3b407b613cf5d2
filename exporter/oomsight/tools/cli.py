"""The ``oomsight`` command line (``docs/cli.md``: every subcommand, its exit codes).

A user's mistake (a missing spool, tape or script, a busy port) is one line on stderr
and a documented exit code (``oomsight.tools.exitcode``), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import socket
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Optional

from oomsight._version import __version__
from oomsight.config.values import port_number
from oomsight.tools import exitcode

EXAMPLES = {
    "run": "examples:\n  oomsight run -- python train.py --lr 3e-4\n  oomsight run --port 0 --tape run.tape -- "
    "torchrun --nproc_per_node=8 train.py",
    "report": "examples:\n  oomsight report /tmp/oomsight\n  oomsight report --html report.html /tmp/oomsight",
    "replay": "example:\n  oomsight replay run.tape --spool /tmp/replayed --speed 10",
    "profile": "examples:\n  oomsight profile --spool /tmp/oomsight-run-abc --steps 5 --wait 60\n"
    "  oomsight profile --spool SPOOL --memory-only --json",
    "demo": "examples:\n  oomsight demo\n  oomsight demo --keep   # then oomsight report SPOOL (it prints the command)",
    "install-startup": "example:\n  oomsight install-startup /startup   # then PYTHONPATH=/startup python train.py",
}
KEEP_ALL_SECONDS = 10 * 365 * 86400.0
PORT_HINTS = {
    "run": "; choose another with --port N (0 picks one)",
    "sidecar": "; choose another with --port N (the admin endpoint's 21401 being taken only turns it off)",
    "webhook": "; choose another with --port N (its metrics port: OOMSIGHT_WEBHOOK_METRICS_PORT, 0 turns it off)",
}


def seconds_at_least_zero(text: str) -> float:
    """A duration in seconds that is not negative (``--retention-seconds``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more seconds")
    return value


def _subparser(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="oomsight",
        description="See why PyTorch runs out of CUDA memory.",
        epilog="exit codes and every subcommand: docs/cli.md",
    )
    p.add_argument("--version", action="version", version=f"oomsight {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    rep = _subparser(sub, "report", "print the memory report of a spool directory")
    rep.add_argument("spool", help="the spool directory (OOMSIGHT_DIR of the job; oomsight run prints it)")
    rep.add_argument("--html", metavar="FILE", default=None, help="write a self-contained HTML report with charts")
    rep.add_argument(
        "--retention-seconds",
        type=seconds_at_least_zero,
        default=KEEP_ALL_SECONDS,
        help="leave out processes that exited longer ago than this (default: keep all)",
    )
    rp = _subparser(sub, "replay", "replay a recorded spool tape into a spool directory")
    rp.add_argument("tape", help="a tape file written by oomsight run --tape")
    rp.add_argument("--spool", required=True, help="the spool directory to write into (created if missing)")
    rp.add_argument("--speed", type=float, default=1.0, help="time factor, 10 = ten times faster (default 1)")
    _add_profile(sub)
    from oomsight.tools import predict_command as predict

    predict.add(sub)
    from oomsight.tools import recommend

    recommend.add(sub)
    demo = _subparser(sub, "demo", "the main job: live on a GPU, a labelled replay of an H200 run otherwise")
    demo.add_argument("--keep", action="store_true", help="keep the demo's spool and print the report commands for it")
    demo.add_argument(
        "--speed", type=float, default=4.0, help="replay speed without a GPU, 10 = ten times faster (default 4)"
    )
    inst = _subparser(sub, "install-startup", "copy the zero-code startup folder (for an init container)")
    inst.add_argument("folder", help="where to put sitecustomize.py and the oomsight package (created if missing)")
    _add_plugins(sub)
    return p


def _add_run(sub: Any) -> None:
    run = _subparser(sub, "run", "run a command with the hook loaded; serve /metrics; print a report")
    run.add_argument(
        "--port",
        type=port_number,
        default=None,
        help="metrics port on localhost (default 21400, or a free one if it is busy; 0 picks a free one)",
    )
    run.add_argument("--host", default="127.0.0.1", help="metrics address (default 127.0.0.1)")
    run.add_argument("--spool", default=None, help="spool directory, kept (default: a temporary one, removed)")
    run.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    run.add_argument("--tape", default=None, help="also record the spool into this tape file (default: none)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")


def _add_profile(sub: Any) -> None:
    prof = _subparser(sub, "profile", "profile the next N optimizer steps of every process of a spool")
    prof.add_argument("--spool", required=True, help="the spool of the running job (oomsight run prints it)")
    prof.add_argument("--steps", type=int, default=5, help="optimizer steps in the window, 1 to 100 (default 5)")
    prof.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the results (default 0: do not)")
    prof.add_argument(
        "--memory-only",
        action="store_true",
        help="trace no CUDA time: CUPTI is never attached, so the job is not slower after the window",
    )
    prof.add_argument("--json", action="store_true", help="print JSON lines on stdout instead of prose")


PLUGIN_GROUP = "oomsight.commands"
"""Entry points that add subcommands; the sidecar and webhook packages register theirs here."""
PLUGIN_EXTRAS = {"sidecar": "sidecar", "webhook": "sidecar"}
"""Subcommands of the distribution's other packages, and the extra that installs what they need."""
EXTRA_MODULES = {"predict": ("predict", ("torch", "transformers", "yaml"))}
"""Subcommands of the library that import an extra's packages when they run, and which packages: one of
them missing (``pip install .`` has no torch) is one line naming the extra, not a traceback."""


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
        return exitcode.USAGE

    return handler


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return _dispatch(args)
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        print(f"oomsight {args.command}: interrupted", file=sys.stderr)
        return exitcode.INTERRUPTED
    except OSError as exc:  # the environment said no (a port, permissions, a full disk): say what, not where
        if exc.errno == errno.EADDRINUSE:
            where = f"port {exc.filename}" if exc.filename else "a port it needs"
            print(f"oomsight {args.command}: {where} is in use{PORT_HINTS.get(args.command, '')}", file=sys.stderr)
            return exitcode.PORT_BUSY
        print(f"oomsight {args.command}: {os_error(exc)}", file=sys.stderr)
        return exitcode.REFUSED


def os_error(exc: OSError) -> str:
    """An ``OSError`` in words, without ``[Errno N]``: ``PATH: Permission denied``."""
    what = exc.strerror or str(exc)
    return f"{exc.filename}: {what}" if exc.filename else what


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly; stdout is pointed at /dev/null so
    that Python's own flush at exit does not complain about the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (tests): nothing to redirect
        pass
    return exitcode.BROKEN_PIPE


def _folder_argument(command: str, flag: str, path: Optional[str]) -> Optional[str]:
    """The line that refuses a folder argument naming an existing file, else None."""
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        return f"oomsight {command}: {flag}{path} is a file, not a folder"
    return None


def _dispatch(args: argparse.Namespace) -> int:
    handler = getattr(args, "handler", None)
    if handler is not None:
        try:
            with _quiet_transformers() if args.command == "predict" else contextlib.nullcontext():
                return int(handler(args))
        except ModuleNotFoundError as exc:  # what the install lacks (webhook: cryptography; predict: torch)
            extra = _extra_for(args.command, exc.name or "")
            if extra is None:
                raise  # a module of ours missing is a broken install, not a missing extra
            missing = (exc.name or "").partition(".")[0]
            print(f"oomsight {args.command}: needs {missing}, not installed here; pip install 'oomsight[{extra}]'",
                  file=sys.stderr)  # fmt: skip
            return exitcode.USAGE
    commands = {
        "run": _run,
        "report": _report,
        "replay": _replay,
        "profile": _profile,
        "demo": _demo,
        "install-startup": _install_startup,
    }
    return commands[args.command](args)


TRANSFORMERS_NOTICES = r".*(gradient_checkpointing_enable|is deprecated|will be removed)"
"""FutureWarnings and DeprecationWarnings about the calls predict makes into transformers, not the user."""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own notices about what ``oomsight predict`` does with it (``loss_type=None`` was set
    in the config, ``gradient_checkpointing_enable`` is deprecated) kept off stderr while predict runs:
    nothing there is the user's to act on. Through transformers' verbosity (``TRANSFORMERS_VERBOSITY``,
    read at its first import, and its library logger's level, what ``set_verbosity_error`` sets where it was
    imported before) and a warnings filter; all as they were afterwards. Errors still show."""
    logger = logging.getLogger("transformers")
    level, env = logger.level, os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", TRANSFORMERS_NOTICES, category, r"transformers(\.|$)")
                warnings.filterwarnings("ignore", r".*gradient_checkpointing_enable", category)
            yield
    finally:
        logger.setLevel(level)
        if env is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = env


def _extra_for(command: str, module: str) -> Optional[str]:
    """The extra that installs ``module`` for ``command``, else None: then the error is not a missing extra
    (a module of ours: a broken install; a package that is installed: a part of it failed)."""
    import importlib.util

    top = module.partition(".")[0]
    if not top or top.startswith("oomsight") or importlib.util.find_spec(top) is not None:
        return None
    if command in EXTRA_MODULES:
        extra, modules = EXTRA_MODULES[command]
        return extra if top in modules else None
    return PLUGIN_EXTRAS.get(command)


def _run(args: argparse.Namespace) -> int:
    from oomsight.tools.run import DEFAULT_PORT, RunOptions, missing_script, run, unstartable

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("oomsight run: give the command after --, e.g. oomsight run -- python train.py", file=sys.stderr)
        return exitcode.USAGE
    script = missing_script(cmd)
    if script is not None:
        print(f"oomsight run: {script}: no such script", file=sys.stderr)
        return exitcode.USAGE
    why = unstartable(cmd)
    if why is not None:
        print(f"oomsight run: cannot start {cmd[0]!r}: {why}", file=sys.stderr)
        return exitcode.CANNOT_START
    problem = _folder_argument("run", "--spool ", args.spool)
    if problem:
        print(problem, file=sys.stderr)
        return exitcode.USAGE
    if args.tape and not os.path.isdir(os.path.dirname(os.path.abspath(args.tape))):
        print(f"oomsight run: {args.tape}: its folder does not exist", file=sys.stderr)
        return exitcode.USAGE
    port = DEFAULT_PORT if args.port is None else args.port
    if args.port and _port_taken(args.host, port):  # before the spool line: a busy --port N is one line
        raise OSError(errno.EADDRINUSE, "in use", f"{port} on {args.host}")
    opts = RunOptions(
        cmd,
        port=port,
        host=args.host,
        spool_dir=args.spool,
        report=not args.no_report,
        tape=args.tape,
        port_fallback=args.port is None,
    )
    return run(opts)


def _report(args: argparse.Namespace) -> int:
    import time

    from oomsight.analysis.inventory import take_inventory
    from oomsight.tools import demo, report, tape
    from oomsight.wire.spool import SpoolReader

    if not os.path.isdir(args.spool):
        print(f"oomsight report: {args.spool} is not a directory", file=sys.stderr)
        return exitcode.USAGE
    if not _is_spool(args.spool):
        print(f"oomsight report: {args.spool} is not a spool (no snapshots/ or events/ folder in it): give the "
              "spool oomsight run printed, or the job's OOMSIGHT_DIR", file=sys.stderr)  # fmt: skip
        return exitcode.USAGE
    if args.html:
        return _report_html(args)
    inv = take_inventory(SpoolReader(args.spool).read(), time.time(), retention_seconds=args.retention_seconds)
    # a spool the demo kept from its replay, or any replay's, says so again
    labels = [line for line in (demo.replay_label(args.spool), tape.replayed(args.spool)) if line]
    sys.stdout.write("".join(line + "\n" for line in labels) + report.render(inv, args.spool))
    return exitcode.OK


def _is_spool(folder: str) -> bool:
    """Whether ``folder`` is a spool: one of its folders or a replay's label is in it, or it is empty (a job
    that has written nothing yet). Any other folder (``/tmp``, a home) is a mistyped path, not a job without
    data."""
    from oomsight.tools import demo, tape
    from oomsight.wire.layout import SUBDIRS

    names = os.listdir(folder)
    ours = {demo.REPLAY_LABEL, tape.REPLAY_NOTE}
    return not names or any(n in ours or (n in SUBDIRS and os.path.isdir(os.path.join(folder, n))) for n in names)


def _replay(args: argparse.Namespace) -> int:
    from oomsight.tools import tape
    from oomsight.tools.progress import Progress

    if os.path.isdir(args.tape):
        print(f"oomsight replay: {args.tape} is a folder, not a tape (a file oomsight run --tape wrote)",
              file=sys.stderr)  # fmt: skip
        return exitcode.USAGE
    if not os.path.isfile(args.tape):
        print(f"oomsight replay: {args.tape}: no such tape", file=sys.stderr)
        return exitcode.USAGE
    try:
        _header, records = tape.read(args.tape)
    except tape.TapeError as exc:
        print(f"oomsight replay: {exc}", file=sys.stderr)
        return exitcode.USAGE
    if args.speed <= 0:
        print("oomsight replay: --speed must be above 0", file=sys.stderr)
        return exitcode.USAGE
    problem = _folder_argument("replay", "--spool ", args.spool)
    if problem:
        print(problem, file=sys.stderr)
        return exitcode.USAGE
    total, written = len(records), 0
    length = float(records[-1]["t"]) / args.speed if records else 0.0
    progress = Progress()

    def shown(rec: dict[str, Any]) -> None:
        nonlocal written
        written += 1
        at = float(rec["t"]) / args.speed
        text = f"replaying {args.tape}: {written}/{total} writes, {at:.0f} of {length:.0f} s"
        progress.update(text, force=written == total)

    try:
        count = tape.replay(args.tape, args.spool, speed=args.speed, on_record=shown)
    except tape.TapeError as exc:
        progress.done()
        print(f"oomsight replay: {exc}", file=sys.stderr)
        return exitcode.USAGE
    finally:
        progress.done()  # also on Ctrl-C: the next line starts clean
    print(f"oomsight replay: wrote {count} documents into {args.spool}", file=sys.stderr)
    if args.speed != 1.0:
        print(f"oomsight replay: {tape.replay_note(args.speed)}", file=sys.stderr)
    return exitcode.OK


def _port_taken(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` is taken now (the server binds it again a moment later)."""
    try:
        with socket.create_server((host, port)):
            return False
    except OSError as exc:  # another error (an unknown host) is the server's to report
        return exc.errno == errno.EADDRINUSE


def _profile(args: argparse.Namespace) -> int:
    from oomsight.tools import profile_request

    cmd = profile_request.ProfileCommand(
        args.spool, steps=args.steps, wait_seconds=args.wait, memory_only=args.memory_only, json=args.json
    )
    return profile_request.run(cmd, sys.stdout, sys.stderr)


def _demo(args: argparse.Namespace) -> int:
    from oomsight.tools import demo

    if args.speed <= 0:
        print("oomsight demo: --speed must be above 0", file=sys.stderr)
        return exitcode.USAGE
    return demo.main(speed=args.speed, keep=args.keep)


def _install_startup(args: argparse.Namespace) -> int:
    from oomsight.hook import startup

    problem = _folder_argument("install-startup", "", args.folder)
    if problem:
        print(problem, file=sys.stderr)
        return exitcode.USAGE
    print(startup.install(args.folder, copy=True))
    return exitcode.OK


def _report_html(args: argparse.Namespace) -> int:
    import time

    try:
        from oomsight.tools import report_html
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        print("oomsight report --html needs matplotlib: pip install 'oomsight[report]'", file=sys.stderr)
        return exitcode.USAGE
    page = report_html.build(args.spool, time.time(), args.retention_seconds)
    try:
        report_html.write(args.html, page)
    except OSError as exc:
        print(f"oomsight report: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
        return exitcode.REFUSED
    print(f"oomsight report: wrote {args.html}", file=sys.stderr)
    return exitcode.OK


if __name__ == "__main__":
    sys.exit(main())
