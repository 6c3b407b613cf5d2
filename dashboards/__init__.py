"""Grafana dashboards (grafanalib) and Prometheus rules of oomsight, as code.

``python -m dashboards`` writes them into the Helm chart; ``--check`` fails when the
committed files drift from these sources.
"""
