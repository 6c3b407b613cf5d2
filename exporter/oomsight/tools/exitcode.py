"""The exit codes of the ``oomsight`` command line (``docs/cli.md`` lists them).

``oomsight run`` otherwise exits with its command's own code (128+N when a signal N ended it).
"""

OK = 0
REFUSED = 1
"""The request was understood but could not be carried out: a profile refused (busy, no live
process), a file that cannot be written."""
USAGE = 2
"""What was typed is wrong: a bad or missing argument, a path that does not exist (a spool
folder, a tape, a script) or a file where a folder is wanted, a ``predict --module`` file that
fails; or what the command needs is not installed (matplotlib for ``--html``). argparse's own
errors exit 2 as well."""
TIMED_OUT = 3
"""``oomsight profile --wait``: not every process answered in time."""
PORT_BUSY = 4
"""A port given with ``--port`` is in use (without ``--port``, ``oomsight run`` picks a free one)."""
INTERRUPTED = 130
"""Ctrl-C, or SIGINT sent to oomsight (128 + SIGINT); ``oomsight run`` passes it to its command first."""
CANNOT_START = 127
"""``oomsight run``: the command could not be started (not found, not executable), as in a shell."""
BROKEN_PIPE = 141
"""stdout (or stderr) closed by its reader (``oomsight demo | head -2``): a quiet exit, temporary
folders removed, with 128 + SIGPIPE as a shell reports a command a closed pipe ended."""
