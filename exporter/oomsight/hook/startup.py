"""The startup folder that loads the hook without any code change.

Layout (what ``PYTHONPATH`` points at)::

    <folder>/sitecustomize.py   # bootstrap/sitecustomize.py
    <folder>/oomsight/          # this package (the hook needs only the standard library and torch)

``oomsight run`` links it into a temporary folder; the Kubernetes zero-code mode
copies it into a shared volume from an init container (``oomsight install-startup``).
"""

from __future__ import annotations

import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)
"""The whole ``oomsight`` package, which the startup folder holds (or links)."""
SITECUSTOMIZE = os.path.join(HERE, "bootstrap", "sitecustomize.py")


def install(folder: str, copy: bool = False) -> str:
    """Create the startup folder; ``copy`` for a volume another container mounts."""
    os.makedirs(folder, exist_ok=True)
    site = os.path.join(folder, "sitecustomize.py")
    pkg = os.path.join(folder, "oomsight")
    if copy:
        shutil.copyfile(SITECUSTOMIZE, site)
        shutil.copytree(PACKAGE_DIR, pkg, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        for src, dst in ((SITECUSTOMIZE, site), (PACKAGE_DIR, pkg)):
            if not os.path.lexists(dst):
                os.symlink(src, dst)
    return folder


def pythonpath_with(folder: str, existing: str | None) -> str:
    """``PYTHONPATH`` with the startup folder first and the user's entries kept."""
    return folder if not existing else folder + os.pathsep + existing
