"""The per-pod sidecar of oomsight.

- ``main``, ``server``: the sidecar, serving the spool as Prometheus metrics with health endpoints;
- ``admin``: the loopback admin endpoint (profile requests, artifacts);
- ``events``, ``kubemetrics``, ``claims``: Kubernetes Events on OOM, the pod's owner, its claims;
- ``settings``: its settings groups.

It stands on ``oomsight_server`` (the bounded HTTP listener, the Kubernetes client, the owner
lookup), as the webhook does, and imports only ``oomsight.wire``, ``oomsight.metrics``,
``oomsight.analysis`` and ``oomsight.config`` from the library, never the hook;
``.importlinter`` checks it.
"""
