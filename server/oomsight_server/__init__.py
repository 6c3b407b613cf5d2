"""The serving and Kubernetes platform that the sidecar and the webhook both stand on.

- ``listener``: the bounded HTTP event loop (limits, descriptors, workers); ``connection``: the
  table of the connections it holds (admission, eviction, fairness; no sockets);
- ``wsgi``: ``serve`` and ``stop`` for a WSGI app on that listener;
- ``kube``: every Kubernetes API call, behind one small interface; ``counter``: the labelled
  counter families both build from their counts;
- ``owner``: the workload a pod belongs to (the webhook records it, the sidecar publishes it).

It imports ``oomsight.config`` from the library, and neither ``oomsight_sidecar`` nor
``oomsight_webhook`` (``.importlinter`` checks it): both import it as siblings.
"""
