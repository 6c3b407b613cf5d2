"""The sidecar-injecting admission webhook of oomsight.

- ``main``, ``server``: the HTTPS server answering AdmissionReviews, with health and metrics;
- ``admission`` (AdmissionReview in and out), ``mutation`` (pod -> JSONPatch), ``injection``
  (what to inject, from annotations and settings), ``podspec`` (the injected objects), ``patch``;
- ``certs``, ``tls``: its certificates (self-managed in a Secret, or files from cert-manager);
- ``settings``: ``WebhookSettings`` from ``OOMSIGHT_WEBHOOK_*``.

It stands on ``oomsight_server`` (the bounded HTTP listener, the Kubernetes client, the owner
lookup), as the sidecar does, imports nothing from ``oomsight_sidecar``, and only
``oomsight.config`` and the wire layer from the library; ``.importlinter`` checks it.
"""
