"""Prometheus: every metric family as one table row (``family``) and the collector that builds
them from a spool on each scrape (``collector``). Never imported by the hook."""
