import ast
import dataclasses
import inspect
import os
import re
import sys
import textwrap
import types

import pytest

import oomsight
import oomsight.config as config
from oomsight.config import (
    DEFAULT_METRICS_PORT,
    HOOK,
    ConfigError,
    Group,
    Setting,
    Settings,
    ascii_int,
    parse_bool,
    parse_count,
    rendering,
    table,
)
from oomsight.config.variables import GROUPS, INJECT, SIDECAR, TABLES, WEBHOOK
from oomsight_server.listener import ServerLimits
from oomsight_sidecar.settings import AdminSettings, KubernetesSettings, SidecarSettings
from oomsight_webhook.injection import InjectionSettings
from oomsight_webhook.settings import WebhookSettings

from fakes import ROOT


def test_defaults_need_no_environment():
    s = Settings.from_env({})
    assert s.sampling.interval_seconds == 0.1
    assert s.steps.peaks is False
    assert s.spool.dir.endswith("oomsight")
    assert s == Settings()


def test_every_variable_is_read():
    env = {
        "OOMSIGHT_DIR": "/x",
        "OOMSIGHT_SAMPLE_INTERVAL_SECONDS": "0.5",
        "OOMSIGHT_PUBLISH_INTERVAL_SECONDS": "2",
        "OOMSIGHT_WINDOW_SECONDS": "30",
        "OOMSIGHT_STEP_PEAKS": "true",
        "OOMSIGHT_RECORD_HISTORY": "1",
        "OOMSIGHT_HISTORY_MAX_ENTRIES": "500",
        "OOMSIGHT_NVML": "0",
    }
    s = Settings.from_env(env)
    assert (s.spool.dir, s.sampling.interval_seconds, s.sampling.publish_interval_seconds) == ("/x", 0.5, 2.0)
    assert s.steps.peaks and s.history.record and not s.nvml.enabled
    assert s.history.max_entries == 500


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"OOMSIGHT_STEP_PEAKS": "maybe"}, "OOMSIGHT_STEP_PEAKS='maybe' is not a boolean"),
        ({"OOMSIGHT_SAMPLE_INTERVAL_SECONDS": "fast"}, "is not a number of seconds"),
        ({"OOMSIGHT_SAMPLE_INTERVAL_SECONDS": "-1"}, "must be between"),
        ({"OOMSIGHT_HISTORY_MAX_ENTRIES": "0"}, "must be at least 1"),
        ({"OOMSIGHT_HISTORY_MODE": "none"}, "OOMSIGHT_HISTORY_MODE='none' is not one of all, state"),
        ({"OOMSIGHT_PUBLISH_INTERVAL_SECONDS": "0.01"}, "shorter than OOMSIGHT_SAMPLE_INTERVAL_SECONDS"),
    ],
)
def test_a_bad_value_names_the_variable(env, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        Settings.from_env(env)


def test_replace_rejects_unknown_settings():
    with pytest.raises(ConfigError, match="unknown oomsight setting"):
        Settings().replace(sampel_interval_seconds=1)


def test_the_default_spool_dir_is_named_not_probed(monkeypatch):
    # tempfile.gettempdir() would skip an unusable $TMPDIR (and raise where nothing is writable:
    # a read-only root filesystem, as the sidecar runs); the default must only name the folder
    monkeypatch.setenv("TMPDIR", "/nonexistent/tmp")
    assert Settings().spool.dir == "/nonexistent/tmp/oomsight"
    assert Settings.from_env({}).spool.dir == "/nonexistent/tmp/oomsight"
    assert Settings.from_env({"OOMSIGHT_DIR": "/spool"}).spool.dir == "/spool"


# Every variable users may have set before the table (their names and meanings are kept), with a
# value unlike the default, as the environment gives it and as a start() keyword gives it.
CHANGED = {
    "OOMSIGHT_DIR": ("/x", "/x"),
    "OOMSIGHT_DISABLED": ("1", True),
    "OOMSIGHT_SAMPLE_INTERVAL_SECONDS": ("0.25", 0.25),
    "OOMSIGHT_PUBLISH_INTERVAL_SECONDS": ("2", 2.0),
    "OOMSIGHT_WINDOW_SECONDS": ("120", 120.0),
    "OOMSIGHT_NVML": ("0", False),
    "OOMSIGHT_STEP_HOOK": ("off", False),
    "OOMSIGHT_STEP_PEAKS": ("yes", True),
    "OOMSIGHT_CATEGORIES_INTERVAL_SECONDS": ("5", 5.0),
    "OOMSIGHT_OOM_OBSERVER": ("0", False),
    "OOMSIGHT_RECORD_HISTORY": ("1", True),
    "OOMSIGHT_HISTORY_MAX_ENTRIES": ("77", 77),
    "OOMSIGHT_HISTORY_MODE": ("state", "state"),
    "OOMSIGHT_PROFILE_EVERY_SECONDS": ("600", 600.0),
    "OOMSIGHT_PROFILE_STEPS": ("3", 3),
    "OOMSIGHT_PROFILE_SCHEDULED_CUDA_TIME": ("1", True),
    "OOMSIGHT_ARTIFACTS_MAX_BYTES": ("1024", 1024),
    "OOMSIGHT_MAX_OOM_EVENTS": ("9", 9),
    "OOMSIGHT_TERMINATION_MESSAGE_PATH": ("", ""),
    "OOMSIGHT_PREDICTION": ("/job/prediction.json", "/job/prediction.json"),
}


def _value(settings, row):
    return getattr(getattr(settings, row.group) if row.group else settings, row.field)


@pytest.mark.parametrize("row", HOOK, ids=lambda row: row.variable)
def test_each_variable_and_its_start_keyword_set_the_same_field_of_one_group(row):
    raw, value = CHANGED[row.variable]
    assert _value(Settings(), row) != value
    assert _value(Settings.from_env({row.variable: raw}), row) == value
    assert _value(Settings().replace(**{row.keyword: value}), row) == value
    # and nothing else: the other groups keep their defaults
    changed = [r.variable for r in HOOK if _value(Settings.from_env({row.variable: raw}), r) != _value(Settings(), r)]
    assert changed == [row.variable]


def test_every_existing_variable_keeps_its_name_and_every_field_has_a_row():
    assert sorted(CHANGED) == sorted(row.variable for row in HOOK)
    fields = {
        (f.name, g.name)
        for f in dataclasses.fields(Settings)
        if f.default_factory is not dataclasses.MISSING
        for g in dataclasses.fields(f.default_factory)
    }
    fields |= {("", f.name) for f in dataclasses.fields(Settings) if f.default_factory is dataclasses.MISSING}
    assert {(row.group, row.field) for row in HOOK} == fields


def test_a_keyword_is_the_variable_without_its_prefix_but_for_one_older_name():
    assert {row.keyword for row in HOOK if row.variable != "OOMSIGHT_" + row.keyword.upper()} == {"spool_dir"}
    assert [row.keyword for row in HOOK if row.env] == ["spool_dir"]


def test_start_takes_exactly_the_tables_keywords_with_their_defaults():
    params = inspect.signature(oomsight.start).parameters
    assert list(params) == [row.keyword for row in HOOK]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert params["window_seconds"].default == Settings().sampling.window_seconds
    assert params["record_history"].annotation is bool


@pytest.mark.parametrize(
    "keywords, fragment",
    [
        ({"window_seconds": 0.5}, "OOMSIGHT_WINDOW_SECONDS=0.5 is shorter than OOMSIGHT_PUBLISH_INTERVAL_SECONDS=1"),
        ({"history_mode": "none"}, "history_mode='none' is not one of all, state"),
        ({"window_seconds": -1}, "window_seconds='-1' must be between"),
        ({"profile_steps": 2.5}, "profile_steps='2.5' is not a whole number"),
        ({"sample_interval_seconds": True}, "sample_interval_seconds=True is not a float"),
        ({"step_peaks": "maybe"}, "step_peaks='maybe' is not a boolean"),
        ({"history_max_entries": None}, "history_max_entries=None is not a int"),
    ],
)
def test_a_keyword_is_read_and_checked_as_its_variable(keywords, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Settings().replace(**keywords)


def test_a_keyword_given_as_text_or_number_means_what_its_variable_would():
    s = Settings().replace(step_peaks="yes", window_seconds=90, history_max_entries=12, record_history=1)
    assert (s.steps.peaks, s.sampling.window_seconds, s.history.max_entries, s.history.record) == (True, 90.0, 12, True)
    assert isinstance(s.sampling.window_seconds, float)


def test_the_generated_settings_and_documentation_are_those_of_the_table():
    assert rendering.main(["--check"]) == 0


def test_the_check_sees_a_drifted_documentation_table(tmp_path, monkeypatch, capsys):
    with open(rendering.CONFIGURATION_MD, encoding="utf-8") as fh:
        doc = fh.read()
    stale = tmp_path / "configuration.md"
    stale.write_text(doc.replace("| `OOMSIGHT_NVML` | `nvml` | `1` |", "| `OOMSIGHT_NVML` | `nvml` | `0` |"))
    monkeypatch.setattr(rendering, "CONFIGURATION_MD", str(stale))
    assert rendering.main(["--check"]) == 1
    assert "configuration.md differs from the settings table" in capsys.readouterr().out
    assert rendering.main([]) == 0 and stale.read_text() == doc
    with pytest.raises(ValueError, match="no <!-- settings:hook -->"):
        rendering.markdown("# a page without the section\n")


NEW_ROW = Setting(
    "leak_scan_interval_seconds", "steps", "leak_scan_interval_seconds", 300.0, parse_count, "a setting made here"
)
"""A row added in a test (parsed as a count, so a bad value's message is the count parser's)."""


def _module_of(source, monkeypatch):
    module = types.ModuleType("generated_settings")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, "<generated>", "exec"), module.__dict__)
    return module


def test_a_row_added_to_the_table_is_a_variable_a_field_a_keyword_and_a_documented_line(monkeypatch):
    rows = (*HOOK, NEW_ROW)
    generated = _module_of(rendering.python_module(GROUPS, rows), monkeypatch)
    assert "leak_scan_interval_seconds" in {f.name for f in dataclasses.fields(generated.StepSettings)}
    assert generated.Settings().steps.leak_scan_interval_seconds == 300.0
    assert _undocumented_fields(generated.StepSettings, rendering.python_module(GROUPS, rows)) == []
    read = table.from_env(generated.Settings, rows, {"OOMSIGHT_LEAK_SCAN_INTERVAL_SECONDS": "60"})
    assert read.steps.leak_scan_interval_seconds == 60
    with pytest.raises(ConfigError, match=re.escape("OOMSIGHT_LEAK_SCAN_INTERVAL_SECONDS='soon' is not a whole")):
        table.from_env(generated.Settings, rows, {"OOMSIGHT_LEAK_SCAN_INTERVAL_SECONDS": "soon"})
    kept = table.apply(generated.Settings(), table.read_keywords(rows, {"leak_scan_interval_seconds": 7}))
    assert kept.steps.leak_scan_interval_seconds == 7 and kept.steps.hook is True
    assert "| `OOMSIGHT_LEAK_SCAN_INTERVAL_SECONDS` | `leak_scan_interval_seconds` | `300` | a setting made here |" in (
        rendering.markdown_table(rows)
    )
    assert "leak_scan_interval_seconds" in table.signature(rows).parameters
    # and the table in use does not have it
    assert "leak_scan_interval_seconds" not in {f.name for f in dataclasses.fields(config.StepSettings)}


def test_a_group_added_to_the_table_is_a_class_and_a_field_of_the_root(monkeypatch):
    groups = (*GROUPS, Group("leaks", "LeakSettings", "The leak scan."))
    rows = (*HOOK, Setting("leak_scan", "leaks", "enabled", True, parse_bool, "scan for leaks"))
    generated = _module_of(rendering.python_module(groups, rows), monkeypatch)
    assert generated.Settings().leaks == generated.LeakSettings(enabled=True)
    assert table.from_env(generated.Settings, rows, {"OOMSIGHT_LEAK_SCAN": "0"}).leaks.enabled is False


def _documented(cls, source=None):
    """The fields of the class ``cls`` with a docstring right below them (ast: the class source,
    found in the module's ``source`` when given)."""
    if source is None:
        node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    else:
        node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    body = node.body
    return {
        node.target.id
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


def _undocumented_fields(cls, source=None):
    """Fields of the dataclass ``cls`` without a docstring, in its class or the class that declares them."""
    documented = set().union(*(_documented(c, source) for c in cls.__mro__ if dataclasses.is_dataclass(c)))
    return [f.name for f in dataclasses.fields(cls) if f.name not in documented]


HOOK_GROUPS = [f.default_factory for f in dataclasses.fields(Settings) if f.default_factory is not dataclasses.MISSING]
"""The hook's settings groups, as the fields of its root ``Settings``."""

SETTINGS_GROUPS = [
    *HOOK_GROUPS,
    Settings,
    Setting,
    Group,
    SidecarSettings,
    AdminSettings,
    KubernetesSettings,
    ServerLimits,
    WebhookSettings,
    InjectionSettings,
]


@pytest.mark.parametrize("group", SETTINGS_GROUPS, ids=lambda cls: cls.__name__)
def test_every_settings_field_has_a_docstring(group):
    assert group.__doc__ and dataclasses.is_dataclass(group)
    assert _undocumented_fields(group) == []


def test_every_hook_group_is_frozen_and_exported():
    assert len(HOOK_GROUPS) == len(GROUPS) == 8
    for group in HOOK_GROUPS:
        assert getattr(config, group.__name__) is group
        with pytest.raises(dataclasses.FrozenInstanceError):
            group().x = 1


# One parser for every component (issue 11): the same words, the same limits, the variable named.


@pytest.mark.parametrize("raw, value", [("1", True), ("YES", True), ("on", True), ("0", False), ("Off", False)])
def test_every_component_reads_a_boolean_the_same_way(raw, value):
    assert parse_bool("X", raw) is value
    assert KubernetesSettings.from_env({"OOMSIGHT_EVENTS": raw}).events is value
    injection = InjectionSettings.from_env({"OOMSIGHT_INJECT_IMAGE": "i", "OOMSIGHT_INJECT_EVENTS": raw})
    assert injection.events is value
    assert (
        AdminSettings.from_env({"OOMSIGHT_ADMIN_REQUIRE_TOKEN": raw, "OOMSIGHT_ADMIN_TOKEN": "t"}).require_token
        is value
    )


@pytest.mark.parametrize(
    "component, env, fragment",
    [
        (
            SidecarSettings,
            {"OOMSIGHT_SIDECAR_PORT": "\u0661\u0662\u0663\u0664"},
            "OOMSIGHT_SIDECAR_PORT='\u0661\u0662\u0663\u0664' is not a TCP port",
        ),
        (SidecarSettings, {"OOMSIGHT_SIDECAR_PORT": "70000"}, "OOMSIGHT_SIDECAR_PORT='70000' is not a TCP port"),
        (SidecarSettings, {"OOMSIGHT_DRAIN_SECONDS": "nan"}, "OOMSIGHT_DRAIN_SECONDS='nan' is not a number of seconds"),
        (SidecarSettings, {"OOMSIGHT_RETENTION_SECONDS": "-5"}, "OOMSIGHT_RETENTION_SECONDS='-5' must be between"),
        (SidecarSettings, {"OOMSIGHT_SIDECAR_MAX_CONNECTIONS": "0"}, "OOMSIGHT_SIDECAR_MAX_CONNECTIONS='0' must be"),
        (KubernetesSettings, {"OOMSIGHT_EVENTS": "maybe"}, "OOMSIGHT_EVENTS='maybe' is not a boolean"),
        (KubernetesSettings, {"OOMSIGHT_EVENTS_MAX": "1e3"}, "OOMSIGHT_EVENTS_MAX='1e3' is not a whole number"),
        (AdminSettings, {"OOMSIGHT_ADMIN_PORT": "²"}, "OOMSIGHT_ADMIN_PORT='²' is not a TCP port"),
        (WebhookSettings, {"OOMSIGHT_WEBHOOK_PORT": "https"}, "OOMSIGHT_WEBHOOK_PORT='https' is not a TCP port"),
        (WebhookSettings, {"OOMSIGHT_WEBHOOK_MAX_CONTAINERS": "many"}, "OOMSIGHT_WEBHOOK_MAX_CONTAINERS='many'"),
        (WebhookSettings, {"OOMSIGHT_WEBHOOK_TLS_RECONCILE_SECONDS": "inf"}, "is not a number of seconds"),
    ],
)
def test_a_bad_server_setting_names_its_variable(component, env, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        component.from_env({"OOMSIGHT_WEBHOOK_TLS_MODE": "files", **env})


def test_only_ascii_digits_make_a_number():
    assert [ascii_int(raw) for raw in ("42", "-3", "²", "①", "\u0661\u0662", "1_000", "4" * 4301, "")] == [
        42,
        -3,
        None,
        None,
        None,
        None,
        None,
        None,
    ]
    with pytest.raises(ConfigError, match="OOMSIGHT_HISTORY_MAX_ENTRIES='\u0661\u0660' is not a whole number"):
        Settings.from_env({"OOMSIGHT_HISTORY_MAX_ENTRIES": "\u0661\u0660"})


def test_blank_server_settings_keep_their_defaults_and_set_ones_are_read():
    assert SidecarSettings.from_env({"OOMSIGHT_SIDECAR_PORT": " ", "OOMSIGHT_DRAIN_SECONDS": ""}).port == 21400
    s = SidecarSettings.from_env(
        {"OOMSIGHT_SIDECAR_PORT": "8080", "OOMSIGHT_SIDECAR_IDLE_TIMEOUT_SECONDS": "2.5", "OOMSIGHT_DRAIN_SECONDS": "0"}
    )
    assert (s.port, s.limits.idle_timeout_seconds, s.drain_seconds) == (8080, 2.5, 0.0)
    w = WebhookSettings.from_env({"OOMSIGHT_WEBHOOK_TLS_MODE": "files", "OOMSIGHT_WEBHOOK_MAX_CONNECTIONS": "3"})
    assert (w.limits.max_connections, w.limits.request_timeout_seconds, w.max_review_bytes) == (3, 10.0, 1024 * 1024)


def test_the_metrics_port_is_defined_once():
    assert SidecarSettings().port == InjectionSettings(image="i").metrics_port == DEFAULT_METRICS_PORT


def test_every_server_env_var_is_documented():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as fh:
        doc = fh.read()
    names = [
        *(row.variable for row in (*SIDECAR, *WEBHOOK) if row.group == "limits"),
        "OOMSIGHT_SIDECAR_HUNG_AFTER_SECONDS",
        "OOMSIGHT_ADMIN_REQUIRE_TOKEN",
        "OOMSIGHT_WEBHOOK_MAX_REVIEW_BYTES",
        "OOMSIGHT_WEBHOOK_MAX_CONTAINERS",
        "OOMSIGHT_WEBHOOK_MAX_CONCURRENT_REVIEWS",
    ]
    assert [name for name in names if name not in doc] == []


# The sidecar's table (oomsight.config.variables.SIDECAR): the same rows, without start() keywords.
SIDECAR_CHANGED = {
    "OOMSIGHT_DIR": (SidecarSettings, "spool_dir", "/spool", "/spool"),
    "OOMSIGHT_SIDECAR_PORT": (SidecarSettings, "port", "8080", 8080),
    "OOMSIGHT_SIDECAR_HOST": (SidecarSettings, "host", "::", "::"),
    "OOMSIGHT_RETENTION_SECONDS": (SidecarSettings, "retention_seconds", "60", 60.0),
    "OOMSIGHT_STALE_AFTER_SECONDS": (SidecarSettings, "stale_after_seconds", "5", 5.0),
    "OOMSIGHT_DRAIN_SECONDS": (SidecarSettings, "drain_seconds", "7.5", 7.5),
    "OOMSIGHT_SIDECAR_HUNG_AFTER_SECONDS": (SidecarSettings, "hung_after_seconds", "3", 3.0),
    "OOMSIGHT_ADMIN_HOST": (AdminSettings, "host", "localhost", "localhost"),
    "OOMSIGHT_ADMIN_PORT": (AdminSettings, "port", "auto", None),
    "OOMSIGHT_ADMIN_TOKEN": (AdminSettings, "token", "s3cret", "s3cret"),
    "OOMSIGHT_ADMIN_TOKEN_FILE": (AdminSettings, "token_file", "/nonexistent/token", "/nonexistent/token"),
    "OOMSIGHT_ADMIN_REQUIRE_TOKEN": (AdminSettings, "require_token", "1", True),
    "OOMSIGHT_POD_NAME": (KubernetesSettings, "pod_name", "w-0", "w-0"),
    "OOMSIGHT_POD_NAMESPACE": (KubernetesSettings, "pod_namespace", "team-a", "team-a"),
    "OOMSIGHT_POD_UID": (KubernetesSettings, "pod_uid", "u-1", "u-1"),
    "OOMSIGHT_OWNER_KIND": (KubernetesSettings, "owner_kind", "Job", "Job"),
    "OOMSIGHT_OWNER_NAME": (KubernetesSettings, "owner_name", "train", "train"),
    "OOMSIGHT_EVENTS": (KubernetesSettings, "events", "off", False),
    "OOMSIGHT_EVENTS_INTERVAL_SECONDS": (KubernetesSettings, "events_interval_seconds", "9", 9.0),
    "OOMSIGHT_EVENTS_MAX": (KubernetesSettings, "events_max", "0", 0),
    "OOMSIGHT_RESOURCE_CLAIMS": (KubernetesSettings, "resource_claims", "on", True),
}
"""Every variable of the sidecar users may have set, its group and field, and a value unlike the default."""


@pytest.mark.parametrize("name", sorted(SIDECAR_CHANGED))
def test_each_sidecar_variable_keeps_its_name_and_sets_its_field(name):
    component, field, raw, value = SIDECAR_CHANGED[name]
    extra = {"OOMSIGHT_ADMIN_TOKEN_FILE": "/t"} if name == "OOMSIGHT_ADMIN_REQUIRE_TOKEN" else {}
    assert getattr(component(), field) != value
    assert getattr(component.from_env({name: raw, **extra}), field) == value
    assert getattr(component.from_env({name: "  "}), field) == getattr(component(), field)  # blanks keep it


def test_the_sidecar_table_has_exactly_the_variables_and_fields_of_its_groups():
    assert sorted(row.variable for row in SIDECAR if row.group != "limits") == sorted(SIDECAR_CHANGED)
    by_group = {"sidecar": SidecarSettings, "admin": AdminSettings, "pod": KubernetesSettings, "limits": ServerLimits}
    assert {(row.group, row.field) for row in SIDECAR} == {
        (group, f.name) for group, cls in by_group.items() for f in dataclasses.fields(cls) if f.name != "limits"
    }
    # one variable, two readers: the spool both the hook and the sidecar read is one row's name
    assert [row.variable for row in (*HOOK, *SIDECAR) if row.env] == ["OOMSIGHT_DIR", "OOMSIGHT_DIR"]
    assert {row.variable for row in HOOK} & {row.variable for row in SIDECAR} == {"OOMSIGHT_DIR"}


WEBHOOK_CHANGED = {
    "OOMSIGHT_WEBHOOK_HOST": ("host", "::", "::"),
    "OOMSIGHT_WEBHOOK_PORT": ("port", "8443", 8443),
    "OOMSIGHT_WEBHOOK_METRICS_PORT": ("metrics_port", "0", 0),
    "OOMSIGHT_WEBHOOK_TLS_MODE": ("tls_mode", "files", "files"),
    "OOMSIGHT_WEBHOOK_CERT_FILE": ("cert_file", "/c.pem", "/c.pem"),
    "OOMSIGHT_WEBHOOK_KEY_FILE": ("key_file", "/k.pem", "/k.pem"),
    "OOMSIGHT_WEBHOOK_CERT_DIR": ("cert_dir", "/certs", "/certs"),
    "OOMSIGHT_WEBHOOK_NAMESPACE": ("namespace", "ns", "ns"),
    "OOMSIGHT_WEBHOOK_SERVICE": ("service", "svc", "svc"),
    "OOMSIGHT_WEBHOOK_SECRET": ("secret", "sec", "sec"),
    "OOMSIGHT_WEBHOOK_CONFIGURATION": ("configuration", "cfg", "cfg"),
    "OOMSIGHT_WEBHOOK_TLS_RECONCILE_SECONDS": ("tls_reconcile_seconds", "5", 5.0),
    "OOMSIGHT_WEBHOOK_MAX_BODY_BYTES": ("max_body_bytes", "2097152", 2 * 1024 * 1024),
    "OOMSIGHT_WEBHOOK_MAX_REVIEW_BYTES": ("max_review_bytes", "4096", 4096),
    "OOMSIGHT_WEBHOOK_MAX_CONTAINERS": ("max_containers", "9", 9),
    "OOMSIGHT_WEBHOOK_MAX_CONCURRENT_REVIEWS": ("max_concurrent_reviews", "3", 3),
}
"""Every variable of the webhook's server users (and the chart) may have set, with its field and a value."""


@pytest.mark.parametrize("name", sorted(WEBHOOK_CHANGED))
def test_each_webhook_variable_keeps_its_name_and_sets_its_field(name):
    field, raw, value = WEBHOOK_CHANGED[name]
    files = {"OOMSIGHT_WEBHOOK_TLS_MODE": "files"}  # self mode needs its Secret's names
    assert getattr(WebhookSettings(), field) != value
    assert getattr(WebhookSettings.from_env({**files, name: raw}), field) == value
    blank = {**files, name: " "} if name != "OOMSIGHT_WEBHOOK_TLS_MODE" else {**files, "OOMSIGHT_WEBHOOK_PORT": " "}
    assert getattr(WebhookSettings.from_env(blank), field) == getattr(WebhookSettings.from_env(files), field)


def test_the_webhook_table_has_exactly_the_variables_and_fields_of_its_settings():
    assert sorted(row.variable for row in WEBHOOK if row.group != "limits") == sorted(WEBHOOK_CHANGED)
    fields = {f.name for f in dataclasses.fields(WebhookSettings)} - {"limits"}
    assert {row.field for row in WEBHOOK if row.group != "limits"} == fields
    assert {row.field for row in WEBHOOK if row.group == "limits"} == {f.name for f in dataclasses.fields(ServerLimits)}


# --- every variable one row; the docs', the code's and the flags' defaults one (issue 35) ---

SOURCES = ("exporter", "server", "sidecar", "webhook")
_NAME = re.compile(r"OOMSIGHT_[A-Z0-9_]*[A-Z0-9]\b")
_LITERAL = re.compile(r"[\"']OOMSIGHT_[A-Z0-9_]+[\"']")
DEPENDENCY_FREE = {os.path.join("exporter", "oomsight", "hook", "bootstrap", "sitecustomize.py")}
"""Copied alone into the training container (zero-code mode): it cannot import the table, so it
names ``OOMSIGHT_DISABLED`` as a literal (still a row's variable, checked below)."""


def _sources():
    for top in SOURCES:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as fh:
                        yield os.path.relpath(path, ROOT), fh.read()


def test_every_oomsight_variable_the_source_names_is_a_row_of_a_settings_table():
    rows = {row.variable for rows in TABLES.values() for row in rows}
    examples = {"OOMSIGHT_X"}  # the parsers' docstring's placeholder
    named = {(path, name) for path, text in _sources() for name in _NAME.findall(text)}
    assert sorted((path, name) for path, name in named if name not in rows | examples) == []


def test_no_variable_name_is_written_as_a_literal_outside_the_table():
    table_module = os.path.join("exporter", "oomsight", "config", "variables.py")
    found = [(path, literal) for path, text in _sources() if path != table_module for literal in _LITERAL.findall(text)]
    rows = {row.variable for rows in TABLES.values() for row in rows}
    assert [(p, lit) for p, lit in found if p not in DEPENDENCY_FREE] == []
    assert all(lit.strip("\"'") in rows for _p, lit in found)


def _documented_defaults() -> dict[str, str]:
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        doc = fh.read()
    out = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `OOMSIGHT_") and len(cells) >= 3:
            out[cells[0].strip("`")] = cells[-2]
    return out


def _code_defaults() -> dict[str, object]:
    """Every row's default as the component's own dataclass holds it."""
    out: dict[str, object] = {}
    hook = Settings()
    for row in HOOK:
        out[row.variable] = getattr(getattr(hook, row.group) if row.group else hook, row.field)
    groups = {"sidecar": SidecarSettings(), "admin": AdminSettings(), "pod": KubernetesSettings()}
    for row in SIDECAR:
        holder = SidecarSettings().limits if row.group == "limits" else groups[row.group]
        out[row.variable] = getattr(holder, row.field)
    for row in WEBHOOK:
        holder = WebhookSettings().limits if row.group == "limits" else WebhookSettings()
        out[row.variable] = getattr(holder, row.field)
    inject = InjectionSettings(image="")
    for row in INJECT:
        holder = inject.resources if hasattr(inject.resources, row.field) else inject
        value = getattr(holder, row.field, None)
        out[row.variable] = ",".join(value) if isinstance(value, tuple) else value
    mode, hint = InjectionSettings.native_mode({})  # read at start, before the settings are made
    out[INJECT[2].variable], out[INJECT[3].variable] = mode, hint
    return out


def _flag_defaults() -> dict[str, str]:
    """The default each flag's help of ``oomsight sidecar`` and ``oomsight webhook`` states, by variable."""
    import argparse

    from oomsight_sidecar.command import register as sidecar
    from oomsight_webhook.command import register as webhook

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sidecar(sub)
    webhook(sub)
    out = {}
    for command in sub.choices.values():
        for action in command._actions:
            found = re.search(r"\(\$(OOMSIGHT_[A-Z_]+); default (.*)\)$", action.help or "")
            if found:
                out[found.group(1)] = found.group(2)
    return out


@pytest.mark.parametrize("row", [r for rows in TABLES.values() for r in rows], ids=lambda r: r.variable)
def test_the_documented_default_is_the_codes_and_the_flags(row):
    """dcgm-exporter's check: one default per knob, wherever it is stated."""
    documented = _documented_defaults()[row.variable]
    assert documented == table.shown_default(row)
    code = _code_defaults()[row.variable]
    if row.keyword == "inject_image":
        assert documented == "required" and code == ""
    elif not callable(row.default):
        assert code == row.default_value(), row.variable
    if row.flag:
        assert _flag_defaults()[row.variable] == documented.replace("`", "")


def test_every_flag_of_the_servers_has_a_row():
    assert set(_flag_defaults()) == {row.variable for rows in TABLES.values() for row in rows if row.flag}


def test_the_webhooks_connection_cap_is_documented_as_the_code_has_it():
    assert WebhookSettings().limits.max_connections == 256
    assert _documented_defaults()["OOMSIGHT_WEBHOOK_MAX_CONNECTIONS"] == "`256`"


def test_server_limits_default_to_the_sidecars_rows():
    sidecar = {row.field: row.default_value() for row in SIDECAR if row.group == "limits"}
    assert dataclasses.asdict(ServerLimits()) == sidecar


@pytest.mark.parametrize("command", ["sidecar", "webhook"])
def test_the_servers_port_flags_use_the_clis_validating_port_number(command, capsys):
    import argparse

    from oomsight.config.values import port_number
    from oomsight_sidecar.command import register as sidecar
    from oomsight_webhook.command import register as webhook

    parser = argparse.ArgumentParser(prog="oomsight")
    sub = parser.add_subparsers()
    sidecar(sub)
    webhook(sub)
    assert {a.type for a in sub.choices[command]._actions if "--port" in a.option_strings} == {port_number}
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([command, "--port", "70000"])
    assert exit_.value.code == 2
    assert "70000 is not a TCP port (0 to 65535; 0 picks a free one)" in capsys.readouterr().err
