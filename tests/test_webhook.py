"""The admission logic (pod -> JSONPatch) on realistic pods: patch applied with jsonpatch,
result validated against the Kubernetes schemas, and re-injection changes nothing."""

import base64
import copy
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomsight.wire.fields import PREDICTED_PEAK_ANNOTATION, PREDICTED_PEAK_RESERVED_ANNOTATION
from oomsight_webhook.admission import Admitter
from oomsight_webhook.injection import ANN_PREDICTED_PEAK, InjectionSettings, quantity_bytes
from oomsight_webhook.mutation import mutate
from oomsight_webhook.podspec import SIDECAR_NAME, SPOOL_PATH, STARTUP_NAME, STARTUP_PATH

from kubetools import apply, fixture, validate

SETTINGS = InjectionSettings(image="ghcr.io/oomsight/oomsight:0.1.0")
FIXTURES = ("pytorchjob-worker.yaml", "job-pod.yaml", "zero-code-pod.yaml", "cpu-pod.yaml")


def inject(pod, settings=SETTINGS):
    m = mutate(pod, settings)
    return apply(pod, m.patch), m


def by_name(items, name):
    return next(c for c in items if c["name"] == name)


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("native", [True, False])
def test_every_realistic_pod_stays_valid_and_a_second_injection_changes_nothing(name, native):
    settings = dataclasses.replace(SETTINGS, native_sidecar=native)
    pod, m = inject(fixture(name), settings)
    assert m.patch
    validate(pod)
    assert mutate(pod, settings).patch == []
    assert pod["metadata"]["annotations"]["oomsight.io/status"] == "injected"


def test_a_pytorchjob_worker_gets_a_native_sidecar_the_spool_and_its_owner():
    pod, m = inject(fixture("pytorchjob-worker.yaml"))
    assert m.warnings == []
    sidecar = by_name(pod["spec"]["initContainers"], SIDECAR_NAME)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 21400, "protocol": "TCP"}]
    env = env_of(sidecar)
    assert env["OOMSIGHT_DIR"] == SPOOL_PATH
    assert env["OOMSIGHT_POD_UID"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}
    assert (env["OOMSIGHT_OWNER_KIND"], env["OOMSIGHT_OWNER_NAME"]) == ("PyTorchJob", "llama-ft")
    trainer = by_name(pod["spec"]["containers"], "pytorch")
    assert env_of(trainer)["OOMSIGHT_DIR"] == SPOOL_PATH
    assert {"name": "oomsight-spool", "mountPath": SPOOL_PATH} in trainer["volumeMounts"]
    spool = by_name(pod["spec"]["volumes"], "oomsight-spool")
    assert spool["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    assert [c["name"] for c in pod["spec"]["containers"]] == ["pytorch"]  # no regular container added
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "21400" and annotations["sidecar.istio.io/inject"] == "false"


def test_a_job_pod_feeds_only_its_gpu_container_and_honours_its_annotations():
    pod, _ = inject(fixture("job-pod.yaml"))
    inits = pod["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["fetch-data", SIDECAR_NAME]  # after the user's init container
    sidecar = inits[1]
    assert sidecar["ports"][0]["containerPort"] == 21410
    assert env_of(sidecar)["OOMSIGHT_SIDECAR_PORT"] == "21410"
    assert sidecar["resources"]["limits"]["memory"] == "256Mi"
    owner = env_of(sidecar)["OOMSIGHT_OWNER_KIND"], env_of(sidecar)["OOMSIGHT_OWNER_NAME"]
    assert owner == ("Job", "resnet-finetune")
    train, shipper = pod["spec"]["containers"]
    assert env_of(train)["OOMSIGHT_DIR"] == SPOOL_PATH
    assert "env" not in shipper and [m["name"] for m in shipper["volumeMounts"]] == ["kube-api-access-q9w2d"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "21410"


def test_the_sidecar_gets_the_service_account_token_mount_the_api_server_gave_the_others():
    pod, m = inject(fixture("pytorchjob-worker.yaml"))
    sidecar = by_name(pod["spec"]["initContainers"], SIDECAR_NAME)
    token = {
        "name": "kube-api-access-x7k2p",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    assert token in sidecar["volumeMounts"] and m.warnings == []


def test_a_pod_without_a_token_is_injected_with_a_warning_that_events_cannot_be_posted():
    no_token = "oomsight: the pod mounts no service account token; the sidecar cannot post OOM Events"
    assert no_token in inject(fixture("zero-code-pod.yaml"))[1].warnings
    pod = fixture("zero-code-pod.yaml")
    pod["metadata"]["annotations"]["oomsight.io/events"] = "false"
    assert no_token not in inject(pod)[1].warnings


def test_older_clusters_get_a_regular_sidecar_container_that_kubernetes_1_27_accepts():
    native_pod, _ = inject(fixture("job-pod.yaml"))
    with pytest.raises(AssertionError, match="restartPolicy"):
        validate(native_pod, ("1.27.0",))  # why the choice matters: 1.27 rejects native sidecars
    pod, _ = inject(fixture("job-pod.yaml"), dataclasses.replace(SETTINGS, native_sidecar=False))
    validate(pod, ("1.27.0", "1.28.0"))
    sidecar = by_name(pod["spec"]["containers"], SIDECAR_NAME)
    assert "restartPolicy" not in sidecar
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-data"]


def test_the_native_sidecar_annotation_overrides_the_cluster_setting():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/native-sidecar": "false"}
    patched, _ = inject(pod)
    assert SIDECAR_NAME in [c["name"] for c in patched["spec"]["containers"]]


def test_zero_code_puts_the_startup_folder_first_and_keeps_the_users_pythonpath():
    pod, m = inject(fixture("zero-code-pod.yaml"))
    inits = pod["spec"]["initContainers"]
    assert [c["name"] for c in inits] == [STARTUP_NAME, SIDECAR_NAME]
    assert inits[0]["command"] == ["oomsight", "install-startup", STARTUP_PATH]
    trainer = by_name(pod["spec"]["containers"], "trainer")
    assert env_of(trainer)["PYTHONPATH"] == f"{STARTUP_PATH}:/app/site:/app/src"
    assert {"name": "oomsight-startup", "mountPath": STARTUP_PATH, "readOnly": True} in trainer["volumeMounts"]
    assert env_of(trainer)["OOMSIGHT_TERMINATION_MESSAGE_PATH"] == "/tmp/termination-log"
    tokenizer = by_name(pod["spec"]["containers"], "tokenizer-server")
    assert "configMapKeyRef" in env_of(tokenizer)["PYTHONPATH"]  # valueFrom: left alone
    assert all(mt["name"] != "oomsight-startup" for mt in tokenizer["volumeMounts"])
    assert any("tokenizer-server" in w and "valueFrom" in w for w in m.warnings)


def test_a_pythonpath_from_env_from_is_kept_by_reference():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/inject-python": "true"}
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "python-env"}}]
    patched, _ = inject(pod)
    assert env_of(patched["spec"]["containers"][0])["PYTHONPATH"] == f"{STARTUP_PATH}:$(PYTHONPATH)"


def test_the_startup_container_goes_before_a_sidecar_injected_earlier():
    pod, _ = inject(fixture("pytorchjob-worker.yaml"))
    pod["metadata"]["annotations"]["oomsight.io/inject-python"] = "true"  # e.g. a later webhook added it
    again, _ = inject(pod)
    assert [c["name"] for c in again["spec"]["initContainers"]] == [STARTUP_NAME, SIDECAR_NAME]
    validate(again)


def test_zero_code_switched_off_for_the_cluster_is_refused_with_a_warning():
    pod, m = inject(fixture("zero-code-pod.yaml"), dataclasses.replace(SETTINGS, zero_code=False))
    assert STARTUP_NAME not in [c["name"] for c in pod["spec"].get("initContainers", [])]
    assert any("inject-python" in w for w in m.warnings)


def test_a_pod_without_gpus_gets_the_spool_in_every_container_and_a_warning():
    pod, m = inject(fixture("cpu-pod.yaml"))
    assert env_of(pod["spec"]["containers"][0])["OOMSIGHT_DIR"] == SPOOL_PATH
    assert m.warnings == ["oomsight: no container asks for a GPU; the spool goes to all containers"]


def test_a_dra_claim_counts_as_asking_for_a_gpu():
    pod = fixture("job-pod.yaml")
    del pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    patched, m = inject(pod)
    assert "env" not in patched["spec"]["containers"][1] and m.warnings == []


def test_named_containers_and_all_mode_choose_the_targets():
    pod = fixture("job-pod.yaml")
    pod["metadata"]["annotations"]["oomsight.io/containers"] = "log-shipper, nope"
    patched, m = inject(pod)
    assert "OOMSIGHT_DIR" not in env_of(patched["spec"]["containers"][0])
    assert env_of(patched["spec"]["containers"][1])["OOMSIGHT_DIR"] == SPOOL_PATH
    assert m.warnings == ["oomsight: no container named nope"]
    everyone, _ = inject(fixture("job-pod.yaml"), dataclasses.replace(SETTINGS, containers="all"))
    assert all(env_of(c)["OOMSIGHT_DIR"] == SPOOL_PATH for c in everyone["spec"]["containers"])


def test_bad_annotations_are_ignored_with_one_warning_each():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {
        "oomsight.io/metrics-port": "99999",
        "oomsight.io/sidecar-memory-limit": "lots",
        "oomsight.io/inject-python": "maybe",
    }
    patched, m = inject(pod)
    validate(patched)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    assert sidecar["ports"][0]["containerPort"] == 21400 and sidecar["resources"]["limits"]["memory"] == "128Mi"
    assert len([w for w in m.warnings if w.startswith("oomsight: ignored")]) == 3


def test_a_pod_with_its_own_prometheus_annotations_keeps_them():
    pod, m = inject(fixture("zero-code-pod.yaml"))
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert any("PodMonitor" in w for w in m.warnings)


def test_every_injected_container_meets_pod_security_restricted():
    pod, _ = inject(fixture("zero-code-pod.yaml"))
    for c in pod["spec"]["initContainers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532 and sc["runAsGroup"] == 65532
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "requests" in c["resources"] and "limits" in c["resources"]
    assert not pod["spec"].get("hostPID") and not pod["spec"].get("hostNetwork")


def test_events_can_be_switched_off_per_pod():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/events": "false"}
    patched, _ = inject(pod)
    assert env_of(by_name(patched["spec"]["initContainers"], SIDECAR_NAME))["OOMSIGHT_EVENTS"] == "0"


def test_scheduled_profiling_is_set_per_pod_in_the_gpu_containers_only():
    pod = fixture("job-pod.yaml")
    pod["metadata"].setdefault("annotations", {}).update(
        {"oomsight.io/profile-every-seconds": "1800", "oomsight.io/profile-steps": "10"}
    )
    patched, m = inject(pod)
    validate(patched)
    train, shipper = patched["spec"]["containers"]
    env = env_of(train)
    assert (env["OOMSIGHT_PROFILE_EVERY_SECONDS"], env["OOMSIGHT_PROFILE_STEPS"]) == ("1800", "10")
    assert "env" not in shipper  # not a GPU container: no spool, no schedule
    assert not [w for w in m.warnings if "profile" in w]


def test_a_containers_own_profiling_setting_wins_over_the_annotation():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/profile-every-seconds": "600"}
    pod["spec"]["containers"][0]["env"] = [{"name": "OOMSIGHT_PROFILE_EVERY_SECONDS", "value": "3600"}]
    patched, _ = inject(pod)
    names = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
    assert names.count("OOMSIGHT_PROFILE_EVERY_SECONDS") == 1
    assert env_of(patched["spec"]["containers"][0])["OOMSIGHT_PROFILE_EVERY_SECONDS"] == "3600"


@pytest.mark.parametrize(
    ("every", "steps", "ignored"), [("soon", "5", 1), ("0", "0", 2), ("-5", "500", 2), ("1.5", "x", 2)]
)
def test_bad_profiling_annotations_are_ignored_with_a_warning(every, steps, ignored):
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/profile-every-seconds": every, "oomsight.io/profile-steps": steps}
    patched, m = inject(pod)
    validate(patched)
    env = env_of(patched["spec"]["containers"][0])
    assert "OOMSIGHT_PROFILE_EVERY_SECONDS" not in env
    assert ("OOMSIGHT_PROFILE_STEPS" in env) is (ignored == 1)
    assert len([w for w in m.warnings if w.startswith("oomsight: ignored oomsight.io/profile-")]) == ignored


@pytest.mark.parametrize(
    "odd",
    [
        None,
        [],
        "pod",
        {},
        {"spec": None},
        {"spec": {"containers": []}},
        {"spec": {"containers": ["x"]}},
        {"metadata": {}, "spec": {}},
        {"spec": {"containers": [{"name": "a", "image": "b"}]}},
    ],
)
def test_objects_that_are_not_usable_pods_get_no_patch_and_a_warning(odd):
    m = mutate(odd, SETTINGS)
    assert m.patch == [] and len(m.warnings) == 1


# --- property: any pod-shaped object; the patch applies, and applying it again adds nothing ---

names = st.sampled_from(["a", "train", "oomsight-sidecar", "oomsight-startup", "log", "pytorch"])
env_entries = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["PYTHONPATH", "OOMSIGHT_DIR", "X"]), "value": st.text(max_size=8)}),
    st.fixed_dictionaries(
        {"name": st.just("PYTHONPATH"), "valueFrom": st.just({"fieldRef": {"fieldPath": "metadata.name"}})}
    ),
)
resources = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"limits": st.dictionaries(st.sampled_from(["cpu", "nvidia.com/gpu", "amd.com/gpu"]), st.just("1"), max_size=2)}
    ),
    st.fixed_dictionaries({"claims": st.just([{"name": "gpu"}])}),
)
containers = st.builds(
    lambda name, env, res, mounts: {
        k: v
        for k, v in {"name": name, "image": "img", "env": env, "resources": res, "volumeMounts": mounts}.items()
        if v is not None
    },
    names,
    st.one_of(st.none(), st.lists(env_entries, max_size=3)),
    resources,
    st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["oomsight-spool", "data"]),
                    "mountPath": st.sampled_from([SPOOL_PATH, "/data"]),
                }
            ),
            max_size=2,
        ),
    ),
)
annotation_maps = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            [
                "oomsight.io/inject-python",
                "oomsight.io/native-sidecar",
                "oomsight.io/metrics-port",
                "oomsight.io/containers",
                "oomsight.io/predicted-peak-bytes",
                "prometheus.io/scrape",
                "a/b~c",
            ]
        ),
        st.sampled_from(["true", "false", "21401", "train,a", "x"]),
        max_size=4,
    ),
)
pods = st.builds(
    lambda cs, inits, volumes, ann: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", **({"annotations": ann} if ann is not None else {})},
        "spec": {
            k: v for k, v in {"containers": cs, "initContainers": inits, "volumes": volumes}.items() if v is not None
        },
    },
    st.lists(containers, min_size=1, max_size=3),
    st.one_of(st.none(), st.lists(containers, max_size=2)),
    st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["data", "oomsight-spool"]), "emptyDir": st.just({})}),
            max_size=2,
        ),
    ),
    annotation_maps,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods, st.booleans())
def test_any_pod_shaped_object_gets_a_patch_that_applies_and_a_second_pass_adds_nothing(pod, native):
    s = dataclasses.replace(SETTINGS, native_sidecar=native)
    original = copy.deepcopy(pod)
    m = mutate(pod, s)
    assert pod == original  # the input is never modified
    patched = apply(pod, m.patch)
    assert mutate(patched, s).patch == []


@pytest.mark.parametrize(
    "key", ["oomsight.io/metrics-port", "oomsight.io/profile-every-seconds", "oomsight.io/profile-steps"]
)
@pytest.mark.parametrize("value", ["²", "①", "\u0661\u0662", "9" * 4301, "+7", "1_0"])
def test_numbers_that_are_not_ascii_digits_are_ignored_with_a_warning_and_the_pod_still_injected(key, value):
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {key: value}
    patched, m = inject(pod)
    validate(patched)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    assert sidecar["ports"][0]["containerPort"] == 21400
    assert "OOMSIGHT_PROFILE_STEPS" not in env_of(patched["spec"]["containers"][0])
    assert [w for w in m.warnings if w.startswith(f"oomsight: ignored {key}=")] != []
    assert all(len(w) < 300 for w in m.warnings)


def test_a_metrics_port_annotation_on_the_admin_port_is_ignored_with_a_warning():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/metrics-port": "21401"}
    patched, m = inject(pod)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    assert sidecar["ports"][0]["containerPort"] == 21400
    assert env_of(sidecar)["OOMSIGHT_SIDECAR_PORT"] == "21400"
    assert any("ignored oomsight.io/metrics-port=21401" in w for w in m.warnings)


def test_ports_the_pod_uses_move_the_metrics_port_and_switch_the_admin_endpoint_off():
    pod = fixture("cpu-pod.yaml")
    pod["spec"]["containers"][0]["ports"] = [
        {"containerPort": 21400, "protocol": "TCP"},
        {"containerPort": 21401, "protocol": "TCP"},
        {"containerPort": 21402, "protocol": "TCP"},
    ]
    patched, m = inject(pod)
    validate(patched)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    env = env_of(sidecar)
    assert sidecar["ports"][0]["containerPort"] == 21403 and env["OOMSIGHT_SIDECAR_PORT"] == "21403"
    assert patched["metadata"]["annotations"]["prometheus.io/port"] == "21403"
    assert env["OOMSIGHT_ADMIN_PORT"] == "0"
    assert sum("the pod uses port" in w for w in m.warnings) == 2


def test_an_annotated_metrics_port_the_pod_uses_falls_back_to_the_default():
    pod = fixture("cpu-pod.yaml")
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8080}]
    pod["metadata"]["annotations"] = {"oomsight.io/metrics-port": "8080"}
    patched, m = inject(pod)
    assert by_name(patched["spec"]["initContainers"], SIDECAR_NAME)["ports"][0]["containerPort"] == 21400
    assert any("ignored oomsight.io/metrics-port=8080" in w for w in m.warnings)
    assert "OOMSIGHT_ADMIN_PORT" not in env_of(by_name(patched["spec"]["initContainers"], SIDECAR_NAME))


def test_a_host_network_pod_gets_an_auto_admin_port_and_a_required_token():
    pod = fixture("job-pod.yaml")
    pod["spec"]["hostNetwork"] = True
    patched, _ = inject(pod)
    validate(patched)
    sidecar = by_name(patched["spec"].get("initContainers", []) + patched["spec"]["containers"], SIDECAR_NAME)
    env = env_of(sidecar)
    assert env["OOMSIGHT_ADMIN_PORT"] == "auto" and env["OOMSIGHT_ADMIN_REQUIRE_TOKEN"] == "1"
    assert env["OOMSIGHT_ADMIN_TOKEN_FILE"].startswith(SPOOL_PATH + "/")


def test_the_cluster_admin_port_is_set_in_the_sidecar_and_kept_off_the_metrics_port():
    settings = InjectionSettings.from_env({"OOMSIGHT_INJECT_IMAGE": "i", "OOMSIGHT_INJECT_ADMIN_PORT": "21500"})
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/metrics-port": "21500"}
    patched, m = inject(pod, settings)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    assert env_of(sidecar)["OOMSIGHT_ADMIN_PORT"] == "21500" and sidecar["ports"][0]["containerPort"] == 21400
    assert any("ignored oomsight.io/metrics-port=21500" in w for w in m.warnings)
    off = InjectionSettings.from_env({"OOMSIGHT_INJECT_IMAGE": "i", "OOMSIGHT_INJECT_ADMIN_PORT": "0"})
    patched, _ = inject(fixture("cpu-pod.yaml"), off)
    assert env_of(by_name(patched["spec"]["initContainers"], SIDECAR_NAME))["OOMSIGHT_ADMIN_PORT"] == "0"


# --- the artifacts bound follows the spool's sizeLimit (half of it; the rest kept for events) ---

ARTIFACTS = "OOMSIGHT_ARTIFACTS_MAX_BYTES"


def test_the_target_containers_get_an_artifacts_bound_of_half_the_spools_size_limit():
    pod, _ = inject(fixture("job-pod.yaml"))
    train, shipper = pod["spec"]["containers"]
    assert env_of(train)[ARTIFACTS] == str(128 * 1024 * 1024)  # sizeLimit 256Mi
    assert "env" not in shipper  # not a target: nothing set
    assert ARTIFACTS not in env_of(by_name(pod["spec"]["initContainers"], SIDECAR_NAME))
    cluster = dataclasses.replace(SETTINGS, spool_size_limit="1Gi")
    pod, _ = inject(fixture("job-pod.yaml"), cluster)
    assert env_of(pod["spec"]["containers"][0])[ARTIFACTS] == str(512 * 1024 * 1024)


@pytest.mark.parametrize(
    "limit, bound",
    [("64Mi", 32 * 2**20), ("1.5Gi", 768 * 2**20), ("3e9", 1_500_000_000), ("1G", 500_000_000), ("1", 1)],
)
def test_the_spool_size_annotation_moves_the_artifacts_bound_with_it(limit, bound):
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/spool-size-limit": limit}
    patched, _ = inject(pod)
    assert by_name(patched["spec"]["volumes"], "oomsight-spool")["emptyDir"]["sizeLimit"] == limit
    assert {env_of(c)[ARTIFACTS] for c in patched["spec"]["containers"]} == {str(bound)}


def test_an_artifacts_bound_the_container_sets_itself_is_kept():
    pod = fixture("job-pod.yaml")
    pod["spec"]["containers"][0].setdefault("env", []).append({"name": ARTIFACTS, "value": "1000"})
    patched, _ = inject(pod)
    assert [e for e in patched["spec"]["containers"][0]["env"] if e["name"] == ARTIFACTS] == [
        {"name": ARTIFACTS, "value": "1000"}
    ]


@pytest.mark.parametrize(
    "volume, bound",
    [
        ({"emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}, str(2**30)),
        ({"emptyDir": {"medium": "Memory"}}, None),  # no sizeLimit: the hook's own statvfs bound applies
        ({"persistentVolumeClaim": {"claimName": "spool"}}, None),
        ({"emptyDir": {"sizeLimit": "lots"}}, None),
    ],
)
def test_a_pods_own_spool_volume_gives_the_bound_from_its_own_size_limit(volume, bound):
    pod = fixture("cpu-pod.yaml")
    pod["spec"].setdefault("volumes", []).append({"name": "oomsight-spool", **volume})
    patched, _ = inject(pod)
    assert {env_of(c).get(ARTIFACTS) for c in patched["spec"]["containers"]} == {bound}


@pytest.mark.parametrize(
    "raw, whole",
    [
        ("256Mi", 256 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("1G", 10**9),
        ("5k", 5000),
        ("1E", 10**18),
        ("2e9", 2 * 10**9),
        ("+7", 7),
        (".5Ki", 512),
        ("100m", 1),  # rounded up, as Kubernetes rounds
        ("1e-99999999999", 1),
        ("0", 0),
        ("0e99999", 0),
        ("9.3e18", None),  # over int64
        ("1Ei", 2**60),  # a binary suffix, not an exponent
        ("7Ei", 7 * 2**60),
        ("8Ei", None),  # 2**63: over int64
        ("2E5", 200_000),  # E followed by digits is an exponent, as Kubernetes reads it
        ("1e99999", None),
        ("9" * 5000, None),
        ("5K", None),
        ("lots", None),
        ("", None),
    ],
)
def test_quantities_are_read_as_kubernetes_reads_them_whatever_their_size(raw, whole):
    assert quantity_bytes(raw) == whole


@pytest.mark.parametrize("limit", ["1Ei", "1E", "7Ei"])
def test_an_exa_sized_spool_annotation_is_injected_with_its_bound_not_admitted_unpatched(limit):
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/spool-size-limit": limit}
    patched, m = inject(pod)
    assert by_name(patched["spec"]["volumes"], "oomsight-spool")["emptyDir"]["sizeLimit"] == limit
    bound = min(quantity_bytes(limit) // 2, 10**18 - 1)  # half the spool, within the hook's 18 digits
    assert {env_of(c)[ARTIFACTS] for c in patched["spec"]["containers"]} == {str(bound)}
    assert not [w for w in m.warnings if "sizeLimit" in w or "spool-size-limit" in w]


@pytest.mark.parametrize("limit, warned", [("1Ei", False), ("9Ei", True), ("1e30", True)])
def test_a_pods_own_huge_spool_size_limit_is_clamped_with_a_warning_when_over_int64(limit, warned):
    pod = fixture("cpu-pod.yaml")
    pod["spec"].setdefault("volumes", []).append({"name": "oomsight-spool", "emptyDir": {"sizeLimit": limit}})
    patched, m = inject(pod)
    bound = {int(env_of(c)[ARTIFACTS]) for c in patched["spec"]["containers"]}
    assert bound == {10**18 - 1 if warned else 2**59}
    assert any("sizeLimit" in w and "over" in w for w in m.warnings) == warned


_SUFFIXES = ["", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3", "E3", "e-2", "E+18"]


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A\+?(\d{1,25}(\.\d{0,5})?|\.\d{1,5})\Z"), st.sampled_from(_SUFFIXES))
def test_every_valid_quantity_reads_as_a_whole_number_or_none_never_an_exception(number, suffix):
    raw = number + suffix
    whole = quantity_bytes(raw)
    assert whole is None or 0 <= whole <= 2**63 - 1
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/spool-size-limit": raw}
    assert mutate(pod, SETTINGS).patch  # injected, whatever the size


# --- found by the 10,000-review fuzz (tests/test_admission.py) ---


def test_an_env_entry_named_by_a_map_does_not_stop_the_injection():
    pod = fixture("job-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [{"name": {"a": 1}, "value": "x"}]
    patched, _ = inject(pod)
    env = patched["spec"]["containers"][0]["env"]
    assert env[0] == {"name": {"a": 1}, "value": "x"} and {"name": "OOMSIGHT_DIR", "value": SPOOL_PATH} in env


def test_volume_mounts_that_are_not_a_list_do_not_stop_the_injection():
    pod = fixture("job-pod.yaml")
    pod["spec"]["containers"][0]["volumeMounts"] = 1.5
    patched, _ = inject(pod)
    sidecar = by_name(patched["spec"]["initContainers"], SIDECAR_NAME)
    assert sidecar["volumeMounts"][1]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"  # found on


def test_naming_the_regular_sidecar_as_a_target_leaves_a_second_injection_empty():
    pod = fixture("cpu-pod.yaml")
    pod["metadata"]["annotations"] = {"oomsight.io/containers": SIDECAR_NAME}
    settings = dataclasses.replace(SETTINGS, native_sidecar=False)
    patched, m = inject(pod, settings)
    assert any(f"no container named {SIDECAR_NAME}" in w for w in m.warnings)
    assert mutate(patched, settings).patch == []


def test_a_pythonpath_entry_without_a_value_gets_one_by_a_patch_that_applies():
    pod = fixture("zero-code-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [{"name": "PYTHONPATH"}]
    patched, _ = inject(pod)
    assert env_of(patched["spec"]["containers"][0])["PYTHONPATH"] == STARTUP_PATH


# --- the predicted peak: oomsight predict --annotate -> OOMSIGHT_PREDICTION (docs/prediction.md) ---

FIELD = "metadata.annotations['oomsight.io/predicted-peak-bytes']"
BY_ANNOTATION = {"fieldRef": {"apiVersion": "v1", "fieldPath": FIELD}}


def predicted(name, value="32212254720", **more):
    pod = fixture(name)
    pod["metadata"].setdefault("annotations", {}).update({"oomsight.io/predicted-peak-bytes": value, **more})
    return pod


def test_the_webhook_reads_the_annotation_that_oomsight_predict_writes():
    assert ANN_PREDICTED_PEAK == PREDICTED_PEAK_ANNOTATION == "oomsight.io/predicted-peak-bytes"


@pytest.mark.parametrize("native", [True, False])
def test_a_predicted_peak_reaches_only_the_training_container_by_the_downward_api(native):
    settings = dataclasses.replace(SETTINGS, native_sidecar=native)
    pod, m = inject(predicted("job-pod.yaml"), settings)
    validate(pod)
    train, shipper = pod["spec"]["containers"][:2]
    assert env_of(train)["OOMSIGHT_PREDICTION"] == BY_ANNOTATION
    assert "env" not in shipper  # no GPU: no spool, no prediction
    sidecar = by_name(pod["spec"]["initContainers" if native else "containers"], SIDECAR_NAME)
    assert "OOMSIGHT_PREDICTION" not in env_of(sidecar)
    assert not [w for w in m.warnings if "predicted" in w]
    assert mutate(pod, settings).patch == []


def test_without_the_annotation_no_container_gets_a_prediction():
    pod, _ = inject(fixture("pytorchjob-worker.yaml"))
    assert all("OOMSIGHT_PREDICTION" not in env_of(c) for c in pod["spec"]["containers"])


def test_the_reserved_annotation_alone_sets_nothing_the_hook_reads_no_reserved_value_from_env():
    pod = fixture("pytorchjob-worker.yaml")
    pod["metadata"]["annotations"][PREDICTED_PEAK_RESERVED_ANNOTATION] = "34359738368"
    patched, m = inject(pod)
    assert "OOMSIGHT_PREDICTION" not in env_of(by_name(patched["spec"]["containers"], "pytorch"))
    assert not [w for w in m.warnings if "predicted" in w]


@pytest.mark.parametrize(
    "own",
    [
        {"name": "OOMSIGHT_PREDICTION", "value": "/etc/prediction/gpt2.json"},
        {"name": "OOMSIGHT_PREDICTION", "valueFrom": {"configMapKeyRef": {"name": "pred", "key": "bytes"}}},
    ],
)
def test_a_containers_own_prediction_wins_over_the_annotation(own):
    pod = predicted("pytorchjob-worker.yaml")
    by_name(pod["spec"]["containers"], "pytorch").setdefault("env", []).append(own)
    patched, m = inject(pod)
    env = by_name(patched["spec"]["containers"], "pytorch")["env"]
    assert [e for e in env if e["name"] == "OOMSIGHT_PREDICTION"] == [own]
    assert not [w for w in m.warnings if "predicted" in w]


def test_a_container_with_env_from_keeps_what_it_may_set_and_the_pod_says_why():
    pod = predicted("pytorchjob-worker.yaml")
    by_name(pod["spec"]["containers"], "pytorch")["envFrom"] = [{"configMapRef": {"name": "job-settings"}}]
    patched, m = inject(pod)
    validate(patched)
    assert "OOMSIGHT_PREDICTION" not in env_of(by_name(patched["spec"]["containers"], "pytorch"))
    assert [w for w in m.warnings if "envFrom may set OOMSIGHT_PREDICTION" in w] != []
    assert mutate(patched, SETTINGS).patch == []


@pytest.mark.parametrize("value", ["abc", "", "-5", "30GiB", "4.5e9", "²", "9" * 4301, "1" * 19])
def test_a_malformed_predicted_peak_is_handed_to_the_hook_with_a_warning_and_the_pod_still_injected(value):
    patched, m = inject(predicted("job-pod.yaml", value))
    validate(patched)
    assert env_of(patched["spec"]["containers"][0])["OOMSIGHT_PREDICTION"] == BY_ANNOTATION
    (warning,) = [w for w in m.warnings if "predicted-peak-bytes" in w]
    assert "not a whole number of bytes" in warning and len(warning) < 240


def test_a_review_whose_predicted_peak_is_no_string_is_answered_allowed_and_injected_without_it():
    """The API server keeps annotations as strings; a malformed review may not."""
    pod = predicted("job-pod.yaml")
    pod["metadata"]["annotations"]["oomsight.io/predicted-peak-bytes"] = {"bytes": 32212254720}
    request = {
        "uid": "0c4e6a1e-7f1a-4d52-9b8e-3c2a1d0e9f87",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "object": pod,
    }
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    answer = Admitter(SETTINGS).admit(body.encode(), "application/json")
    response = json.loads(answer.body)["response"]
    assert answer.status == 200 and response["allowed"] is True
    patched = apply(pod, json.loads(base64.b64decode(response["patch"])))
    assert "OOMSIGHT_PREDICTION" not in env_of(patched["spec"]["containers"][0])
    assert env_of(patched["spec"]["containers"][0])["OOMSIGHT_DIR"] == SPOOL_PATH
    assert any(w.startswith("oomsight: ignored oomsight.io/predicted-peak-bytes=") for w in response["warnings"])
