"""Webhook memory at the worst review its limits allow, concurrency included.

    PYTHONPATH=exporter:sidecar:webhook python3 benchmarks/bench_webhook_memory.py --out benchmarks/results

A real ``oomsight webhook`` (TLS, loopback) gets ``--connections`` kept-alive connections at
once, each posting ``--reviews`` AdmissionReviews of about ``--body-kib`` KiB (under
``max_review_bytes``, so every one is parsed and mutated, within ``max_containers``), in
two sizes (812 KiB, as the issue's attack; 1020 KiB, just under the 1 MiB
``max_review_bytes``) and several shapes: a pod of 500 containers with long env lists (what the API server sends),
and JSON that costs the most objects per byte (empty maps and lists, short strings in an
unknown field; the API server drops unknown fields, a client posting directly does not).
Each shape runs on a fresh process; its peak resident memory (``VmHWM``) is the figure the
chart's ``webhook.resources.limits.memory`` is set from (docs/kubernetes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(ROOT, "tests")]

from common import write  # noqa: E402

from webhookproc import review, status_kib, webhook_process  # noqa: E402

MAX_CONTAINERS = 500


def base_pod(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wide", "namespace": "team-a", "annotations": {}},
        "spec": {"containers": containers},
    }


def gpu_container(i: int, env: list[dict[str, str]]) -> dict[str, Any]:
    return {"name": f"c{i}", "image": "pytorch", "env": env, "resources": {"limits": {"nvidia.com/gpu": 1}}}


def pod_of_envs(target: int) -> dict[str, Any]:
    """500 GPU containers, each with env entries of tiny names: the most a valid pod holds."""
    per = max(1, (target // MAX_CONTAINERS) // 24)
    env = [{"name": f"E{j}", "value": ""} for j in range(per)]
    return base_pod([gpu_container(i, env) for i in range(MAX_CONTAINERS)])


def pod_with_extra(target: int, item: Any, item_bytes: int) -> dict[str, Any]:
    """One GPU container and an unknown field filled with ``item``s up to the target size."""
    pod = base_pod([gpu_container(0, [])])
    pod["metadata"]["extra"] = [item] * (target // item_bytes)
    return pod


SHAPES: dict[str, Callable[[int], dict[str, Any]]] = {
    "500 containers, env lists": pod_of_envs,
    "empty maps": lambda n: pod_with_extra(n, {}, 3),
    "empty lists": lambda n: pod_with_extra(n, [], 3),
    "one-letter strings": lambda n: pod_with_extra(n, "a", 4),
}


def fitted(shape: Callable[[int], dict[str, Any]], body_bytes: int) -> bytes:
    """The shape's review grown or shrunk to about ``body_bytes``."""
    target = body_bytes
    for _ in range(6):
        body = review(shape(target))
        target = int(target * body_bytes / len(body))
    return review(shape(target))


def run(body: bytes, connections: int, reviews: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, webhook_process(folder) as hook:
        baseline = status_kib(hook.proc.pid, "VmRSS")
        statuses: list[int] = []
        results: list[str] = []
        lock = threading.Lock()

        def client() -> None:
            conn = hook.connection(timeout=60)
            try:
                for _ in range(reviews):
                    status, text = hook.post(body, conn)
                    patched = status == 200 and "patch" in json.loads(text)["response"]
                    with lock:
                        statuses.append(status)
                        results.append("injected" if patched else "unchanged")
            finally:
                conn.close()

        start = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        seconds = time.monotonic() - start
        peak = status_kib(hook.proc.pid, "VmHWM")
    return {
        "body_bytes": len(body),
        "baseline_rss_mib": round(baseline / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "seconds": round(seconds, 2),
        "answers": {str(s): statuses.count(s) for s in sorted(set(statuses))},
        "injected": results.count("injected"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--reviews", type=int, default=4)
    parser.add_argument("--body-kib", type=int, nargs="+", default=[812, 1020])
    args = parser.parse_args()
    sizes: dict[str, dict[str, Any]] = {}
    for kib in args.body_kib:
        for name, shape in SHAPES.items():
            result = run(fitted(shape, kib * 1024), args.connections, args.reviews)
            sizes.setdefault(f"{kib} KiB", {})[name] = result
            print(kib, "KiB,", name, result, flush=True)
    doc = {
        "connections": args.connections,
        "reviews_per_connection": args.reviews,
        "max_review_bytes": 1024 * 1024,
        "sizes": sizes,
        "worst_peak_rss_mib": max(r["peak_rss_mib"] for shapes in sizes.values() for r in shapes.values()),
    }
    write(args.out, "webhook_memory.json", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
