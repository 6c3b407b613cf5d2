"""The pod sidecar: serves the spool as Prometheus metrics, with health endpoints.

It imports only the wire format and the collector from the ``oomsight`` library
(``oomsight.spool``, ``oomsight.schema``, ``oomsight.inventory``, ``oomsight.collector``).
"""
