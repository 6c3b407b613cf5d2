"""Issue 27, the first hour of a new user: each defect met there, run as the user ran it (a real
process, a real signal, a real closed pipe), with the one line it prints, its exit code, and no
temporary folder left behind."""

from __future__ import annotations

import html
import importlib.util
import inspect
import json
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

import oomsight
from oomsight.predict import inputs, orchestration

from clirun import PEEKS, PY, env_with_tmp, said_well, started, wait_for_line, with_stdout_closed
from clirun import oomsight as run_oomsight

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="signals and pipes as Linux has them")


def write(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def one_line(text: str) -> str:
    assert text.count("\n") == 1, text
    return text.rstrip("\n")


# -- oomsight run -----------------------------------------------------------------------------------


def test_sigint_sent_to_oomsight_run_reaches_the_command_and_exits_130_leaving_no_folder(tmp_path):
    child = write(
        tmp_path,
        "train.py",
        """
        import sys, time
        try:  # "started" inside the try: a SIGINT that lands right after the line is still caught
            print("started", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("the command got SIGINT", flush=True)
            sys.exit(3)
        """,
    )
    proc = started("run", "--port", "0", "--no-report", "--", PY, child, tmp=str(tmp_path))
    wait_for_line(proc, "stdout", "started")
    proc.send_signal(signal.SIGINT)  # kill -INT <pid of oomsight run>: the command is not signalled by anyone else
    out, err = proc.communicate(timeout=60)
    said_well(err)
    assert proc.returncode == 130
    assert "the command got SIGINT" in out
    assert "oomsight run: interrupted (SIGINT); the command exited with 3\n" in err
    assert [n for n in Path(tmp_path).iterdir() if n.name.startswith(("oomsight-run-", "oomsight-startup-"))] == []


def test_a_port_out_of_range_is_one_line_and_exit_2_with_nothing_made(tmp_path):
    result = run_oomsight("run", "--port", "99999", "--", PY, "-c", "pass", tmp=str(tmp_path))
    assert result.returncode == 2 and result.left == []
    assert result.stderr.splitlines()[-1] == (
        "oomsight run: error: argument --port: 99999 is not a TCP port (0 to 65535; 0 picks a free one)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("run", "--spool", "{file}", "--", PY, "-c", "pass"),
        ("replay", str(ROOT / "exporter/oomsight/tools/data/h200-demo.tape.jsonl.gz"), "--spool", "{file}"),
        ("install-startup", "{file}"),
    ],
    ids=["run", "replay", "install-startup"],
)
def test_a_file_given_where_a_folder_is_wanted_is_one_line_and_exit_2(argv, tmp_path):
    file = tmp_path / "a-file"
    file.write_text("mine\n")
    result = run_oomsight(*(a.format(file=file) for a in argv), tmp=str(tmp_path))
    flag = "" if argv[0] == "install-startup" else "--spool "
    assert result.returncode == 2 and result.left == []
    assert one_line(result.stderr) == f"oomsight {argv[0]}: {flag}{file} is a file, not a folder"
    assert file.read_text() == "mine\n"


def test_run_with_its_report_on_a_closed_pipe_exits_141_quietly_and_removes_its_folders(tmp_path):
    result = with_stdout_closed("run", "--port", "0", "--", PY, "-c", "pass", tmp=str(tmp_path), stream="stderr")
    assert result.returncode == 141 and result.left == []


# -- oomsight demo ----------------------------------------------------------------------------------


def test_demo_into_head_exits_141_quietly_and_removes_its_spool(tmp_path):
    proc = started("demo", "--speed", "50", tmp=str(tmp_path))
    assert proc.stdout is not None
    proc.stdout.readline(), proc.stdout.readline()  # oomsight demo | head -2
    proc.stdout.close()
    err = proc.stderr.read() if proc.stderr else ""
    proc.wait(60)
    said_well(err)
    assert proc.returncode == 141 and err == ""
    assert [n for n in Path(tmp_path).iterdir() if n.name.startswith("oomsight-demo-")] == []


def test_demo_keep_keeps_the_spool_and_prints_report_commands_that_work(tmp_path):
    result = run_oomsight("demo", "--keep", "--speed", "400", tmp=str(tmp_path))
    assert result.returncode == 0, result.stderr
    (spool,) = re.findall(r"^demo: kept the spool (\S+); read it again with$", result.stdout, re.M)
    assert f"\n  oomsight report {spool}\n" in result.stdout
    assert f"\n  oomsight report --html oomsight-demo.html {spool}" in result.stdout
    again = run_oomsight("report", spool, tmp=str(tmp_path / "elsewhere"))
    assert again.returncode == 0 and "rank 1 (local rank 1, world 2)" in again.stdout


# -- oomsight report --------------------------------------------------------------------------------


def test_report_html_to_a_path_that_cannot_be_written_names_that_path(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "spool").mkdir()
    result = run_oomsight("report", "--html", "/proc/nope/r.html", str(tmp_path / "spool"), tmp=str(tmp_path))
    assert result.returncode == 1
    assert one_line(result.stderr) == "oomsight report: cannot write /proc/nope/r.html: No such file or directory"


def test_a_negative_retention_is_refused(tmp_path):
    (tmp_path / "spool").mkdir()
    result = run_oomsight("report", "--retention-seconds", "-5", str(tmp_path / "spool"), tmp=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith("argument --retention-seconds: -5 must be 0 or more seconds")


def without(module: str, argv: list[str], tmp: Path) -> tuple[int, str]:
    """The command line run where ``module`` cannot be imported (as in an install without it)."""
    code = f"import sys; sys.modules[{module!r}] = None; from oomsight.tools.cli import main; sys.exit(main({argv!r}))"
    import subprocess

    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env_with_tmp(str(tmp)), timeout=120)
    said_well(done.stderr)
    return done.returncode, done.stderr


def test_the_webhook_without_cryptography_says_which_extra_and_exits_2(tmp_path):
    pytest.importorskip("oomsight_webhook")
    rc, err = without("cryptography", ["webhook"], tmp_path)
    assert (
        rc == 2
        and one_line(err) == "oomsight webhook: needs cryptography, not installed here; pip install 'oomsight[sidecar]'"
    )


# -- oomsight predict -------------------------------------------------------------------------------


def test_a_module_with_a_name_error_is_one_line_naming_the_file_and_line(tmp_path):
    bad = write(tmp_path, "bad.py", "import torch\n\nvalue = undefined_thing + 1\n")
    result = run_oomsight("predict", "--module", f"{bad}:spec", tmp=str(tmp_path))
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"oomsight predict: --module: {bad} failed to import: NameError: name 'undefined_thing' is not defined (line 3)"
    )


def test_a_module_with_a_syntax_error_is_one_line_naming_the_file_and_line(tmp_path):
    bad = write(tmp_path, "bad.py", "x = 1\ndef spec(:\n    pass\n")
    result = run_oomsight("predict", "--module", f"{bad}:spec", tmp=str(tmp_path))
    assert result.returncode == 2
    assert one_line(result.stderr).startswith(f"oomsight predict: --module: {bad}:2: SyntaxError: ")


def test_a_module_without_the_function_names_the_users_file_not_an_internal_module(tmp_path):
    good = write(tmp_path, "f.py", "def spec():\n    return {}\n")
    result = run_oomsight("predict", "--module", f"{good}:nope", tmp=str(tmp_path))
    assert (
        result.returncode == 2 and one_line(result.stderr) == f"oomsight predict: --module: {good} has no function nope"
    )


TINY = """
import torch

def spec():
    return {
        "build": lambda: torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)),
        "batch": lambda n, device: torch.randn(n, 64, device=device),
    }
"""


def test_a_step_that_calls_item_is_said_to_have_data_dependent_control_flow(tmp_path):
    peeks = write(tmp_path, "peeks.py", PEEKS)
    result = run_oomsight("predict", "--module", f"{peeks}:spec", "--batch", "2", "--steps", "1", tmp=str(tmp_path))
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("oomsight predict: the step has data-dependent control flow (.item(), .tolist(), ")
    assert line.index("data-dependent control flow") < line.index("_local_scalar_dense")


def test_categories_come_in_a_fixed_order_with_zeros_kept_and_the_workspace_explained(tmp_path):
    tiny = write(tmp_path, "tiny.py", TINY)
    result = run_oomsight(
        "predict", "--module", f"{tiny}:spec", "--batch", "4", "--steps", "2", "--json", tmp=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    p = json.loads(result.stdout)["prediction"]
    assert list(p["by_category_bytes"])[:7] == list(orchestration.CATEGORY_ORDER)
    assert p["by_category_bytes"]["buffers"] == 0  # no buffer in this model: shown as 0, not dropped
    assert p["workspace_handles"] * p["workspace_bytes"] <= p["by_category_bytes"]["workspace"]
    prose = run_oomsight("predict", "--module", f"{tiny}:spec", "--batch", "4", "--steps", "2", tmp=str(tmp_path))
    peak = next(line for line in prose.stdout.splitlines() if line.startswith("at the peak: "))
    assert peak.startswith("at the peak: parameters ") and ", buffers 0 B, gradients " in peak
    assert f"(workspace: {p['workspace_handles']} cuBLAS handle(s) of 32.00 MiB each" in prose.stdout


def test_in_order_puts_known_categories_first_keeps_zeros_and_counts_the_workspace_handles():
    got = orchestration.in_order(
        {"by_category_bytes": {"workspace": 65 << 20, "activations": 5, "zeta": 1}, "workspace_bytes": 32 << 20}
    )
    assert list(got["by_category_bytes"]) == [*orchestration.CATEGORY_ORDER, "zeta"]
    assert got["by_category_bytes"]["gradients"] == 0 and got["workspace_handles"] == 2


def test_a_size_in_gigabits_is_refused_not_read_as_gigabytes(tmp_path):
    result = run_oomsight("predict", "--model", "gpt2", "--capacity", "40Gb", tmp=str(tmp_path))
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "oomsight predict: --capacity: '40Gb' is not a size (e.g. 80GiB = 80 x 2^30 bytes, 40GB = 40 x 10^9, 1e9B)"
    )
    assert inputs.parse_bytes("40GB") == 40 * 10**9 and inputs.parse_bytes("40GiB") == 40 << 30


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed here")
def test_resnet50_without_torchvision_is_built_from_transformers(tmp_path):
    pytest.importorskip("transformers")
    result = run_oomsight("predict", "--model", "resnet50", "--batch", "1", "--steps", "1", tmp=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "at the peak: parameters 97.49 MiB" in result.stdout  # ResNet-50's 25.6 M float32 parameters


def test_a_named_model_that_nothing_installed_can_build_is_one_clear_line():
    from oomsight.predict import models

    spec = models.ModelSpec(
        "m", models.MODELS["gpt2"].build, models.MODELS["gpt2"].batch, "", ("no_such_pkg_a", "b_no")
    )
    with pytest.raises(ImportError, match=r"^--model m needs no_such_pkg_a or b_no: pip install b_no$"):
        models.check_available(spec)


def test_predict_list_into_a_closed_pipe_is_quiet(tmp_path):
    result = with_stdout_closed("predict", "--list", tmp=str(tmp_path))
    assert result.returncode == 141 and result.stderr == ""


# -- the library's public functions -------------------------------------------------------------


def test_probe_batch_size_on_a_machine_without_cuda_says_so_and_what_to_use_instead():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    from oomsight.tools.probe import NoCudaDevice

    with pytest.raises(NoCudaDevice, match=r"torch\.cuda\.is_available\(\) is False.*predict_peak"):
        oomsight.probe_batch_size(lambda n: None)


@pytest.mark.parametrize(
    ("public", "module", "name"),
    [
        ("probe_batch_size", "oomsight.tools.probe", "probe_batch_size"),
        ("predict_peak", "oomsight.predict.predictor", "predict_peak"),
        ("largest_batch", "oomsight.predict.predictor", "largest_batch"),
        ("measure_remedies", "oomsight.tools.remedy", "measure_remedies"),
    ],
)
def test_a_public_function_shows_the_parameters_and_defaults_of_what_it_calls_and_an_example(public, module, name):
    import importlib

    wrapper = inspect.signature(getattr(oomsight, public))
    inner = inspect.signature(getattr(importlib.import_module(module), name))

    def described(sig):  # ``**options`` may be named for the reader; what it takes is the same
        return {(p.name if p.kind != p.VAR_KEYWORD else "**", p.kind, p.default) for p in sig.parameters.values()}

    shown = described(wrapper)
    # what the sharded tracer and the CLI pass inside the package, not a user's choice
    internal = {"memory", "materializer", "host_states", "known"}
    meant = {d for d in described(inner) if d[0] not in internal}
    assert shown == meant
    doc = inspect.getdoc(getattr(oomsight, public)) or ""
    assert "Example::" in doc and f"oomsight.{public}(" in doc


def test_dir_and_all_of_the_package_list_public_names_only():
    assert dir(oomsight) == sorted(oomsight.__all__)
    for name in oomsight.__all__:
        assert not name.startswith("_") or name == "__version__"
        assert getattr(oomsight, name) is not None
    assert not {"Any", "Optional", "annotations", "TYPE_CHECKING"} & set(dir(oomsight))


# -- the sidecar on a laptop, and in a pod ----------------------------------------------------------


def test_the_sidecar_run_by_hand_listens_on_localhost_only(tmp_path):
    pytest.importorskip("oomsight_sidecar")
    env = {
        k: v for k, v in env_with_tmp(str(tmp_path), OOMSIGHT_ADMIN_PORT="0").items() if k != "OOMSIGHT_SIDECAR_HOST"
    }
    proc = started("sidecar", "--spool", str(tmp_path), "--port", "0", tmp=str(tmp_path), env=env)
    try:
        (line,) = wait_for_line(proc, "stderr", "/metrics")[-1:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert re.search(r"serving .* on http://127\.0\.0\.1:\d+/metrics", line), line
    assert proc.returncode == 0


def test_the_injected_sidecar_is_told_to_listen_on_every_interface():
    pytest.importorskip("oomsight_webhook")
    from oomsight_webhook.injection import InjectionSettings
    from oomsight_webhook.mutation import mutate
    from oomsight_webhook.podspec import SIDECAR_NAME

    from kubetools import apply, fixture

    pod = fixture("job-pod.yaml")
    patched = apply(pod, mutate(pod, InjectionSettings(image="ghcr.io/oomsight/oomsight:0.1.0")).patch)
    spec = patched["spec"]
    sidecar = next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == SIDECAR_NAME)
    assert {"name": "OOMSIGHT_SIDECAR_HOST", "value": "0.0.0.0"} in sidecar["env"]


# -- what a new user reads ------------------------------------------------------------------------


def test_the_top_level_help_and_the_readme_show_predict(tmp_path):
    result = run_oomsight("--help", tmp=str(tmp_path))
    assert result.returncode == 0 and re.search(r"^\s+predict\s+predict a training step", result.stdout, re.M)
    readme = (ROOT / "README.md").read_text()
    assert "oomsight predict --model gpt2" in readme


def test_the_readme_shows_every_subcommand_and_lists_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    for name in ("run", "report", "profile", "replay", "predict", "demo", "install-startup", "sidecar", "webhook"):
        assert f"oomsight {name} " in readme, name
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"`docs/{page.name}`" in readme, page.name


def test_the_readme_sidecar_row_is_the_recorded_result():
    recorded = json.loads((ROOT / "benchmarks/results/sidecar.json").read_text())
    median = recorded["scrape_seconds"]["median"] * 1000
    p99 = recorded["scrape_seconds"]["p99"] * 1000
    rss = recorded["sidecar_memory_kib"]["VmRSS"] / 1024
    row = f"{median:.1f} ms median scrape, {p99:.1f} ms p99, {rss:.1f} MiB RSS"
    assert row in (ROOT / "README.md").read_text()


def test_the_readme_says_how_long_make_demo_took_from_a_fresh_clone():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"`make demo` .*from a fresh clone.* \d+ s", readme), "the measured time"
    assert "not published yet" in readme and "pip install ." in readme


def test_the_chart_notes_list_namespaces_as_words_and_tell_gitops_users_to_skip_tests():
    import shutil
    import subprocess

    helm = shutil.which("helm") or str(ROOT / ".tools/bin/helm")
    if not Path(helm).exists():
        pytest.skip("helm is not installed (make tools)")
    args = ["install", "oomsight", str(ROOT / "helm/oomsight"), "-n", "ml", "--dry-run=client"]
    out = subprocess.run([helm, *args, "--set", "webhook.excludeNamespaces={team-x}"], capture_output=True, text=True)
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "Pods in the namespaces kube-system, ml, team-x are never injected." in notes
    assert '["' not in notes and "--skip-tests" in notes


def test_an_address_that_cannot_be_served_is_said_in_words_and_the_command_still_runs(tmp_path):
    command = (PY, "-c", "print('ran')")
    result = run_oomsight("run", "--host", "192.0.2.1", "--port", "0", "--", *command, tmp=str(tmp_path))
    assert result.returncode == 0 and result.stdout == "ran\n" and result.left == []
    assert "oomsight: cannot serve /metrics on 192.0.2.1:0 (Cannot assign requested address); running without it\n" in (
        result.stderr
    )


COUNTS_SIGINT = """
import signal, sys, time
seen = []
signal.signal(signal.SIGINT, lambda *_: seen.append(1))
print("ready", flush=True)
deadline = time.time() + 30
while not seen and time.time() < deadline:
    time.sleep(0.05)
time.sleep(1.0)  # a second SIGINT, if one were sent, would arrive by now
print(f"SIGINTs: {len(seen)}", flush=True)
sys.exit(130 if seen else 0)
"""


def test_a_ctrl_c_at_the_terminal_reaches_the_command_once_and_run_exits_130(tmp_path):
    import os
    import pty
    import select
    import time

    child = write(tmp_path, "counts.py", COUNTS_SIGINT)
    pid, fd = pty.fork()  # oomsight run in the foreground of a terminal of its own
    if pid == 0:
        os.environ["TMPDIR"] = str(tmp_path)
        os.execv(PY, [PY, "-m", "oomsight", "run", "--port", "0", "--no-report", "--", PY, child])
    seen, typed = b"", False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:  # the terminal closed: everything has exited
            break
        seen += data
        if b"ready" in seen and not typed:
            os.write(fd, b"\x03")  # Ctrl-C: the terminal signals the foreground process group
            typed = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = seen.decode(errors="replace")
    said_well(text)
    assert "SIGINTs: 1" in text  # from the terminal only: oomsight did not send a second one
    assert "oomsight run: interrupted (SIGINT); the command exited with 130" in text
    assert os.waitstatus_to_exitcode(status) == 130
    assert [n for n in os.listdir(tmp_path) if n.startswith(("oomsight-run-", "oomsight-startup-"))] == []


# -- issue 50: the first hour again, from `pip install .` -----------------------------------------

TAPE = str(ROOT / "exporter/oomsight/tools/data/h200-demo.tape.jsonl.gz")


@pytest.mark.parametrize("argv", [["predict", "--model", "gpt2"], ["predict", "--list"]], ids=["model", "list"])
def test_predict_in_a_base_install_without_torch_names_the_predict_extra_and_exits_2(argv, tmp_path):
    rc, err = without("torch", argv, tmp_path)  # `pip install .` pulls no torch: the README's example met that
    said = "oomsight predict: needs torch, not installed here; pip install 'oomsight[predict]'"
    assert rc == 2 and one_line(err) == said


def test_a_missing_module_that_no_extra_installs_is_not_blamed_on_one(monkeypatch):
    from oomsight.tools import cli

    for name in ("torch", "transformers", "bitsandbytes", "cryptography"):
        monkeypatch.setitem(sys.modules, name, None)  # not installed, as in `pip install .`
    assert cli._extra_for("predict", "torch.nn") == "predict" and cli._extra_for("predict", "transformers") == "predict"
    assert cli._extra_for("predict", "bitsandbytes") is None  # not the predict extra's: not said to be
    assert cli._extra_for("predict", "oomsight.predict.gone") is None  # ours missing: a broken install
    assert cli._extra_for("webhook", "cryptography") == "sidecar" and cli._extra_for("report", "torch") is None
    monkeypatch.delitem(sys.modules, "torch")
    if importlib.util.find_spec("torch") is not None:  # installed: a part of it that failed is not a missing extra
        assert cli._extra_for("predict", "torch._no_such_part") is None


def test_report_of_a_folder_that_is_not_a_spool_is_one_line_and_exit_2(tmp_path):
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    result = run_oomsight("report", str(home), tmp=str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert one_line(result.stderr) == (
        f"oomsight report: {home} is not a spool (no snapshots/ or events/ folder in it): give the spool oomsight "
        "run printed, or the job's OOMSIGHT_DIR"
    )
    html = run_oomsight("report", "--html", str(tmp_path / "r.html"), str(home), tmp=str(tmp_path))
    assert html.returncode == 2 and not (tmp_path / "r.html").exists()


def test_report_of_an_empty_folder_is_a_spool_nothing_has_written_to_yet(tmp_path):
    (tmp_path / "spool").mkdir()  # `oomsight run` printed it; the job has not reached CUDA yet
    result = run_oomsight("report", str(tmp_path / "spool"), tmp=str(tmp_path))
    assert result.returncode == 0 and "no process wrote data" in result.stdout


def test_replay_of_a_folder_says_it_is_a_folder_not_a_tape(tmp_path):
    result = run_oomsight("replay", str(tmp_path), "--spool", str(tmp_path / "out"), tmp=str(tmp_path))
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert one_line(result.stderr) == (
        f"oomsight replay: {tmp_path} is a folder, not a tape (a file oomsight run --tape wrote)"
    )


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("no-such-binary-of-oomsight", "command not found"),
        ("./no-such-file", "No such file or directory"),
        ("/", "Permission denied"),  # a folder, as a shell says it
    ],
)
def test_run_of_a_command_that_cannot_start_gives_its_one_error_alone(command, why, tmp_path):
    result = run_oomsight("run", "--port", "0", "--", command, "--flag", tmp=str(tmp_path), cwd=str(tmp_path))
    assert result.returncode == 127 and result.left == [] and result.stdout == ""
    assert one_line(result.stderr) == f"oomsight run: cannot start {command!r}: {why}"


def test_the_reports_of_a_replay_say_it_is_one_and_that_time_was_rescaled(tmp_path):
    spool = str(tmp_path / "replayed")
    done = run_oomsight("replay", TAPE, "--spool", spool, "--speed", "1000", tmp=str(tmp_path))
    assert done.returncode == 0, done.stderr
    said = (
        "REPLAY of the tape h200-demo.tape.jsonl.gz, not a live run: a replay at speed 1000 rescales time: the "
        "spool's timestamps are the tape's divided by 1000"
    )
    text = run_oomsight("report", spool, tmp=str(tmp_path))
    assert text.returncode == 0 and text.stdout.startswith(said)
    pytest.importorskip("matplotlib")
    from oomsight.tools import report_html

    page = report_html.build(spool, 0.0, 1e12)
    assert "<h1>oomsight memory report (REPLAY)</h1>" in page
    assert html.escape(said) in page and "charts over time are 1000 times shorter than the run" in page


def test_a_live_spool_s_html_report_is_not_called_a_replay(tmp_path):
    pytest.importorskip("matplotlib")
    from oomsight.tools import report_html, tape

    assert tape.replayed(str(tmp_path)) is None
    page = report_html.build(str(tmp_path), 0.0, 1e12)
    assert "REPLAY" not in page
    assert tape.replay_line("run.tape", 1.0) == (
        "REPLAY of the tape run.tape, not a live run: timestamps moved to the replay's start, time not rescaled"
    )


def test_transformers_notices_about_predicts_own_calls_never_reach_stderr(tmp_path):
    pytest.importorskip("transformers")
    # a gpt2 config has loss_type=None; --checkpointing calls gradient_checkpointing_enable (deprecated in 5):
    # without the quieting both reach stderr, also from this small GPT-2
    small = "gpt2:n_layer=1,n_embd=64,n_head=2,vocab_size=256,n_positions=64"
    argv = ("--model", small, "--seq-len", "16", "--batch", "1", "--steps", "1", "--checkpointing")
    result = run_oomsight("predict", *argv, tmp=str(tmp_path))
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_quieting_transformers_is_scoped_to_predict_and_leaves_errors_and_the_users_warnings(monkeypatch):
    import logging
    import warnings

    from oomsight.tools import cli

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    logger = logging.getLogger("transformers")
    before = logger.level
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with cli._quiet_transformers():
            assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"  # read by transformers' first import
            assert not logging.getLogger("transformers.modeling_utils").isEnabledFor(logging.WARNING)
            assert logging.getLogger("transformers.modeling_utils").isEnabledFor(logging.ERROR)
            warnings.warn_explicit("`x` is deprecated and will be removed in v6", FutureWarning, "m.py", 1,
                                   module="transformers.modeling_utils")  # fmt: skip
            warnings.warn("the user's own", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["the user's own"]
    assert logger.level == before and "TRANSFORMERS_VERBOSITY" not in os.environ


# -- the package as PyPI and a wheel show it --------------------------------------------------------


def built_metadata(tmp_path: Path) -> tuple[str, str]:
    """The wheel's METADATA as setuptools builds it from pyproject.toml now, and what the build said."""
    import subprocess

    code = f"import sys, setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel({str(tmp_path)!r}))"
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    folder = done.stdout.strip().splitlines()[-1]
    return (tmp_path / folder / "METADATA").read_text(), done.stdout + done.stderr


def test_the_package_metadata_has_an_spdx_license_its_file_urls_and_classifiers_without_a_deprecation(tmp_path):
    metadata, said = built_metadata(tmp_path)
    assert "Deprecat" not in said and "deprecat" not in said, said  # setuptools: a license table ends 2027-02-18
    assert "\nLicense-Expression: Apache-2.0\n" in metadata and "\nLicense-File: LICENSE\n" in metadata
    assert "\nProject-URL: Source, https://github.com/oomsight/oomsight\n" in metadata
    assert "\nProject-URL: Issues, https://github.com/oomsight/oomsight/issues\n" in metadata
    classifiers = re.findall(r"^Classifier: (.+)$", metadata, re.M)
    assert "Programming Language :: Python :: 3" in classifiers and "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression alone
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text


def test_the_readme_install_section_names_every_extra_and_what_needs_it():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Install: the base package and its extras", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|", section, re.M))
    assert set(rows) == set(extras)
    assert "oomsight predict" in rows["predict"] and "--html" in rows["report"]


def test_make_test_prints_the_20_slowest_tests():
    unit = (ROOT / "Makefile").read_text().split("\nunit:\n", 1)[1].split("\n\n", 1)[0]
    assert "-m pytest" in unit and "--durations=20" in unit


# -- the suite on a busy machine ------------------------------------------------------------------


def test_a_second_of_an_unshared_machine_grows_with_the_run_queue_per_cpu_and_never_shrinks(monkeypatch):
    import procs

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 7.0, 7.0))  # five jobs' tests on two cores
    assert procs.as_this_machine_gives(1.0) == 3.5
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))  # idle: the claim as written
    assert procs.as_this_machine_gives(1.0) == 1.0

    def no_load_average():
        raise OSError("not on this system")

    monkeypatch.setattr(os, "getloadavg", no_load_average)
    assert procs.as_this_machine_gives(5.0) == 5.0
