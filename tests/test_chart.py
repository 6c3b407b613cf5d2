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
import tempfile

import pytest
import yaml

from oomsight.config import ConfigError
from oomsight_webhook.injection import ENV_KUBE_VERSION_HINT, InjectionSettings
from oomsight_webhook.main import resolve_native_sidecar
from oomsight_webhook.settings import WebhookSettings
from oomsight_webhook.tls import SelfManagedCertificates

from fakes import ROOT
from kubetools import kube_stub, rbac_allows, rbac_request, validate

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
    """A copy of the chart holding a sample rule file and dashboard, as the dashboards tooling writes them."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "oomsight")
        shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("rules", "dashboards"))
        os.makedirs(os.path.join(chart, "rules"))
        os.makedirs(os.path.join(chart, "dashboards"))
        shutil.copy(os.path.join(SAMPLES, "oom_alerts.yaml"), os.path.join(chart, "rules"))
        shutil.copy(os.path.join(SAMPLES, "gpu_memory.json"), os.path.join(chart, "dashboards"))
        yield chart


def test_rule_files_become_prometheus_rules_with_their_templates_untouched(chart_with_files):
    docs = render("operator-values.yaml", chart=chart_with_files)
    rule = one(docs, "PrometheusRule")
    check_custom_resource(rule)
    with open(os.path.join(SAMPLES, "oom_alerts.yaml")) as fh:
        assert rule["spec"]["groups"] == yaml.safe_load(fh)["groups"]
    assert "{{ $labels.pod }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["description"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", rule["metadata"]["name"])


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


def test_empty_rule_and_dashboard_folders_render_nothing(tmp_path):
    chart = tmp_path / "oomsight"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("rules", "dashboards"))
    (chart / "rules").mkdir()
    (chart / "dashboards").mkdir()
    docs = render("operator-values.yaml", chart=str(chart))
    assert find(docs, "PrometheusRule") == [] and find(docs, "ConfigMap") == []


def test_a_broken_rule_file_fails_the_render_with_its_name(tmp_path):
    chart = tmp_path / "oomsight"
    shutil.copytree(CHART, chart)
    (chart / "rules").mkdir(exist_ok=True)
    (chart / "rules" / "broken.yaml").write_text("groups: [\n")
    result = helm("template", "oomsight", str(chart), "--set", "prometheusRule.enabled=true", check=False)
    assert result.returncode != 0 and "rules/broken.yaml is not valid YAML" in result.stderr


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
