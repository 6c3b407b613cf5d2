"""The pod sidecar and the Kubernetes side of oomsight.

- ``main``, ``server``: the sidecar, serving the spool as Prometheus metrics with health endpoints;
- ``events``, ``owner``, ``kubemetrics``: Kubernetes Events on OOM and the pod's owner;
- ``webhook`` (pod -> JSONPatch), ``injection``, ``podspec``, ``patch``, ``admission``,
  ``webhook_server``, ``webhook_main``: the sidecar-injecting admission webhook;
- ``certs``, ``tls``: the webhook's certificates; ``kube``: every Kubernetes API call.

It imports only the wire format, the collector and settings from the ``oomsight`` library
(``oomsight.spool``, ``oomsight.schema``, ``oomsight.inventory``, ``oomsight.collector``,
``oomsight.config``, ``oomsight.units``); ``.importlinter`` checks it.
"""
