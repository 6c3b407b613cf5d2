"""The image, two ways. Without a container runtime: hadolint, and the build stage's exact
RUN steps replayed in a clean virtualenv, which then serves metrics as the image would. For
real: ``scripts/build-image.sh`` builds the Dockerfile with podman (local Debian base, no
network in the build), and the image runs read-only, as its own non-root user, with every
capability dropped: the sidecar over a spool the image itself replayed, the webhook over TLS.
The real image is skipped only where podman cannot run a container at all; with
``OOMSIGHT_REQUIRE_IMAGE=1`` (CI, ``.ci/run``) that is a failure instead."""

import base64
import collections
import contextlib
import dataclasses
import glob
import gzip
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import ROOT
from kubetools import apply, fixture, validate
from procs import free_port, http_get, wait_for
from spoolmaker import hooked_process

pytestmark = pytest.mark.e2e

DOCKERFILE = os.path.join(ROOT, "Dockerfile")
SIZE_DOC = os.path.join(ROOT, "docs", "kubernetes.md")


def instructions(path):
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    with open(path) as fh:
        text = re.sub(r"\\\n", " ", "".join(line for line in fh if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", text, re.M)]


def stages(path):
    found, current = {}, None
    for instruction, args in instructions(path):
        if instruction == "FROM":
            words = args.split()
            current = words[-1] if len(words) == 3 and words[1].upper() == "AS" else "final"
            found[current] = []
        elif current is not None:
            found[current].append((instruction, args))
    return found


def env_pairs(args):
    return dict(word.split("=", 1) for word in shlex.split(args))


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    result = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_is_slim_pinned_multi_stage_and_non_root():
    found = stages(DOCKERFILE)
    assert set(found) == {"build", "final"}
    with open(DOCKERFILE) as fh:
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", fh.read(), re.M).group(1)
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", base)  # an exact Python patch release, slim
    final = dict(found["final"])
    assert final["USER"] == "65532:65532"
    assert final["COPY"] == "--from=build /opt/oomsight /opt/oomsight"
    assert all(instr != "RUN" for instr, _ in found["final"])  # nothing installed or fetched in the runtime stage
    assert final["ENTRYPOINT"] == '["oomsight"]'


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory):
    """The build stage's COPY and RUN steps, executed as written, into a fresh folder."""
    work = tmp_path_factory.mktemp("image")
    src, venv = work / "src", work / "opt-oomsight"
    src.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    shim = work / "bin"
    shim.mkdir()
    os.symlink(sys.executable, shim / "python")  # the image's "python"
    env["PATH"] = f"{shim}:{env['PATH']}"
    for instruction, args in stages(DOCKERFILE)["build"]:
        if instruction == "ENV":
            env.update(env_pairs(args))
            env["VENV"] = str(venv)  # the only change: /opt/oomsight -> a temporary folder
        elif instruction == "COPY":
            *sources, _ = args.split()
            for source in sources:
                path = os.path.join(ROOT, source.rstrip("/"))
                target = src / source.rstrip("/")
                if source.endswith("/") and not os.path.isdir(path):
                    target.mkdir()  # a folder of the Dockerfile this tree does not have yet: as build-image.sh
                    continue
                (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, target)
        elif instruction == "RUN":
            result = subprocess.run(
                ["/bin/sh", "-c", args], cwd=src, env=env, capture_output=True, text=True, timeout=300
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return venv


def test_the_built_environment_serves_the_sidecar_and_has_no_torch(image_venv, tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    hooked_process(spool, monkeypatch=monkeypatch)
    runtime = {"PATH": f"{image_venv}/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)}
    runtime["OOMSIGHT_ADMIN_PORT"] = str(free_port())  # not the default 21401, which another sidecar may hold
    python = str(image_venv / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import kubernetes, cryptography, prometheus_client; import torch"],
        env=runtime,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No module named 'torch'" in probe.stderr  # the rest imported fine
    assert not (image_venv / "bin" / "pip").exists()
    port = free_port()
    proc = subprocess.Popen(
        [str(image_venv / "bin" / "oomsight"), "sidecar", "--spool", spool, "--host", "127.0.0.1", "--port", str(port)],
        env=runtime,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        body = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics")[1])
        assert "oomsight_torch_allocated_bytes{" in body and "oomsight_build_info{" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    for args in (["webhook", "--help"], ["install-startup", str(tmp_path / "startup")]):
        done = subprocess.run(
            [str(image_venv / "bin" / "oomsight"), *args], env=runtime, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "startup" / "sitecustomize.py").exists()


# The real image: built by scripts/build-image.sh, run by podman as a restricted pod runs it.

BUILD_SCRIPT = os.path.join(ROOT, "scripts", "build-image.sh")
BASE_ENV = os.path.join(ROOT, ".tools", "image", "base.env")
REQUIRED = os.environ.get("OOMSIGHT_REQUIRE_IMAGE") == "1"
USER = 65532
SPOOL = "/var/run/oomsight"  # the image's OOMSIGHT_DIR, where the webhook mounts the spool
# readOnlyRootFilesystem (no tmpfs either: the sidecar gets only the spool), drop ALL,
# allowPrivilegeEscalation: false; the host's network, so that the test reaches the ports
RESTRICTED = ("--network=host", "--read-only", "--read-only-tmpfs=false", "--cap-drop=all")
RESTRICTED += ("--security-opt=no-new-privileges",)


@dataclasses.dataclass
class Image:
    """The built image and the podman configuration of its store."""

    name: str
    env: dict[str, str]

    def podman(self, *args: str, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def run(self, *args: str) -> str:
        """Run the image to completion, restricted; its stdout."""
        done = self.podman("run", "--rm", *RESTRICTED, *args)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    @contextlib.contextmanager
    def started(self, name: str, *args: str):
        """A restricted container in the background; its log is printed (shown when a test fails)."""
        done = self.podman("run", "--detach", "--name", name, *RESTRICTED, *args)
        assert done.returncode == 0, done.stderr
        try:
            yield name
        finally:
            logs = self.podman("logs", name)
            print(logs.stdout + logs.stderr)
            self.podman("rm", "--force", "--time=5", name)

    def process_status(self, name: str) -> dict[str, str]:
        """/proc/<pid>/status of the container's main process, seen from the host."""
        pid = self.podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        with open(f"/proc/{pid}/status") as fh:
            return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)

    def inspect(self, template: str, name: str = "") -> str:
        return self.podman("inspect", "--format", template, name or self.name).stdout.strip()


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason}; OOMSIGHT_REQUIRE_IMAGE=1 says this machine must build and run the image")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    if shutil.which("podman") is None:
        _unavailable("podman is not installed (scripts/install-image-tools.sh installs it, as root)")
    store = tmp_path_factory.mktemp("podman")
    env = dict(os.environ, CONTAINERS_CONF=f"{store}/containers.conf", CONTAINERS_STORAGE_CONF=f"{store}/storage.conf")
    start = time.monotonic()
    built = subprocess.run(
        ["bash", BUILD_SCRIPT, "--store", str(store)], env=env, capture_output=True, text=True, timeout=280
    )
    image = Image(built.stdout.strip(), env)
    if built.returncode != 0:
        probe = image.podman("run", "--rm", "--network=none", "--rootfs", "/:O", "true")
        if probe.returncode != 0:
            _unavailable(f"podman cannot run a container on this machine: {probe.stderr.strip()[-600:]}")
        pytest.fail(f"scripts/build-image.sh failed:\n{built.stderr[-4000:]}")
    print(f"{image.name} built in {time.monotonic() - start:.0f} s")
    yield image
    # this store only (`podman system reset` would also drop the machine's podman networks);
    # with no container left nothing in it is mounted
    image.podman("rm", "--all", "--force")
    shutil.rmtree(store, ignore_errors=True)


def base_env():
    with open(BASE_ENV) as fh:
        return dict(line.strip().split("=", 1) for line in fh if "=" in line)


def samples(body):
    """{(sample name, sorted label pairs): value} of a text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def h200_tape():
    (path,) = glob.glob(os.path.join(ROOT, "exporter", "oomsight", "**", "h200-demo.tape.jsonl.gz"), recursive=True)
    return path


def tape_ooms(path):
    """OOM events per rank recorded on a tape (a header line, then {"t", "path", "doc"} records)."""
    with gzip.open(path, "rt") as fh:
        records = [json.loads(line) for line in fh][1:]
    ranks = {str(r["doc"]["process"]["rank"]) for r in records if r["path"].startswith("snapshots/")}
    events = {r["path"]: str(r["doc"]["process"]["rank"]) for r in records if r["path"].startswith("events/")}
    return {rank: collections.Counter(events.values())[rank] for rank in ranks}


def owned_by_the_image_user(path):
    """Pod volumes belong to the pod's fsGroup; here: the image's user (root runs this test)."""
    for folder, _, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            if os.geteuid() == 0:
                os.chown(name, USER, USER)
            else:  # rootless podman maps the image's user to a subordinate uid: "others" here
                os.chmod(name, 0o777)


def test_the_image_holds_the_bases_python_and_the_sidecar_without_torch_or_pip(image):
    assert image.inspect("{{.Config.User}}") == f"{USER}:{USER}"
    assert image.inspect("{{json .Config.Entrypoint}} {{json .Config.Cmd}}") == '["oomsight"] ["sidecar"]'
    probe = (
        "import importlib.util, json, os, platform;"
        "import cryptography, kubernetes, prometheus_client;"
        "import oomsight, oomsight_server, oomsight_sidecar, oomsight_webhook;"
        "print(json.dumps([platform.python_version(), os.getuid(), importlib.util.find_spec('torch') is None,"
        "os.path.exists('/opt/oomsight/bin/pip'), os.environ['OOMSIGHT_DIR']]))"
    )
    python, uid, no_torch, pip, spool = json.loads(image.run("--entrypoint", "python", image.name, "-c", probe))
    assert python.rsplit(".", 1)[0] == base_env()["BASE_PYTHON"]  # the wheels were chosen for this Python
    assert (uid, no_torch, pip, spool) == (USER, True, False, SPOOL)


def test_the_init_containers_command_fills_the_startup_folder(image, tmp_path):
    startup = tmp_path / "startup"
    startup.mkdir()
    owned_by_the_image_user(startup)
    image.run("--volume", f"{startup}:/startup", image.name, "install-startup", "/startup")
    assert (startup / "sitecustomize.py").is_file()


def test_the_sidecar_serves_a_spool_the_image_replayed_read_only_and_non_root(image, tmp_path):
    spool, tape = tmp_path / "spool", h200_tape()
    spool.mkdir()
    owned_by_the_image_user(spool)
    mounts = (f"--volume={spool}:{SPOOL}",)
    replay = f"--volume={tape}:/tape.jsonl.gz:ro {image.name} replay --spool {SPOOL} --speed 1000000 /tape.jsonl.gz"
    image.run(*mounts, *replay.split())
    port, admin = free_port(), free_port()
    start = time.monotonic()
    command = f"--env=OOMSIGHT_ADMIN_PORT={admin} {image.name} sidecar --host 127.0.0.1 --port {port}"
    with image.started("oomsight-test-sidecar", *mounts, *command.split()) as name:
        url = f"http://127.0.0.1:{port}"
        body = wait_for(lambda: http_get(f"{url}/metrics")[1], timeout=30)
        print(f"first scrape answered {time.monotonic() - start:.1f} s after podman run")
        assert http_get(f"{url}/healthz")[0] == 200 and http_get(f"{url}/readyz")[0] == 200
        values = samples(body)
        ooms = {dict(labels)["rank"]: v for (n, labels), v in values.items() if n == "oomsight_oom_events_total"}
        assert ooms == tape_ooms(tape) and sum(ooms.values()) >= 1  # rank 1's fatal OOM, rank 0 none
        allocated = [v for (n, _), v in values.items() if n == "oomsight_torch_allocated_bytes"]
        assert len(allocated) == len(ooms) and all(v > 0 for v in allocated)
        status = image.process_status(name)
        assert status["Uid"].split() == [str(USER)] * 4 and status["Gid"].split() == [str(USER)] * 4
        assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1"
        writes = (
            "import errno, json\ndef write(path):\n  try: open(path, 'w').close(); return 'ok'\n"
            "  except OSError as e: return errno.errorcode[e.errno]\n"
            f"print(json.dumps([write(p) for p in ('/tmp/x', '/opt/oomsight/x', '/x', '{SPOOL}/x')]))"
        )
        done = image.podman("exec", name, "python", "-c", writes)
        assert json.loads(done.stdout) == ["EROFS", "EROFS", "EROFS", "ok"], done.stderr
        stopped = image.podman("stop", "--time=10", name)
        assert stopped.returncode == 0 and image.inspect("{{.State.ExitCode}}", name) == "0"  # SIGTERM: a clean exit


def make_certificates(folder):
    """A CA and a serving certificate for localhost, as cert-manager would mount them."""
    folder.mkdir()
    (folder / "serving.ext").write_text("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost\n")
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    for args in (
        f"req -x509 {ec} -days 2 -keyout ca.key -out ca.crt -subj /CN=oomsight-test-ca",
        f"req -new {ec} -keyout tls.key -out tls.csr -subj /CN=localhost",
        "x509 -req -days 2 -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -extfile serving.ext -out tls.crt",
    ):
        subprocess.run(["openssl", *args.split()], cwd=folder, check=True, capture_output=True, timeout=60)
    owned_by_the_image_user(folder)
    return ssl.create_default_context(cafile=str(folder / "ca.crt"))


def admission_review(pod):
    request = {"uid": "5d3c7e1a-image-test", "operation": "CREATE", "namespace": "team-a", "object": pod}
    request |= {
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"version": "v1", "resource": "pods"},
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


def test_the_webhook_admits_over_tls_from_mounted_certificates_read_only_and_non_root(image, tmp_path):
    trust = make_certificates(tmp_path / "tls")
    port, metrics = free_port(), free_port()
    env = {
        "OOMSIGHT_WEBHOOK_TLS_MODE": "files",  # cert-manager's way: the webhook needs no Kubernetes API
        "OOMSIGHT_WEBHOOK_PORT": port,
        "OOMSIGHT_WEBHOOK_METRICS_PORT": metrics,
        "OOMSIGHT_INJECT_IMAGE": image.name,
    }
    with image.started(
        "oomsight-test-webhook",
        "--tmpfs=/tmp:size=16m",
        f"--volume={tmp_path}/tls:/etc/oomsight/tls:ro",
        *(f"--env={k}={v}" for k, v in env.items()),
        image.name,
        "webhook",
    ) as name:

        def post(method, path, body=None):
            conn = http.client.HTTPSConnection("localhost", port, context=trust, timeout=10)
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()

        assert wait_for(lambda: post("GET", "/healthz")[0] == 200, timeout=30)
        pod = fixture("pytorchjob-worker.yaml")
        status, body = post("POST", "/mutate", admission_review(pod))
        response = json.loads(body)["response"]
        assert status == 200 and response["allowed"] is True and response["uid"] == "5d3c7e1a-image-test"
        injected = apply(pod, json.loads(base64.b64decode(response["patch"])))
        validate(injected)
        images = [c["image"] for c in injected["spec"].get("initContainers", []) + injected["spec"]["containers"]]
        assert image.name in images
        counted = samples(http_get(f"http://127.0.0.1:{metrics}/metrics")[1])
        assert counted[("oomsight_webhook_admissions_total", (("result", "injected"),))] == 1
        assert image.process_status(name)["Uid"].split() == [str(USER)] * 4


def test_the_image_size_is_the_documented_one_within_20_percent(image):
    size_mb = int(image.inspect("{{.Size}}")) / 1e6
    with open(SIZE_DOC) as fh:
        documented = int(re.search(r"image as built: about (\d+) MB", fh.read()).group(1))
    assert size_mb <= 1.2 * documented, f"the image grew to {size_mb:.0f} MB from {documented} MB (docs/kubernetes.md)"
    assert size_mb >= 0.8 * documented, f"the image shrank to {size_mb:.0f} MB: update docs/kubernetes.md"
