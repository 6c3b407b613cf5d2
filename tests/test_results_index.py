"""The index of recorded results (issue 35, step 5): every results file that ``docs/`` or the
README names exists, has its row in ``benchmarks/results/README.md``, and every file of the folder
is indexed there."""

from __future__ import annotations

import fnmatch
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
INDEX = os.path.join(RESULTS, "README.md")
CHART = os.path.join(ROOT, "helm", "oomsight")
OTHER_FILES = {
    "api.json",  # the fake API server's recorded calls (docs/testing.md)
    "config.json",  # a model's configuration (docs/cli.md, docs/prediction.md)
    "dra-budget.json",  # the sidecar's budget file in the spool (docs/alerts.md)
    "diff-*.json",  # bench_predict.py --diff output (docs/prediction.md)
    "kernels-*.json",  # bench_predict.py --diff output (docs/prediction.md)
    "events-posted.json",  # the sidecar's state file
    "labels.json",  # a corpus run's labels
    "memory_stats_flat.json",  # a recorded fixture
    "trainer_state.json",  # Hugging Face's
}
"""Bare ``*.json`` names in the docs that are not results files (results files are matched first)."""


def recorded() -> list[str]:
    """Every entry of the folder as the index names it: top-level files and folders, and the files of
    ``history/``."""
    top = [name + ("/" if os.path.isdir(os.path.join(RESULTS, name)) else "") for name in os.listdir(RESULTS)]
    history = [f"history/{name}" for name in os.listdir(os.path.join(RESULTS, "history"))]
    return sorted({*top, *history} - {"README.md", "history/"})


def citations() -> dict[str, set[str]]:
    """Results file (as the index names it) -> the docs that cite it: ``results/<path>`` anywhere, a
    bare backticked ``<name>.json``/``.log`` that a results file has, and globs (``overhead-*.json``)."""
    entries = recorded()
    by_name = {os.path.basename(e.rstrip("/")): e for e in entries if not e.startswith("history/")}
    found: dict[str, set[str]] = {}
    docs = [*glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True), os.path.join(ROOT, "README.md")]
    for doc in docs:
        with open(doc) as fh:
            text = fh.read()
        name = os.path.relpath(doc, ROOT)
        for path in re.findall(r"(?:benchmarks/)?results/([\w./-]*[\w/])", text):
            if path not in ("README.md", "history/"):  # the index itself and its folder of replaced runs
                found.setdefault(path, set()).add(name)
        for token in re.findall(r"`([\w./*-]+\.(?:json|log))`", text):
            if "results/" in token or any(
                glob.glob(os.path.join(d, token)) for d in (ROOT, CHART, os.path.dirname(doc))
            ):
                continue
            matches = [e for e in entries if fnmatch.fnmatch(e, token)] if "*" in token else []
            base = os.path.basename(token)
            if token.startswith("history/") or base in by_name:
                matches.append(token if token.startswith("history/") else by_name[base])
            elif not matches:
                assert base in OTHER_FILES, f"{name} names {token}: neither a results file nor one of OTHER_FILES"
            for match in matches:
                found.setdefault(match, set()).add(name)
    return found


def indexed() -> set[str]:
    """The files the index's tables name in their ``file`` column."""
    names: set[str] = set()
    column = None
    with open(INDEX) as fh:
        for line in fh.read().splitlines():
            cells = line.strip("|").split(" | ")
            if not line.startswith("|"):
                column = None
            elif column is None:
                column = [c.strip() for c in cells].index("file")
            else:
                names.update(re.findall(r"`([^`]+)`", cells[column]))
    return names


def test_every_results_file_the_docs_name_exists():
    missing = {
        path: sorted(docs) for path, docs in citations().items() if not os.path.exists(os.path.join(RESULTS, path))
    }
    assert not missing, f"cited but not in benchmarks/results: {missing}"


def test_every_cited_results_file_has_its_row_in_the_index():
    unindexed = {path: sorted(docs) for path, docs in citations().items() if path not in indexed()}
    assert not unindexed, f"cited but without a row in benchmarks/results/README.md: {unindexed}"


def test_every_file_of_the_results_folder_is_indexed():
    assert citations()  # the scan finds the docs' citations
    unindexed = sorted(set(recorded()) - indexed())
    assert not unindexed, f"in benchmarks/results/ but not indexed by its README.md: {unindexed}"
