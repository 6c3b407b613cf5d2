import os
import re

import pytest

from oomsight.config import ALL_ENV_VARS, DEFAULT_METRICS_PORT, ConfigError, Settings, ascii_int, parse_bool
from oomsight_sidecar.listener import limit_env_names
from oomsight_sidecar.settings import AdminSettings, KubernetesSettings, SidecarSettings
from oomsight_webhook.injection import InjectionSettings
from oomsight_webhook.settings import WebhookSettings

from fakes import ROOT


def test_defaults_need_no_environment():
    s = Settings.from_env({})
    assert s.sample_interval_seconds == 0.1
    assert s.step_peaks is False
    assert s.spool_dir.endswith("oomsight")


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
    assert (s.spool_dir, s.sample_interval_seconds, s.publish_interval_seconds) == ("/x", 0.5, 2.0)
    assert s.step_peaks and s.record_history and not s.nvml
    assert s.history_max_entries == 500


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"OOMSIGHT_STEP_PEAKS": "maybe"}, "OOMSIGHT_STEP_PEAKS='maybe' is not a boolean"),
        ({"OOMSIGHT_SAMPLE_INTERVAL_SECONDS": "fast"}, "is not a number of seconds"),
        ({"OOMSIGHT_SAMPLE_INTERVAL_SECONDS": "-1"}, "must be between"),
        ({"OOMSIGHT_HISTORY_MAX_ENTRIES": "0"}, "must be at least 1"),
        ({"OOMSIGHT_PUBLISH_INTERVAL_SECONDS": "0.01"}, "shorter than OOMSIGHT_SAMPLE_INTERVAL_SECONDS"),
    ],
)
def test_a_bad_value_names_the_variable(env, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        Settings.from_env(env)


def test_replace_rejects_unknown_settings():
    with pytest.raises(ConfigError, match="unknown oomsight setting"):
        Settings().replace(sampel_interval_seconds=1)


def test_every_env_var_is_documented():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as fh:
        doc = fh.read()
    missing = [name for name in ALL_ENV_VARS if name not in doc]
    assert not missing


def test_the_default_spool_dir_is_named_not_probed(monkeypatch):
    # tempfile.gettempdir() would skip an unusable $TMPDIR (and raise where nothing is writable:
    # a read-only root filesystem, as the sidecar runs); the default must only name the folder
    monkeypatch.setenv("TMPDIR", "/nonexistent/tmp")
    assert Settings().spool_dir == "/nonexistent/tmp/oomsight"
    assert Settings.from_env({"OOMSIGHT_DIR": "/spool"}).spool_dir == "/spool"


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
        *limit_env_names("OOMSIGHT_SIDECAR"),
        *limit_env_names("OOMSIGHT_WEBHOOK"),
        "OOMSIGHT_SIDECAR_HUNG_AFTER_SECONDS",
        "OOMSIGHT_ADMIN_REQUIRE_TOKEN",
        "OOMSIGHT_WEBHOOK_MAX_REVIEW_BYTES",
        "OOMSIGHT_WEBHOOK_MAX_CONTAINERS",
        "OOMSIGHT_WEBHOOK_MAX_CONCURRENT_REVIEWS",
    ]
    assert [name for name in names if name not in doc] == []
