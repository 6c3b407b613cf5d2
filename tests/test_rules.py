"""The generated rule file: valid for promtool, unit-tested alert by alert, and in the house
style (CamelCase alerts with for, severity, summary, description and a runbook that exists;
recording rules named level:metric:operations)."""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Any

import pytest
import yaml

from dashboards import alerts, config, rules
from oomsight.analysis.diagnosis import CAUSES

from fakes import ROOT

RULES = os.path.join(ROOT, "helm", "oomsight", "rules", "oomsight.rules.yaml")
TESTS = sorted(glob.glob(os.path.join(ROOT, "tests", "rules", "*.test.yaml")))


def rule_file() -> dict[str, Any]:
    with open(RULES) as fh:
        return yaml.safe_load(fh)  # type: ignore[no-any-return]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in rule_file()["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_the_rule_file_passes_promtool_check_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 47 rules found" in result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("path", TESTS, ids=os.path.basename)
def test_the_promtool_unit_tests_pass(path: str) -> None:
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rule_file_is_a_plain_groups_document() -> None:
    doc = rule_file()
    assert list(doc) == ["groups"]
    assert [g["name"] for g in doc["groups"]] == ["oomsight.rules", "oomsight.alerts"]


def test_every_alert_fires_stays_silent_and_has_its_boundary_in_the_unit_tests() -> None:
    cases: dict[str, list[bool]] = {}
    for path in TESTS:
        with open(path) as fh:
            for test in yaml.safe_load(fh)["tests"]:
                for case in test.get("alert_rule_test", []):
                    cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for name in {a["alert"] for a in alert_rules()}:
        outcomes = cases.get(name, [])
        assert True in outcomes, f"{name}: no case where it fires"
        assert outcomes.count(False) >= 2, f"{name}: needs a case where it must not fire and its boundary"


def test_every_alert_has_for_severity_summary_description_and_runbook() -> None:
    for rule in alert_rules():
        assert re.fullmatch(r"Oomsight(?:[A-Z][a-z0-9]+)+", rule["alert"]), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical", "info")
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        lower = rule["alert"].lower()
        assert rule["annotations"]["runbook_url"] == config.RUNBOOK_URL_PATTERN.format(alert=lower)


def test_every_alert_has_a_runbook_page_that_names_it_and_a_remedy() -> None:
    for name in {a["alert"] for a in alert_rules()}:
        path = os.path.join(ROOT, "docs", "runbooks", f"{name.lower()}.md")
        assert os.path.exists(path), f"no runbook {path}"
        with open(path) as fh:
            text = fh.read()
        assert text.startswith(f"# {name}\n") and "## Remedies" in text, path


def test_every_alert_is_in_the_alerts_doc() -> None:
    with open(os.path.join(ROOT, "docs", "alerts.md")) as fh:
        text = fh.read()
    assert all(f"[{a['alert']}]" in text for a in alert_rules())


def test_one_function_adds_the_runbook_url_from_a_configurable_pattern() -> None:
    groups = alerts.rule_groups("https://runbooks.example/oomsight/{alert}")
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
    assert urls and all(re.fullmatch(r"https://runbooks\.example/oomsight/[a-z]+", u) for u in urls)
    kept = alerts.add_runbook_links([{"rules": [{"alert": "X", "annotations": {"runbook_url": "mine"}}]}], "{alert}")
    assert kept[0]["rules"][0]["annotations"]["runbook_url"] == "mine"


def test_forecasts_are_anded_with_a_level_threshold() -> None:
    forecasts = [r for r in alert_rules() if "predict_linear" in r["expr"]]
    assert forecasts
    level = re.escape(f"and {config.HEADROOM_RATIO} < ")
    assert all(re.search(level, r["expr"]) for r in forecasts)


def test_waste_is_information_and_only_waste() -> None:
    severities = {r["alert"]: r["labels"]["severity"] for r in alert_rules()}
    waste = ["OomsightGpuMemoryUnderused", "OomsightGpuMemoryClaimOversized"]
    assert [name for name, s in severities.items() if s == "info"] == waste


LEVEL_LABELS = {"namespace", "workload", "pod", "gpu", "rank", "device", "cause"}


def exported_metrics() -> set[str]:
    with open(os.path.join(ROOT, "docs", "metrics.md")) as fh:
        return set(re.findall(r"`(oomsight_[a-z_]+)`", fh.read()))


def test_recording_rules_are_named_level_metric_operations() -> None:
    """level: the labels kept; metric: an exported one (oomsight's, or dcgm-exporter's in bytes), or a
    ratio of two (``a_per_b``); operations: the last aggregation."""
    records = [r["record"] for g in rule_file()["groups"] for r in g["rules"] if "record" in r]
    assert records
    # capacity: config.CAPACITY; budget: oomsight_gpu_memory_budget_bytes (rules.POD_BUDGET)
    known = exported_metrics() | {
        "dcgm_fi_dev_fb_used_bytes",
        "capacity_bytes",
        "budget_bytes",
        "budget_forecast_seconds",
        # right-sizing (rules.RS_*): the need per GPU, the request, what is granted and wasted
        "memory_need_bytes",
        "memory_request_bytes",
        "memory_granted_bytes",
        "memory_waste_bytes",
    }
    for name in records:
        level, metric, operations = name.split(":")
        assert set(level.split("_")) <= LEVEL_LABELS, name
        assert all(part in known for part in metric.split("_per_")), name
        assert operations in rules.OPERATIONS, name


def webhook_metric_names() -> set[str]:
    # the webhook's collector, wherever the package tree puts it (sidecar/ today, webhook/ next)
    sources = [
        p for d in ("sidecar", "webhook") for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
    ]
    text = ""
    for path in sources:
        with open(path) as fh:
            text += fh.read()
    names = set(re.findall(r'"(oomsight_webhook_[a-z_]+)"', text))
    assert names, sources
    return names


def test_the_webhook_alerts_use_metrics_the_webhook_exports() -> None:
    counters = {"oomsight_webhook_admissions", "oomsight_webhook_errors"}
    exported = {n + "_total" if n in counters else n for n in webhook_metric_names()}
    used = {m for r in alert_rules() if "Webhook" in r["alert"] for m in re.findall(r"oomsight_webhook_\w+", r["expr"])}
    assert used and used <= exported, used - exported


def test_nvml_device_values_are_aggregated_with_max_never_sum() -> None:
    for g in rule_file()["groups"]:
        for r in g["rules"]:
            assert not re.search(r"sum by \([^)]*\) \(\s*\(oomsight_gpu_memory_\w+", r["expr"]), r.get("record")


def test_every_diagnosed_cause_has_a_short_remedy() -> None:
    assert set(config.CAUSE_REMEDY) == set(CAUSES)


def fires_at(alert: str, moved: tuple[str, str], test_file: str, times: tuple[str, ...], tmp_path: Any) -> set[str]:
    """Of ``times``, those at which ``alert`` fires in the first alert case of ``tests/rules/<test_file>`` once its
    expression's text ``moved[0]`` reads ``moved[1]`` (a threshold moved)."""
    doc = rule_file()
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert rule["expr"].count(moved[0]) == 1, rule["expr"]
    rule["expr"] = rule["expr"].replace(*moved)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(doc))
    with open(os.path.join(ROOT, "tests", "rules", test_file)) as fh:
        tests = yaml.safe_load(fh)
    tests["rule_files"] = [str(tmp_path / "rules.yaml")]
    case = next(t for t in tests["tests"] if t.get("alert_rule_test"))
    case["alert_rule_test"] = [{"eval_time": at, "alertname": alert, "exp_alerts": []} for at in times]
    tests["tests"] = [case]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(tmp_path / "t.yaml"))
    return {at for at in times if f"time: {at}" in result.stdout + result.stderr}


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("factor", "fires"),
    [(0.75, {"9m", "18m"}), (1.0, {"18m"}), (1.25, set())],
    ids=["-25%", "as set", "+25%"],
)
def test_the_budget_alerts_verdicts_as_its_threshold_moves_by_a_quarter(
    tmp_path: Any, factor: float, fires: set[str]
) -> None:
    """tests/rules/budget.test.yaml's pod peaks at 100 % of its share for 11 minutes, then 110 %: at 75 %
    of the share the alert also fires on the 100 % stretch; at 125 % it never fires. The other cases
    (the pod without a claim) never move."""
    ratio = config.THRESHOLDS.budget_exceeded_ratio
    moved = (f" > {ratio:g}", f" > {ratio * factor:g}")
    assert fires_at("OomsightGpuMemoryBudgetExceeded", moved, "budget.test.yaml", ("9m", "18m"), tmp_path) == fires


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("margin", "fires"),
    [(0.05, {"9m", "16m"}), (0.10, {"16m"}), (0.20, set())],
    ids=["5%", "as set", "20%"],
)
def test_the_prediction_alerts_verdicts_as_its_margin_moves(tmp_path: Any, margin: float, fires: set[str]) -> None:
    """tests/rules/prediction.test.yaml's rank 0 peaks 8 % over its prediction for 10 minutes, then 15 %: with a
    5 % margin the alert fires on the 8 % stretch too; with 20 % never. A rank without a prediction, exited or
    below it never fires, whatever the margin."""
    moved = (f"> 1 + {config.THRESHOLDS.prediction_margin_ratio:g}\n", f"> 1 + {margin:g}\n")
    assert fires_at("OomsightPeakAbovePrediction", moved, "prediction.test.yaml", ("9m", "16m"), tmp_path) == fires
