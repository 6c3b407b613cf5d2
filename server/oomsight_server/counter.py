"""Counter families the servers build per scrape from their own counts (Events posted, admissions,
API and serving errors): one series per key, zeros included, so a rate never starts from nothing."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily


def labelled_counter(name: str, documentation: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family with one series per key of ``counts`` (all present, zeros included)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, value in counts.items():
        family.add_metric([key], value)
    return family
