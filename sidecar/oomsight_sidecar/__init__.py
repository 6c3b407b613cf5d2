"""The per-pod sidecar of oomsight.

- ``main``, ``server``: the sidecar, serving the spool as Prometheus metrics with health endpoints;
- ``admin``: the loopback admin endpoint (profile requests, artifacts);
- ``events``, ``owner``, ``kubemetrics``: Kubernetes Events on OOM and the pod's owner;
- ``kube``: every Kubernetes API call; ``settings``: its settings groups.

It imports only ``oomsight.wire``, ``oomsight.metrics``, ``oomsight.analysis`` and
``oomsight.config`` from the library, never the hook; ``.importlinter`` checks it.
"""
