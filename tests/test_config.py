import os

import pytest

from oomsight.config import ALL_ENV_VARS, ConfigError, Settings

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
