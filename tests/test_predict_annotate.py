"""``oomsight predict --annotate MANIFEST`` (issue 51): the predicted peak written into a Kubernetes manifest's
pod template annotations, for the webhook to hand to the training containers."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from oomsight.tools import exitcode, manifest
from oomsight.tools import predict_command as command
from oomsight.wire.fields import PREDICTED_PEAK_ANNOTATION, PREDICTED_PEAK_RESERVED_ANNOTATION

JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  template:
    metadata:
      annotations:
        oomsight.io/inject: "true"
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: trainer:1
"""
SPEC = """\
import torch


def spec():
    return {"build": lambda: torch.nn.Linear(256, 256), "batch": lambda n, device: torch.randn(n, 256, device=device)}
"""


def _annotated(text: str, result: dict[str, Any], tmp_path: Path) -> list[Any]:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return list(yaml.safe_load_all(manifest.annotated(manifest.read(str(path)), command.peak_annotations(result))))


def test_the_annotations_are_the_predicted_peaks_in_integer_bytes(tmp_path: Path) -> None:
    one_gpu = {"prediction": {"peak_allocated_bytes": 1_234_567_890, "peak_reserved_bytes": 1_258_291_200}}
    job = _annotated(JOB, one_gpu, tmp_path)[0]
    notes = job["spec"]["template"]["metadata"]["annotations"]
    assert notes == {
        "oomsight.io/inject": "true",  # the pod's own annotations kept
        "oomsight.io/predicted-peak-bytes": "1234567890",
        "oomsight.io/predicted-peak-reserved-bytes": "1258291200",
    }
    assert job["metadata"] == {"name": "train"}  # the Job's own metadata untouched
    ranked = {**one_gpu, "parallel": {"per_rank_peak_allocated_bytes": 600, "per_rank_peak_reserved_bytes": 2048}}
    per_rank = {PREDICTED_PEAK_ANNOTATION: "600", PREDICTED_PEAK_RESERVED_ANNOTATION: "2048"}
    assert command.peak_annotations(ranked) == per_rank  # with --parallel: one rank's, what its process measures
    assert command.peak_annotations({"prediction": {"peak_allocated_bytes": 512}}) == {PREDICTED_PEAK_ANNOTATION: "512"}


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ({"kind": "Pod", "metadata": {"name": "p"}}, ()),
        ({"kind": "Deployment", "spec": {"template": {"spec": {}}}}, ("spec", "template")),
        ({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {}}}}},
         ("spec", "jobTemplate", "spec", "template")),
        ({"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"metadata": None}}}}},
         ("spec", "pytorchReplicaSpecs", "Worker", "template")),
    ],
)  # fmt: skip
def test_each_kind_s_pod_template_is_annotated(document: dict[str, Any], path: tuple[str, ...], tmp_path: Path) -> None:
    found = _annotated(json.dumps(document), {"prediction": {"peak_allocated_bytes": 7}}, tmp_path)[0]
    for key in path:
        found = found[key]
    assert found["metadata"]["annotations"] == {PREDICTED_PEAK_ANNOTATION: "7"}


def test_a_document_beside_the_workload_passes_through_and_json_stays_json(tmp_path: Path) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}
    docs = _annotated(yaml.safe_dump(config_map) + "---\n" + JOB, {"prediction": {"peak_allocated_bytes": 7}}, tmp_path)
    assert docs[0] == config_map and PREDICTED_PEAK_ANNOTATION in docs[1]["spec"]["template"]["metadata"]["annotations"]
    path = tmp_path / "pod.json"
    path.write_text(json.dumps({"kind": "Pod"}))
    text = manifest.annotated(manifest.read(str(path)), {PREDICTED_PEAK_ANNOTATION: "7"})
    assert json.loads(text) == {"kind": "Pod", "metadata": {"annotations": {PREDICTED_PEAK_ANNOTATION: "7"}}}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("apiVersion: v1\nkind: Service\nspec:\n  ports: []\n", "a Service, not a Pod, a Job,"),
        ("just: [a, mapping\n", "not YAML"),
        ("- 1\n- 2\n", "no Kubernetes object (no kind)"),
        ('{"kind": ', "not JSON"),
    ],
)
def test_a_manifest_without_a_pod_template_is_refused_in_one_line(text: str, said: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(manifest.ManifestError, match=re.escape(said)) as caught:
        manifest.read(str(path))
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"--annotate {path}: ")


def _predict(capsys: Any, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="oomsight")
    command.add(parser.add_subparsers())
    args = parser.parse_args(["predict", *argv])
    code = int(args.handler(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_the_job_annotated_with_its_prediction(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "model.py").write_text(SPEC)
    (tmp_path / "job.yaml").write_text(JOB)
    module = f"{tmp_path / 'model.py'}:spec"
    code, out, err = _predict(capsys, "--module", module, "--batch", "4", "--steps", "1", "--json",
                              "--annotate", str(tmp_path / "job.yaml"))  # fmt: skip
    assert code == exitcode.OK
    predicted = json.loads(err)["prediction"]  # the prediction on stderr: stdout is the manifest
    notes = yaml.safe_load(out)["spec"]["template"]["metadata"]["annotations"]
    assert notes[PREDICTED_PEAK_ANNOTATION] == str(predicted["peak_allocated_bytes"])
    assert notes[PREDICTED_PEAK_RESERVED_ANNOTATION] == str(predicted["peak_reserved_bytes"])
    weights = 256 * 256 * 4 + 256 * 4  # the Linear's fp32 weight and bias, alive at the peak
    assert predicted["by_category_bytes"]["parameters"] == weights and int(notes[PREDICTED_PEAK_ANNOTATION]) > weights


def test_a_bad_manifest_exits_2_in_one_line_before_anything_is_traced(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "svc.yaml").write_text("kind: Service\n")
    for where, said in ((tmp_path / "svc.yaml", "a Service, not a Pod"), (tmp_path / "gone.yaml", "cannot be read")):
        code, out, err = _predict(capsys, "--module", "no-such-file.py:spec", "--annotate", str(where))
        assert code == exitcode.USAGE and out == ""
        assert err.startswith(f"oomsight predict: --annotate {where}: ") and said in err and err.count("\n") == 1
