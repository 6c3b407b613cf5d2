"""The Helm chart with the real helm binary: lint, render every ci/ scenario, validate every
manifest against the Kubernetes schemas, and check what matters (security, selectors,
failure policy, labels, RBAC that allows exactly the calls the code makes)."""

import datetime
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

from oomsight.config import ConfigError, Settings
from oomsight_webhook.injection import ENV_KUBE_VERSION_HINT, InjectionSettings
from oomsight_webhook.main import resolve_native_sidecar
from oomsight_webhook.mutation import mutate
from oomsight_webhook.settings import WebhookSettings
from oomsight_webhook.tls import SelfManagedCertificates

from fakes import ROOT
from kubetools import apply, fixture, kube_stub, rbac_allows, rbac_request, validate

pytestmark = pytest.mark.e2e

CHART = os.path.join(ROOT, "helm", "oomsight")
SAMPLES = os.path.join(ROOT, "tests", "fixtures", "chart")
NS = "oomsight"
SCENARIOS = sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
RESTRICTED = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def helm(*args, check=True):
    binary = shutil.which("helm")
    assert binary, "helm is not installed: run scripts/install-tools.sh"
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def kube_version(scenario):
    with open(os.path.join(CHART, "ci", scenario)) as fh:
        return re.search(r"^# kube-version: (\S+)$", fh.read(), re.M).group(1)


@functools.cache
def render(scenario="default-values.yaml", chart=CHART, sets=()):
    args = ["template", "oomsight", chart, "-n", NS, "--kube-version", kube_version(scenario)]
    args += ["-f", os.path.join(CHART, "ci", scenario)]
    for s in sets:
        args += ["--set", s]
    return tuple(d for d in yaml.safe_load_all(helm(*args).stdout) if d)


def find(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def one(docs, kind):
    (doc,) = find(docs, kind)
    return doc


def env_map(container):
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict_passes(scenario):
    out = helm(
        "lint", "--strict", CHART, "-f", os.path.join(CHART, "ci", scenario), "--kube-version", kube_version(scenario)
    )
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_is_valid_for_the_kubernetes_versions_it_targets(scenario):
    versions = ("1.29.0", "1.33.0") if scenario != "old-cluster-values.yaml" else ("1.27.0", "1.28.0", "1.29.0")
    docs = render(scenario)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            check_custom_resource(doc)
        else:
            validate(doc, versions)


def check_custom_resource(doc):
    """kubernetes-validate has no CRD schemas: check the shape prometheus-operator and cert-manager need."""
    spec = doc["spec"]
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
    if doc["kind"] == "PodMonitor":
        assert spec["selector"]["matchLabels"] and spec["podMetricsEndpoints"][0]["port"] == "metrics"
        assert spec["namespaceSelector"] in ({"any": True},) or spec["namespaceSelector"]["matchNames"]
    elif doc["kind"] == "ServiceMonitor":
        assert spec["selector"]["matchLabels"] and spec["endpoints"][0]["port"] == "metrics"
    elif doc["kind"] == "PrometheusRule":
        for group in spec["groups"]:
            assert group["name"] and group["rules"]
            assert all(("alert" in r) != ("record" in r) and r["expr"] for r in group["rules"])
    elif doc["kind"] == "Certificate":
        assert spec["secretName"] and spec["dnsNames"] and spec["issuerRef"]["name"]
    elif doc["kind"] == "Issuer":
        assert spec == {"selfSigned": {}}
    else:
        raise AssertionError(f"unexpected custom resource {doc['kind']}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_webhook_pods_meet_pod_security_restricted(scenario):
    pod = one(render(scenario), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    for container in pod["containers"]:
        assert RESTRICTED.items() <= container["securityContext"].items()
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert all("hostPath" not in v for v in pod["volumes"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_webhook_is_opt_in_fails_open_and_never_touches_system_namespaces(scenario):
    config = one(render(scenario), "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["objectSelector"] == {"matchLabels": {"oomsight.io/inject": "true"}}
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert {"kube-system", NS} <= set(expr["values"])
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 10
    assert hook["sideEffects"] == "None" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert "caBundle" not in hook["clientConfig"]  # filled at run time, never by Helm
    service = one(render(scenario), "Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NS,
        "path": "/mutate",
        "port": 443,
    }


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_labels_follow_helm_conventions_and_selectors_match_their_pods(scenario):
    docs = render(scenario)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "oomsight" and labels["app.kubernetes.io/instance"] == "oomsight"
        assert labels["helm.sh/chart"] == "oomsight-0.1.0" and labels["app.kubernetes.io/managed-by"] == "Helm"
    deployment = one(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert one(docs, "Service")["spec"]["selector"] == selector
    for pdb in find(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == selector


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_code_accepts_the_settings_the_chart_gives_the_webhook(scenario):
    container = one(render(scenario), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {**env_map(container), "OOMSIGHT_WEBHOOK_NAMESPACE": NS}
    settings = WebhookSettings.from_env(env)
    injection = InjectionSettings.from_env(env)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (settings.port, settings.metrics_port) == (ports["https"], ports["metrics"])
    assert injection.image == "ghcr.io/oomsight/oomsight:0.1.0" and injection.metrics_port == 21400
    assert container["command"] == ["oomsight", "webhook"]


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.0.0.7"])
def test_the_charts_listen_address_reaches_the_webhook_and_its_memory_limit_is_the_measured_one(address):
    container = one(render(sets=(f"webhook.listenAddress={address}",)), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert WebhookSettings.from_env({**env_map(container), "OOMSIGHT_WEBHOOK_NAMESPACE": NS}).host == address
    assert container["resources"]["limits"]["memory"] == "192Mi"  # benchmarks/results/webhook_memory.json: 150 MiB


def test_the_charts_spool_size_limit_bounds_the_artifacts_of_injected_pods_at_half_of_it():
    webhook = one(render(sets=("sidecar.spoolSizeLimit=1Gi",)), "Deployment")["spec"]["template"]["spec"]
    pod = fixture("job-pod.yaml")
    patched = apply(pod, mutate(pod, InjectionSettings.from_env(env_map(webhook["containers"][0]))).patch)
    (spool,) = [v for v in patched["spec"]["volumes"] if v["name"] == "oomsight-spool"]
    assert spool["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    env = env_map(patched["spec"]["containers"][0])
    assert Settings.from_env(env).oom.artifacts_max_bytes == 512 * 1024 * 1024  # the hook reads what it is given


def test_a_bad_setting_in_the_chart_env_would_fail_the_webhook_at_start():
    with pytest.raises(ConfigError, match="OOMSIGHT_INJECT_CONTAINERS"):
        InjectionSettings.from_env({"OOMSIGHT_INJECT_IMAGE": "x", "OOMSIGHT_INJECT_CONTAINERS": "some"})


def test_an_old_cluster_renders_a_hint_that_turns_native_sidecars_off():
    env = env_map(one(render("old-cluster-values.yaml"), "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env[ENV_KUBE_VERSION_HINT] == "v1.27.0" and env["OOMSIGHT_INJECT_NATIVE_SIDECAR"] == "auto"
    assert resolve_native_sidecar("auto", None, env[ENV_KUBE_VERSION_HINT]) is False
    assert env["OOMSIGHT_INJECT_DRAIN_SECONDS"] == "15"
    assert find(render("old-cluster-values.yaml"), "PodDisruptionBudget") == []  # one replica


@pytest.mark.parametrize(
    "bad",
    [
        "bogus=1",
        "webhook.replicass=2",
        "sidecar.resources.requests.gpu=1",
        "podMonitor.labels.release=x",
        "certManager.issuerRef.namespace=x",
        "webhook.failurePolicy=Maybe",
        "sidecar.native=sometimes",
        "sidecar.spoolSizeLimit=lots",
        "webhook.timeoutSeconds=60",
    ],
)
def test_the_values_schema_rejects_unknown_keys_and_bad_values_at_every_level(bad):
    result = helm("template", "oomsight", CHART, "--set", bad, check=False)
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr


def test_cert_manager_mode_uses_a_certificate_and_grants_no_secret_or_webhook_access():
    docs = render("cert-manager-values.yaml")
    cert, issuer, config = one(docs, "Certificate"), one(docs, "Issuer"), one(docs, "MutatingWebhookConfiguration")
    service = one(docs, "Service")["metadata"]["name"]
    assert f"{service}.{NS}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{cert['metadata']['name']}"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (secret_volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert secret_volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert env_map(pod["containers"][0])["OOMSIGHT_WEBHOOK_TLS_MODE"] == "files"
    webhook_roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and "webhook" in d["metadata"]["name"]]
    assert webhook_roles == []


def test_an_existing_cluster_issuer_can_be_used():
    docs = render(
        "cert-manager-values.yaml",
        sets=("certManager.issuerRef.name=corp-ca", "certManager.issuerRef.kind=ClusterIssuer"),
    )
    assert find(docs, "Issuer") == []
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_the_operator_scenario_scrapes_sidecars_with_a_pod_monitor_that_kube_prometheus_stack_selects():
    docs = render("operator-values.yaml")
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"] == {"matchLabels": {"oomsight.io/inject": "true"}}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert "training.kubeflow.org/job-name" in monitor["spec"]["podTargetLabels"]
    service_monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "metrics" in [p["name"] for p in service["spec"]["ports"]]
    env = env_map(one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["OOMSIGHT_INJECT_SCRAPE_ANNOTATIONS"] == "false"  # the PodMonitor scrapes: no double scrape
    assert env["OOMSIGHT_INJECT_ZERO_CODE"] == "false"
    # the rule and dashboard files generated from dashboards/ ship as one PrometheusRule and a ConfigMap each
    with open(os.path.join(CHART, "rules", "oomsight.rules.yaml")) as fh:
        groups = yaml.safe_load(fh)["groups"]
    (rule,) = find(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == groups
    dashboards = [c for c in find(docs, "ConfigMap") if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(dashboards) == len([f for f in os.listdir(os.path.join(CHART, "dashboards")) if f.endswith(".json")])


@pytest.fixture(scope="module")
def chart_with_files():
    """A copy of the chart holding a sample dashboard, as the dashboards tooling writes them."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "oomsight")
        shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("dashboards"))
        os.makedirs(os.path.join(chart, "dashboards"))
        shutil.copy(os.path.join(SAMPLES, "gpu_memory.json"), os.path.join(chart, "dashboards"))
        yield chart


def test_dashboard_files_become_labelled_config_maps_holding_the_json_unchanged(chart_with_files):
    docs = render("operator-values.yaml", chart=chart_with_files)
    cm = one(docs, "ConfigMap")
    validate(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU memory"}
    with open(os.path.join(SAMPLES, "gpu_memory.json")) as fh:
        assert cm["data"]["gpu_memory.json"] == fh.read()
    target = json.loads(cm["data"]["gpu_memory.json"])["panels"][0]["targets"][0]
    assert target["legendFormat"] == "{{pod}} rank {{rank}}"


def test_an_empty_dashboard_folder_renders_no_config_map(tmp_path):
    chart = tmp_path / "oomsight"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("dashboards"))
    (chart / "dashboards").mkdir()
    assert find(render("operator-values.yaml", chart=str(chart)), "ConfigMap") == []


def test_a_missing_rule_spec_fails_the_render_and_names_the_fix(tmp_path):
    chart = tmp_path / "oomsight"
    shutil.copytree(CHART, chart)
    (chart / "rules" / "oomsight.rules.spec.json").write_text("{not json")
    result = helm("template", "oomsight", str(chart), "--set", "prometheusRule.enabled=true", check=False)
    assert result.returncode != 0 and "run make dashboards" in result.stderr


# --- Rules rendered from values, the kube-prometheus-stack way ---

RULE_OVERRIDES = "rules-overrides-values.yaml"


def plain_rule_groups():
    with open(os.path.join(CHART, "rules", "oomsight.rules.yaml")) as fh:
        return yaml.safe_load(fh)["groups"]


def rendered_alerts(scenario):
    (rule,) = find(render(scenario), "PrometheusRule")
    groups = [g for g in rule["spec"]["groups"] if g["name"].startswith("oomsight.")]
    return rule, {(r["alert"], r["labels"]["severity"]): r for g in groups for r in g["rules"] if "alert" in r}


def test_with_the_default_values_the_prometheus_rule_is_exactly_the_promtool_tested_file():
    rule, _ = rendered_alerts("operator-values.yaml")
    assert rule["spec"]["groups"] == plain_rule_groups()
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert "{{ $labels.pod }}" in rule["spec"]["groups"][1]["rules"][0]["annotations"]["description"]


def test_the_values_carry_every_overridable_threshold_with_the_generators_default():
    from dashboards import knob

    with open(os.path.join(CHART, "values.yaml")) as fh:
        values = yaml.safe_load(fh)
    assert values["prometheusRule"]["thresholds"] == knob.defaults()
    assert values["prometheusRule"]["runbookUrl"] + "/{alert}.md" == config_pattern()


def config_pattern():
    from dashboards import config

    return config.RUNBOOK_URL_PATTERN


def test_overrides_change_thresholds_for_severity_labels_annotations_runbooks_and_drop_a_disabled_alert():
    rule, alerts = rendered_alerts(RULE_OVERRIDES)
    _, defaults = rendered_alerts("operator-values.yaml")
    assert {n for n, _ in defaults} - {n for n, _ in alerts} == {"OomsightGpuMemoryUnderused"}
    near = alerts[("OomsightGpuMemoryNearCapacity", "warning")]
    assert "< 0.2\n" in near["expr"] and "(alert below 20%)" in near["annotations"]["description"]
    assert "< 0.03\n" in alerts[("OomsightGpuMemoryNearCapacity", "critical")]["expr"]  # not overridden
    assert "> 2147483648\n" in alerts[("OomsightCudaMemoryFragmented", "warning")]["expr"]
    retries = alerts[("OomsightCudaMallocRetries", "critical")]
    assert (retries["for"], retries["keep_firing_for"]) == ("15m", "10m")
    for (name, _), alert in alerts.items():
        assert alert["labels"]["team"] == "ml-platform", name
        assert alert["annotations"]["dashboard"] == "https://grafana.example/d/oomsight-pod"
        assert alert["annotations"]["runbook_url"] == f"https://runbooks.example/oomsight/{name.lower()}.md"
    team = rule["spec"]["groups"][-1]
    assert (
        team["name"] == "team.rules"
        and team["rules"][0]["annotations"]["summary"] == "{{ $labels.pod }} makes no steps."
    )
    overridden = {"OomsightGpuMemoryNearCapacity", "OomsightCudaMemoryFragmented", "OomsightCudaMallocRetries"}
    for key, alert in alerts.items():
        if key[0] not in overridden:
            assert (alert["expr"], alert["for"]) == (defaults[key]["expr"], defaults[key]["for"]), key


def test_the_prediction_margin_is_a_value_that_moves_the_expression_and_the_description():
    margin = "prometheusRule.thresholds.predictionMarginRatio=0.25"  # --set would read 0.25 as a string
    out = helm("template", "oomsight", CHART, "--set", "prometheusRule.enabled=true", "--set-json", margin).stdout
    (rule,) = find([d for d in yaml.safe_load_all(out) if d], "PrometheusRule")
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    (alert,) = [r for r in rules if r.get("alert") == "OomsightPeakAbovePrediction"]
    assert "> 1 + 0.25\n" in alert["expr"] and "(alert above 25% over it)" in alert["annotations"]["description"]


def promtool(*args):
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


OVERRIDDEN_NEAR_DESCRIPTION = (
    "ml/p rank 0 GPU 0 has only 15% of its GPU memory (its memory-fraction cap, where set) left at its peak "
    "(alert below 20%). The next larger batch or longer sequence runs out of memory."
)


def test_the_overridden_rules_pass_promtool_and_the_new_threshold_is_the_one_that_fires(tmp_path):
    (rule,) = find(render(RULE_OVERRIDES), "PrometheusRule")
    path = tmp_path / "overridden.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    device = 'namespace="ml", pod="p", rank="0", local_rank="0", device="0", gpu_uuid="GPU-1"'
    test = {
        "rule_files": [str(path)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'oomsight_process_up{namespace="ml", pod="p", rank="0", local_rank="0"}',
                        "values": "1x30",
                    },
                    {"series": f"oomsight_gpu_memory_total_bytes{{{device}}}", "values": "100x30"},
                    {"series": f"oomsight_gpu_headroom_bytes{{{device}}}", "values": "15x30"},  # 15 %: only above 0.2
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "16m",
                        "alertname": "OomsightGpuMemoryNearCapacity",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "team": "ml-platform",
                                    **{k: v.strip('"') for k, v in (p.split("=") for p in device.split(", "))},
                                },
                                "exp_annotations": {
                                    "summary": "GPU memory is nearly full at the training step's peak.",
                                    "description": OVERRIDDEN_NEAR_DESCRIPTION,
                                    "runbook_url": "https://runbooks.example/oomsight/oomsightgpumemorynearcapacity.md",
                                    "dashboard": "https://grafana.example/d/oomsight-pod",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "overridden.test.yaml"
    test_file.write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_values_schema_rejects_a_misspelt_threshold_and_a_bad_severity():
    for bad in (
        "prometheusRule.thresholds.nearCapacityWarnRatio=0.1",
        "prometheusRule.customRules.OomsightX.severity=page",
    ):
        result = helm("template", "oomsight", CHART, "--set", bad, check=False)
        assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr, bad


# --- RBAC: the grants allow exactly the requests the real client sends ---


def bindings_for(docs, namespace, account):
    """The rules that apply to ``account`` in ``namespace`` through the rendered (Cluster)RoleBindings."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d.get("rules", []) for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    rules = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if b["kind"] == "RoleBinding" and b["metadata"]["namespace"] != namespace:
            continue
        if any(
            (s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == namespace)
            or (s["kind"] == "Group" and s["name"] in (f"system:serviceaccounts:{namespace}", "system:serviceaccounts"))
            for s in b["subjects"]
        ):
            rules += roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
    return rules


def granted(rules):
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def sidecar_event_request(spool, monkeypatch, namespace):
    from oomsight_sidecar.events import EventPoster
    from oomsight_sidecar.settings import KubernetesSettings

    from fakes import GIB
    from spoolmaker import hooked_process

    _, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    pod = KubernetesSettings(pod_name="w-0", pod_namespace=namespace, pod_uid="u-1")
    with kube_stub() as (client, stub):
        EventPoster(spool, pod, lambda: client).tick()
    return [rbac_request(r["method"], r["path"]) for r in stub.requests]


def test_the_sidecar_grant_allows_exactly_the_event_it_posts_in_listed_namespaces_only(spool, monkeypatch):
    docs = render("operator-values.yaml")
    (request,) = sidecar_event_request(spool, monkeypatch, "team-a")
    assert request == ("create", "events.k8s.io", "events", "team-a", "")
    rules = bindings_for(docs, "team-a", "default")
    assert rbac_allows(rules, request)
    assert granted(rules) == {("events.k8s.io", "events", "create")}  # nothing more
    assert not rbac_allows(bindings_for(docs, "research", "default"), (*request[:3], "research", ""))
    assert not rbac_allows(bindings_for(render("default-values.yaml"), "team-a", "default"), request)


def test_named_service_accounts_narrow_the_sidecar_grant(spool, monkeypatch):
    docs = render("cert-manager-values.yaml")  # podNamespaces [team-a], podServiceAccounts [trainer]
    (request,) = sidecar_event_request(spool, monkeypatch, "team-a")
    assert rbac_allows(bindings_for(docs, "team-a", "trainer"), request)
    assert not rbac_allows(bindings_for(docs, "team-a", "default"), request)


def test_the_webhook_grant_allows_exactly_what_self_managed_tls_does():
    docs = render("default-values.yaml")
    env = env_map(one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    settings = WebhookSettings.from_env({**env, "OOMSIGHT_WEBHOOK_NAMESPACE": NS})
    config_path = r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/[^/]+"
    config = one(docs, "MutatingWebhookConfiguration")
    with kube_stub({("GET", config_path): (200, config)}) as (client, stub):
        SelfManagedCertificates(client, settings).current()  # first start: create + patch caBundle
    secret = stub.requests[1]["body"]
    secret["metadata"]["resourceVersion"] = "1"
    secret_path = rf"/api/v1/namespaces/{NS}/secrets/{settings.secret}"
    later = lambda: datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=340)  # noqa: E731
    with kube_stub({("GET", secret_path): (200, secret), ("GET", config_path): (200, config)}) as (client, renewal):
        SelfManagedCertificates(client, settings, clock=later).current()  # renewal: update
    requests = {rbac_request(r["method"], r["path"]) for r in stub.requests + renewal.requests}
    account = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    rules = bindings_for(docs, NS, account)
    assert all(rbac_allows(rules, r) for r in requests), requests
    assert granted(rules) == {(g, r, v) for v, g, r, _, _ in requests}  # every grant is used
    assert settings.configuration == config["metadata"]["name"]
    assert not rbac_allows(rules, ("get", "", "secrets", NS, "some-other-secret"))
    assert not rbac_allows(
        rules, ("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "someone-elses-webhook")
    )


def test_notes_tell_the_user_what_to_label_and_where_to_look():
    out = helm("install", "oomsight", CHART, "-n", NS, "--dry-run=client", "--set", "podMonitor.enabled=true").stdout
    notes = out[out.index("NOTES:") :]
    assert 'oomsight.io/inject: "true"' in notes and "oomsight.io/inject-python" in notes
    assert "release=<its release>" in notes  # the kube-prometheus-stack selector pitfall
    assert "rbac.podNamespaces" in notes and "oomsight_torch_allocated_bytes" in notes


def value_paths(tree, prefix=""):
    """Dotted paths of every key in a values tree (lists and free-form maps are leaves)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict) and value:
            yield from value_paths(value, path + ".")


def schema_paths(schema, prefix=""):
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        yield path
        if sub.get("type") == "object" and "properties" in sub:
            yield from schema_paths(sub, path + ".")


def test_every_value_has_a_prose_comment_and_the_schema_knows_exactly_these_keys():
    with open(os.path.join(CHART, "values.yaml")) as fh:
        lines = fh.read().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z][A-Za-z0-9]*:", line):
            assert lines[i - 1].strip().startswith("#"), f"values.yaml line {i + 1} has no comment: {line.strip()}"
            assert "_" not in line.split(":")[0] and "-" not in line.split(":")[0], f"not camelCase: {line}"
    with open(os.path.join(CHART, "values.yaml")) as fh:
        values = yaml.safe_load(fh)
    with open(os.path.join(CHART, "values.schema.json")) as fh:
        schema = json.load(fh)
    assert set(value_paths(values)) == set(schema_paths(schema))

    def closed(node, where):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
            for key, sub in node["properties"].items():
                closed(sub, f"{where}.{key}")

    closed(schema, "values")


# --- Chart conventions ---


def test_image_pull_secrets_are_a_list_of_names_as_in_a_pod_spec():
    docs = render("default-values.yaml", sets=("imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror"))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    validate(one(docs, "Deployment"))
    result = helm("template", "oomsight", CHART, "--set", "imagePullSecrets={regcred}", check=False)
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr


def test_extra_env_reaches_the_webhook_container_after_the_charts_own():
    container = one(render(RULE_OVERRIDES), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert names[-1] == "HTTPS_PROXY" and env_map(container)["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert len(names) == len(set(names))


def test_the_network_policy_is_optional_and_admits_the_api_server_and_the_listed_scrapers():
    assert find(render("default-values.yaml"), "NetworkPolicy") == []
    docs = render(RULE_OVERRIDES)
    policy = one(docs, "NetworkPolicy")
    validate(policy)
    assert policy["spec"]["podSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "https", "protocol": "TCP"}]}  # the API server, from wherever it is
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    ports = {p["name"] for p in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {"https", "metrics"} <= ports


def test_the_monitors_add_the_node_label_dcgm_exporter_series_carry():
    docs = render("operator-values.yaml")
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    assert node in one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert node in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["relabelings"]
    mine = {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_team"], "targetLabel": "team"}
    extra = render(
        "operator-values.yaml",
        sets=(
            "podMonitor.relabelings[0].action=replace",
            "podMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_label_team",
            "podMonitor.relabelings[0].targetLabel=team",
        ),
    )
    assert one(extra, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"] == [node, mine]


def test_chart_metadata_has_an_icon_maintainers_and_annotations():
    with open(os.path.join(CHART, "Chart.yaml")) as fh:
        chart = yaml.safe_load(fh)
    assert chart["icon"].startswith("https://") and chart["icon"].endswith("docs/images/oomsight.svg")
    assert os.path.exists(os.path.join(ROOT, "docs", "images", "oomsight.svg"))
    assert chart["maintainers"] and all(m["name"] for m in chart["maintainers"])
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def test_the_chart_readme_is_generated_from_the_values_comments_and_has_not_drifted():
    script = os.path.join(ROOT, "scripts", "chart_readme.py")
    result = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(CHART, "README.md")) as fh:
        readme = fh.read()
    assert "| `prometheusRule.thresholds.nearCapacityWarningRatio` | `0.1` |" in readme
    assert "| `imagePullSecrets` | `[]` | Secrets for pulling the image" in readme


def test_the_readme_check_names_a_stale_readme(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import chart_readme
    finally:
        sys.path.pop(0)
    stale = tmp_path / "README.md"
    stale.write_text(chart_readme.render().replace("Override the chart name", "Change the chart name"))
    monkeypatch.setattr(chart_readme, "README", stale)
    assert chart_readme.main(["--check"]) == 1


def test_notes_name_no_local_chart_path_and_no_reuse_values():
    for sets in ((), ("rbac.podNamespaces={team-a}", "prometheusRule.enabled=true")):
        args = ["install", "oomsight", CHART, "-n", NS, "--dry-run=client"]
        for s in sets:
            args += ["--set", s]
        notes = helm(*args).stdout.split("NOTES:", 1)[1]
        assert "--reuse-values" not in notes and "./helm" not in notes and "docs/kubernetes.md" in notes
        assert "https://github.com/oomsight/oomsight/blob/main/docs/kubernetes.md" in notes
        assert "helm test oomsight" in notes


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_helm_test_pod_is_a_restricted_test_hook_that_trusts_only_the_tls_ca(scenario):
    docs = render(scenario)
    tests = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    (pod,) = tests
    validate(pod)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert RESTRICTED.items() <= container["securityContext"].items() and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    (volume,) = spec["volumes"]
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the keys
    service = one(docs, "Service")["metadata"]["name"]
    assert container["args"][1] == f"https://{service}.{NS}.svc:443/healthz"
    assert container["image"] == deployment["containers"][0]["image"]


def test_the_helm_test_script_passes_against_the_real_webhook_and_fails_against_a_stranger(tmp_path):
    """The rendered test script, run against the real webhook server with a certificate for the
    Service's name (resolved to this machine), its CA where the pod mounts it; then against the
    same server with a CA that did not sign it."""
    import threading

    from oomsight_webhook.certs import make_ca, make_serving, service_dns_names
    from oomsight_webhook.main import run
    from oomsight_webhook.tls import FileCertificates

    from procs import free_port, http_get, wait_for

    (pod,) = [d for d in render() if d["kind"] == "Pod"]
    script, url = pod["spec"]["containers"][0]["args"]
    host = url.split("/")[2].split(":")[0]
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = make_ca("oomsight-test-ca", now)
    serving = make_serving(ca, service_dns_names(host.split(".")[0], NS), now)
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    port, metrics = free_port(), free_port()
    settings = WebhookSettings(
        host="127.0.0.1",
        port=port,
        metrics_port=metrics,
        tls_mode="files",
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        cert_dir=str(tmp_path / "loaded"),
    )
    stop = threading.Event()
    from oomsight_webhook.injection import InjectionSettings

    thread = threading.Thread(
        target=run,
        args=(settings, InjectionSettings(image="x"), FileCertificates(settings.cert_file, settings.key_file), stop),
        daemon=True,
    )
    thread.start()
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/metrics")[0] == 200)
        resolve = (
            "import socket\n_real = socket.getaddrinfo\n"
            f"def _fake(host, port, *a, **k):\n    return _real('127.0.0.1', {port}, *a, **k) if host == {host!r} "
            "else _real(host, port, *a, **k)\nsocket.getaddrinfo = _fake\n"
        )

        def attempt(ca_pem):
            (tmp_path / "ca.crt").write_bytes(ca_pem)
            code = resolve + script.replace("/etc/oomsight/ca/ca.crt", str(tmp_path / "ca.crt"))
            return subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60)

        good = attempt(ca.cert_pem)
        assert good.returncode == 0 and " 200 " in good.stdout, good.stdout + good.stderr
        bad = attempt(make_ca("someone-else", now).cert_pem)
        assert bad.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in bad.stderr, bad.stdout + bad.stderr
    finally:
        stop.set()
        thread.join(10)
