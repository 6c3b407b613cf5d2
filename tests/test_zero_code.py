"""Zero-code mode end to end without a cluster: the init container's command fills the
startup folder, the webhook's PYTHONPATH puts it first, and a real Python process with a
user sitecustomize already on that path runs both, the hook only once torch is imported."""

import os
import subprocess
import sys

import pytest

from oomsight_webhook.injection import InjectionSettings
from oomsight_webhook.mutation import mutate
from oomsight_webhook.podspec import STARTUP_NAME, STARTUP_PATH

from kubetools import apply, fixture

SETTINGS = InjectionSettings(image="ghcr.io/oomsight/oomsight:0.1.0")
PROBE = """
import builtins, sys
print("user-sitecustomize", getattr(builtins, "USER_SITE_LOADED", False))
import userlib
print("user-path-kept", userlib.OK)
print("oomsight-before-torch", "oomsight" in sys.modules)
if IMPORT_TORCH:
    import torch
    import oomsight
    print("hook-loaded", "oomsight.hook.runtime" in sys.modules)
    print("hook-from-startup-folder", oomsight.__file__.startswith(STARTUP))
"""


@pytest.fixture(scope="module")
def pod_world(tmp_path_factory):
    """The injected training container's env, with the pod's paths mapped onto temporary folders."""
    tmp = tmp_path_factory.mktemp("zero-code")
    pod = fixture("zero-code-pod.yaml")
    patched = apply(pod, mutate(pod, SETTINGS).patch)
    (init,) = [c for c in patched["spec"]["initContainers"] if c["name"] == STARTUP_NAME]
    startup = tmp / "startup"
    command = [str(startup) if arg == STARTUP_PATH else arg for arg in init["command"]]
    assert command[:2] == ["oomsight", "install-startup"]
    done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    site, src = tmp / "app-site", tmp / "app-src"
    site.mkdir()
    src.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_LOADED = True\n")
    (src / "userlib.py").write_text("OK = True\n")
    trainer = next(c for c in patched["spec"]["containers"] if c["name"] == "trainer")
    env = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    mapping = {STARTUP_PATH: str(startup), "/app/site": str(site), "/app/src": str(src)}
    env["PYTHONPATH"] = ":".join(mapping.get(p, p) for p in env["PYTHONPATH"].split(":"))
    env["OOMSIGHT_DIR"] = str(tmp / "spool")
    return env, str(startup)


def run_probe(pod_world, import_torch, **extra):
    env, startup = pod_world
    full = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env, **extra}
    code = f"IMPORT_TORCH = {import_torch}\nSTARTUP = {startup!r}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(line.rsplit(" ", 1) for line in out.stdout.splitlines()), out.stderr


def test_the_user_sitecustomize_and_the_hook_both_run_without_a_code_change(pod_world):
    seen, stderr = run_probe(pod_world, import_torch=True)
    assert seen == {
        "user-sitecustomize": "True",
        "user-path-kept": "True",
        "oomsight-before-torch": "False",
        "hook-loaded": "True",
        "hook-from-startup-folder": "True",
    }
    assert "oomsight: idle: torch.cuda.is_available() is False" in stderr  # started, and says why it idles


def test_a_process_that_never_imports_torch_is_left_alone(pod_world):
    seen, _ = run_probe(pod_world, import_torch=False)
    assert seen["user-sitecustomize"] == "True" and seen["oomsight-before-torch"] == "False"


def test_oomsight_disabled_turns_the_startup_hook_off(pod_world):
    seen, _ = run_probe(pod_world, import_torch=True, OOMSIGHT_DISABLED="1")
    assert seen["user-sitecustomize"] == "True" and seen["hook-loaded"] == "False"
