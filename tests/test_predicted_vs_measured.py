"""Predicted vs measured on the fleet (issue 16): a job carries its prediction (OOMSIGHT_PREDICTION
or oomsight.record_prediction), the hook writes it into its snapshot, the reader exports it next
to the measured peak, and the reports show the error."""

import copy
import json
import logging
import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import oomsight
from oomsight.analysis.inventory import take_inventory
from oomsight.config import Settings
from oomsight.hook import runtime
from oomsight.hook.prediction import PredictionError, from_setting, from_value, parse_size
from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import report, report_html, tape
from oomsight.tools.demo import TAPE
from oomsight.wire.schema import validate
from oomsight.wire.spool import SpoolReader

from fakes import GIB, FakeCuda
from panelquery import DASHBOARDS, load, panels
from spoolmaker import hooked_process

PREDICT_JSON = {  # what `oomsight predict --model gpt2 --batch 8 --json` prints (tools/predict_command.py)
    "prediction": {
        "batch_size": 8,
        "peak_allocated_bytes": 4 * GIB + GIB // 10,
        "peak_reserved_bytes": 5 * GIB - GIB // 4,
        "by_category_bytes": {"parameters": GIB},
        "step_peak_allocated_bytes": [4 * GIB, 4 * GIB],
        "steps": 3,
        "expandable_segments": False,
        "workspace_bytes": 67108864,
        "seconds": 4.2,
        "fits": None,
        "oom_in_replay": None,
        "notes": [],
    }
}


@pytest.fixture
def predict_file(tmp_path):
    path = tmp_path / "prediction.json"
    path.write_text(json.dumps(PREDICT_JSON, indent=1))
    return str(path)


@pytest.mark.parametrize(
    "text, size", [("30GiB", 30 * GIB), ("40 GB", 40 * 10**9), ("1e9", 10**9), ("512", 512), ("1.5MiB", 3 << 19)]
)
def test_a_size_is_read_in_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "thirty", "30 parsecs", "-1GiB", "/job/prediction.json", "٣GiB"])
def test_what_is_not_a_size_is_not_read_as_one(text):
    assert parse_size(text) is None


def test_the_setting_reads_the_json_of_oomsight_predict(predict_file):
    p = from_setting(predict_file, clock=lambda: 1e9)
    assert p == {
        "peak_allocated_bytes": 4 * GIB + GIB // 10,
        "peak_reserved_bytes": 5 * GIB - GIB // 4,
        "source": "env",
        "model": None,
        "batch_size": 8,
        "recorded_at": 1e9,
    }


def test_the_setting_takes_a_bare_size_as_the_peak_allocated():
    p = from_setting(" 30GiB ")
    assert (p["peak_allocated_bytes"], p["peak_reserved_bytes"], p["source"]) == (30 * GIB, None, "env")


def test_the_api_takes_a_prediction_its_dict_bytes_or_a_size_and_the_details_it_lacks():
    class Prediction:  # as oomsight.predict_peak returns it
        def to_dict(self):
            return dict(PREDICT_JSON["prediction"])

    assert from_value(Prediction(), model="gpt2")["model"] == "gpt2"
    assert from_value(PREDICT_JSON)["peak_reserved_bytes"] == 5 * GIB - GIB // 4
    assert from_value({**PREDICT_JSON, "model": "llama"})["model"] == "llama"
    bare = from_value(3 * GIB, reserved_bytes=4 * GIB, batch_size=16)
    assert (bare["peak_allocated_bytes"], bare["peak_reserved_bytes"], bare["batch_size"]) == (3 * GIB, 4 * GIB, 16)
    assert from_value("2GiB")["source"] == "api"


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("/nonexistent/prediction.json", "is neither a size nor a readable file"),
        (True, "a prediction is bytes, a size, a path or oomsight predict's output"),
        (-5, "must be a whole number from 1"),
        (2**64, "must be a whole number from 1"),
        (1.5e9, "a prediction is bytes"),
        ({"prediction": {"peak_reserved_bytes": 1}}, "no peak_allocated_bytes"),
        ({"peak_allocated_bytes": "4GiB"}, "must be a whole number"),
        ({"peak_allocated_bytes": GIB, "peak_reserved_bytes": 0}, "must be a whole number"),
        ("   ", "it is empty"),
    ],
)
def test_a_bad_value_is_a_prediction_error_that_says_what_was_expected(value, fragment):
    with pytest.raises(PredictionError, match=fragment):
        from_value(value)


def test_a_file_that_is_not_predict_output_is_a_prediction_error(tmp_path):
    (tmp_path / "notes.txt").write_text("peak about 30 GiB")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "big.json").write_bytes(b" " * (2 << 20))
    with pytest.raises(PredictionError, match="is not JSON"):
        from_setting(str(tmp_path / "notes.txt"))
    with pytest.raises(PredictionError, match="holds no JSON object"):
        from_setting(str(tmp_path / "list.json"))
    with pytest.raises(PredictionError, match="larger than"):
        from_setting(str(tmp_path / "big.json"))


def test_a_bad_setting_is_one_warning_counted_and_the_hook_still_runs(tmp_path, caplog):
    settings = Settings.from_env({"OOMSIGHT_PREDICTION": str(tmp_path / "missing.json")})
    with caplog.at_level(logging.WARNING, logger="oomsight.hook"):
        hook = runtime.Hook(settings.replace(spool_dir=str(tmp_path)), FakeCuda(), None)
    assert hook.prediction is None and hook.errors.counts["prediction"] == 1
    (message,) = [r.getMessage() for r in caplog.records]
    assert "prediction failed" in message and "OOMSIGHT_PREDICTION takes the path of" in message


def _published(spool, hook):
    hook.sampler.publish()
    (snap,) = SpoolReader(spool).read().snapshots
    return snap


def test_the_snapshot_carries_the_prediction_on_the_process_device_and_validates(tmp_path, predict_file, monkeypatch):
    spool = str(tmp_path / "spool")
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)
    assert _published(spool, hook)["devices"][0]["prediction"] is None
    assert hook.record_prediction(predict_file, model="gpt2")
    snap = _published(spool, hook)
    p = snap["devices"][0]["prediction"]
    assert (p["peak_allocated_bytes"], p["model"], p["source"]) == (4 * GIB + GIB // 10, "gpt2", "api")
    assert validate(copy.deepcopy(snap)) == "snapshot"


def test_a_snapshot_written_before_predictions_still_reads_with_none():
    _, records = tape.read(TAPE)  # the shipped H200 recording: revision 1, long before predictions
    doc = next(r["doc"] for r in records if r["path"].startswith("snapshots/"))
    assert "prediction" not in doc["devices"][0]
    validate(doc, fill_defaults=True)
    assert doc["devices"][0]["prediction"] is None


def test_the_public_api_never_raises_and_counts_a_bad_value(tmp_path, monkeypatch):
    hook, _ = hooked_process(str(tmp_path), monkeypatch=monkeypatch)
    monkeypatch.setattr(runtime, "_hook", hook)
    assert oomsight.record_prediction(object()) is False
    assert oomsight.record_prediction("a lot") is False
    assert hook.errors.counts["prediction"] == 2 and hook.prediction is None
    assert oomsight.record_prediction(3 * GIB, model="resnet50") is True
    assert hook.prediction["model"] == "resnet50"


def test_a_prediction_before_the_hook_starts_is_kept_for_it(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "_hook", None)
    monkeypatch.setattr(runtime, "_pending_prediction", None)
    with caplog.at_level(logging.WARNING, logger="oomsight.hook.runtime"):
        assert oomsight.record_prediction({"nothing": 1}) is False
    assert "prediction not recorded" in caplog.text and runtime._pending_prediction is None
    assert oomsight.record_prediction("12GiB") is True
    assert runtime._pending_prediction["peak_allocated_bytes"] == 12 * GIB


def _labels():
    return {"rank": "0", "local_rank": "0", "device": "0", "gpu_uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"}


def test_the_predicted_peaks_are_exported_with_the_measured_peaks_labels(tmp_path, predict_file, monkeypatch):
    spool = str(tmp_path)
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)
    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool))
    assert reg.get_sample_value("oomsight_predicted_peak_allocated_bytes", _labels()) is None
    hook.record_prediction(predict_file)
    hook.sampler.publish()
    assert reg.get_sample_value("oomsight_predicted_peak_allocated_bytes", _labels()) == 4 * GIB + GIB // 10
    assert reg.get_sample_value("oomsight_predicted_peak_reserved_bytes", _labels()) == 5 * GIB - GIB // 4
    assert reg.get_sample_value("oomsight_torch_peak_allocated_bytes", _labels()) == 4 * GIB
    text = generate_latest(reg).decode()
    assert "# TYPE oomsight_predicted_peak_allocated_bytes gauge" in text
    hook.record_prediction(2 * GIB)  # a bare size: no reserved prediction, so no series for it
    hook.sampler.publish()
    assert reg.get_sample_value("oomsight_predicted_peak_reserved_bytes", _labels()) is None


def test_the_report_prints_predicted_against_measured_with_the_error(tmp_path, predict_file, monkeypatch):
    spool = str(tmp_path)
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)  # measured: peak allocated 4 GiB, reserved 5 GiB
    inv = take_inventory(SpoolReader(spool).read(), now=hook.sampler.clock())
    assert "prediction" not in report.render(inv, spool)
    hook.record_prediction(predict_file, model="gpt2")
    hook.sampler.publish()
    inv = take_inventory(SpoolReader(spool).read(), now=hook.sampler.clock())
    (line,) = [x for x in report.render(inv, spool).splitlines() if "prediction (" in x]
    assert line == (
        "    prediction (api, gpt2, batch 8): peak allocated predicted 4.10 GiB, measured 4.00 GiB: error +2.5 %; "
        "peak reserved predicted 4.75 GiB, measured 5.00 GiB: error -5.0 %"
    )


def test_the_error_is_relative_to_the_measured_peak():
    assert report.prediction_error(110, 100) == pytest.approx(0.10)
    assert report.prediction_error(90, 100) == pytest.approx(-0.10)
    assert report.prediction_error(None, 100) is None and report.prediction_error(5, 0) is None


def test_the_html_report_has_a_prediction_section_only_with_a_prediction(tmp_path, predict_file, monkeypatch):
    spool = str(tmp_path)
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)
    assert "Predicted vs measured peak" not in report_html.build(spool, hook.sampler.clock(), 3600)
    hook.record_prediction(predict_file)
    hook.sampler.publish()
    page = report_html.build(spool, hook.sampler.clock(), 3600)
    assert "Predicted vs measured peak" in page and "+2.5 %" in page and "-5.0 %" in page


def test_the_pod_dashboard_shows_predicted_against_measured_and_the_error():
    board = load(os.path.join(DASHBOARDS, "oomsight-pod.json"))
    by_title = {p["title"]: p for p in panels(board)}
    over_time, errors = by_title["Predicted vs measured peak"], by_title["Prediction error"]
    exprs = [t["expr"] for t in over_time["targets"]]
    assert exprs[0].startswith("max_over_time(oomsight_torch_peak_allocated_bytes{")
    assert "and on (" in exprs[0] and "oomsight_predicted_peak_allocated_bytes{" in exprs[0]
    assert exprs[1].startswith("max_over_time(oomsight_predicted_peak_allocated_bytes{")
    error = errors["targets"][2]["expr"]
    assert "last_over_time(oomsight_predicted_peak_allocated_bytes{" in error and error.endswith(" - 1")
    assert "max_over_time(oomsight_torch_peak_allocated_bytes{" in error
    units = {o["matcher"]["options"]: o["properties"][0]["value"] for o in errors["fieldConfig"]["overrides"]}
    assert units["Error, allocated"] == units["Error, reserved"] == "percentunit"
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert any(r["title"].startswith("Prediction: predicted vs measured peak") for r in rows)
