"""oomsight's startup module: put this folder first on PYTHONPATH and every Python
process started there loads the hook the moment it imports torch.

Used by ``oomsight run`` and by the Kubernetes zero-code mode. It imports only the
standard library at start-up, chain-loads any ``sitecustomize`` it shadows, does
nothing in processes that never import torch, and is switched off by
``OOMSIGHT_DISABLED=1``.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_load_shadowed() -> None:
    """Import the sitecustomize that this file hides (e.g. Debian's), if any."""
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            sys.stderr.write(f"oomsight: the original sitecustomize failed: {exc}\n")
    except Exception as exc:  # site.py would print and carry on; so do we
        sys.stderr.write(f"oomsight: the original sitecustomize failed: {exc!r}\n")
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _activate() -> None:
    try:
        import oomsight

        oomsight.start()
    except Exception as exc:  # never break the user's program
        sys.stderr.write(f"oomsight: not started: {exc!r}\n")


class _TorchWatcher:
    """A meta path finder that starts oomsight right after ``import torch`` completes."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "torch" or self._busy:
            return None
        self._busy = True
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        inner = spec.loader.exec_module
        watcher = self

        def exec_module(module):  # type: ignore[no-untyped-def]
            inner(module)
            if watcher in sys.meta_path:
                sys.meta_path.remove(watcher)
            _activate()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader
        return spec


def _install() -> None:
    if os.environ.get("OOMSIGHT_DISABLED", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    if "torch" in sys.modules:
        _activate()
    else:
        sys.meta_path.insert(0, _TorchWatcher())


_chain_load_shadowed()
_install()
