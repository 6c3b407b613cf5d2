"""The index of recorded results (issue 35, step 5): every results file that ``docs/`` or the
README names exists, has its row in ``benchmarks/results/README.md``, and every file of the folder
is indexed there."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import subprocess
import sys

import pytest

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
    return sorted({*top, *history} - {"README.md", "provenance.json", "history/"})


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


# Provenance (issue 52): every results file names the tree it measured, and the index marks the ones
# whose measured code has moved on since. ``python tests/test_results_index.py --write`` fills rows for
# new files from git and renews the marks; ``--check`` says whether provenance.json is current.

PROVENANCE = os.path.join(RESULTS, "provenance.json")
STALE_AFTER_COMMITS = 20
"""A results file is stale once the code it measures changed in more than this many commits after the
tree it was recorded on: a few commits are a fix or a rename beside the measured path; twenty are another
program than the one measured. Stale is not wrong: it is due a re-run before a doc quotes it as current."""
HOOK = "exporter/oomsight/hook"
READER = ("sidecar/oomsight_sidecar", "server/oomsight_server", "exporter/oomsight/metrics")
JUDGE = ("benchmarks/corpus", "benchmarks/heldout", "exporter/oomsight/analysis")
LAYOUT_WALK = tuple(f"{HOOK}/{name}.py" for name in ("layout", "accounting", "parallelism", "discovery"))
PREDICT = ("benchmarks/*predict*.py", "exporter/oomsight/predict", "exporter/oomsight/tools/predict_command.py")
FORMERLY = {
    "exporter/oomsight/predict": ("exporter/oomsight/tools/predict", "exporter/oomsight/analysis/allocator.py"),
    "exporter/oomsight/tools/predict_command.py": ("exporter/oomsight/tools/predict/command.py",),
    **{path: (f"{HOOK}/layout.py",) for path in LAYOUT_WALK[1:]},
}
"""A measured path -> where its code was before a move that changed no behaviour (issue 52: predict out of
``tools/``, its allocator model out of ``analysis/``, the command beside the CLI): the commits on the old
paths count too, so a move neither renews a mark nor hides the history it was judged on."""
MEASURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("history/*", ()),  # replaced runs, kept as recorded: their tree is gone, never stale
    ("overhead*", ("benchmarks/bench_overhead.py", HOOK, "exporter/oomsight/wire")),
    ("cost_accounting_*", ("benchmarks/bench_cost_accounting.py", HOOK)),
    ("sample*cost*", ("benchmarks/bench_sample_cost.py", HOOK)),
    ("sampler_thread_cpu.json", ("benchmarks/bench_sampler_thread.py", HOOK)),
    ("lightning.json", ("benchmarks/bench_lightning.py", HOOK)),
    ("oom_latency.json", ("benchmarks/bench_oom_latency.py", HOOK, *READER)),
    ("sidecar.json", ("benchmarks/bench_sidecar.py", *READER)),
    ("webhook_memory.json", ("benchmarks/bench_webhook_memory.py", "webhook/oomsight_webhook")),
    ("batch_probe.json", ("benchmarks/bench_batch_probe.py", "exporter/oomsight/tools/probe.py")),
    ("profile_overhead*", ("benchmarks/bench_profile.py", f"{HOOK}/profiler.py")),
    ("cupti-*", ("benchmarks/cupti_teardown_hang.sh", "benchmarks/cupti_sessions.py", f"{HOOK}/profiler.py")),
    ("gpu-*", ("tests/test_gpu.py", "tests/test_gpu_advice.py", "tests/test_gpu_integrations.py", "exporter/oomsight")),
    ("forward_hook_cpu*", ("benchmarks/bench_forward_hook.py", f"{HOOK}/forwards.py")),
    ("step_hook_parts_cpu.json", ("benchmarks/bench_step_hook_parts.py", HOOK)),
    ("forecast.json", ("benchmarks/bench_forecast.py", "exporter/oomsight/analysis/forecast.py")),
    ("layout_walk.json", ("benchmarks/bench_layout_walk.py", *LAYOUT_WALK)),
    ("live_models.json", ("benchmarks/bench_live_models.py", f"{HOOK}/discovery.py")),
    ("predict*", PREDICT),
    ("prometheus_scale_*", ("benchmarks/bench_prometheus_scale.py", "exporter/oomsight/metrics", "dashboards")),
    ("reader_*", ("benchmarks/bench_reader_scale.py", *READER)),
    ("scrape_budget.json", ("benchmarks/bench_scrape_budget.py", *READER)),
    ("step_verdict.json", ("benchmarks/bench_step_verdict.py", "exporter/oomsight/analysis")),
    ("leak_detection.json", ("benchmarks/bench_leak_detection.py", "exporter/oomsight/analysis")),
    ("publish_cost_cpu.json", ("benchmarks/bench_publish_cost.py", HOOK, "exporter/oomsight/wire")),
    ("job_space*", ("benchmarks/bench_job_space.py", "exporter/oomsight/analysis")),
    ("scorecard.json", ("benchmarks/scorecard.py", *JUDGE)),
    ("cluster-*", JUDGE),
    ("corpus*", JUDGE),
    ("heldout-*", JUDGE),
    ("rejudged-*", JUDGE),
)
"""Results file (an ``fnmatch`` pattern on its name in the index, first match wins) -> the code it
measures: the script that writes it and the package folders or modules it exercises. A new results file
that no pattern matches fails the test until it gets its row."""


def measured(entry: str) -> tuple[str, ...]:
    """The code paths a results file measures (``MEASURES``); an assertion names one no pattern covers."""
    for pattern, paths in MEASURES:
        if fnmatch.fnmatch(entry, pattern):
            return paths
    raise AssertionError(f"{entry}: no row of MEASURES says which code it measures")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def full_history() -> bool:
    """Whether this tree is a git checkout with its whole history: the stale marks count commits."""
    try:
        return git("rev-parse", "--is-shallow-repository") == "false"
    except (OSError, subprocess.CalledProcessError):
        return False


needs_history = pytest.mark.skipif(not full_history(), reason="the marks count commits: a full git clone only")


def carried(entry: str) -> dict[str, str] | None:
    """The ``commit`` and ``date`` a JSON results file records itself, if it does."""
    if not entry.endswith(".json"):
        return None
    with open(os.path.join(RESULTS, entry)) as fh:
        data = json.load(fh)
    if isinstance(data, dict) and isinstance(data.get("commit"), str) and isinstance(data.get("date"), str):
        return {"commit": data["commit"], "date": data["date"], "source": "recorded in the file"}
    return None


def added(entry: str) -> dict[str, str]:
    """The commit that added a results file (before any rename) and its date: the tree it was recorded
    on, best known."""
    follow = () if entry.endswith("/") else ("--follow",)  # through renames: into history/, for one
    log = git("log", *follow, "--diff-filter=A", "--format=%h %cs", "--", os.path.join("benchmarks", "results", entry))
    assert log, f"{entry} is in no commit yet: commit it, or give it its own commit and date keys"
    commit, date = log.splitlines()[-1].split()
    return {"commit": commit, "date": date, "source": "git: the commit that added the file"}


def stale(commit: str, paths: tuple[str, ...]) -> dict[str, object]:
    """The generated part of a row: the commits since ``commit`` that changed ``paths``, and whether
    they are more than ``STALE_AFTER_COMMITS``."""
    if not paths:
        return {"stale": False}
    paths = (*paths, *(old for path in paths for old in FORMERLY.get(path, ())))
    changes = int(git("rev-list", "--count", f"{commit}..HEAD", "--", *paths))
    return {"stale": changes > STALE_AFTER_COMMITS}


def load_provenance() -> dict[str, dict[str, object]]:
    if not os.path.exists(PROVENANCE):
        return {}
    with open(PROVENANCE) as fh:
        files: dict[str, dict[str, object]] = json.load(fh)["files"]
    return files


def provenance() -> dict[str, dict[str, object]]:
    """provenance.json as it should be now: each results file's own ``commit``/``date`` keys (or its
    row as recorded, or the commit that added it), its measured paths and its stale mark."""
    old = load_provenance()
    rows: dict[str, dict[str, object]] = {}
    for entry in recorded():
        kept = {k: old[entry][k] for k in ("commit", "date", "source")} if entry in old else None
        row = carried(entry) or kept or added(entry)  # a file's own keys first: it may be re-recorded
        paths = measured(entry)
        rows[entry] = {**row, "measures": list(paths), **stale(str(row["commit"]), paths)}
    return rows


def rendered(rows: dict[str, dict[str, object]]) -> str:
    about = (
        "Generated by `python tests/test_results_index.py --write` (benchmarks/results/README.md, "
        "'Provenance'). commit/date: the tree each file measured; where source is git, the commit that "
        "added the file, the best known. measures: the code it measures; stale: those paths changed in "
        f"more than {STALE_AFTER_COMMITS} commits since."
    )
    lines = [f"  {json.dumps(entry)}: {json.dumps(row, sort_keys=True)}" for entry, row in sorted(rows.items())]
    body = ",\n".join(lines)
    return f'{{\n "about": {json.dumps(about)},\n "files": {{\n{body}\n }}\n}}\n'  # a row a line


def test_every_results_file_names_the_tree_it_measured():
    rows = load_provenance()
    missing = [entry for entry in recorded() if entry not in rows and not carried(entry)]
    assert not missing, f"no commit and date: run python tests/test_results_index.py --write: {missing}"
    for entry in recorded():
        row = rows.get(entry) or carried(entry) or {}
        assert re.fullmatch(r"[0-9a-f]{7,40}", str(row["commit"])), entry
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(row["date"])), entry


def test_every_measured_path_exists():
    for entry in recorded():
        for path in measured(entry):
            assert glob.glob(os.path.join(ROOT, path)), f"{entry} measures {path}, which is gone"


@needs_history
def test_the_stale_marks_of_the_index_are_current():
    """Results may be old; the index must say so. Fails when provenance.json's marks drift from git."""
    with open(PROVENANCE) as fh:
        assert fh.read() == rendered(provenance()), "run python tests/test_results_index.py --write"


@needs_history
def test_a_file_carries_its_own_commit_and_date_or_is_taken_from_git(tmp_path, monkeypatch):
    (tmp_path / "new.json").write_text(json.dumps({"commit": "abc1234", "date": "2026-12-07", "rows": []}))
    (tmp_path / "old.json").write_text(json.dumps({"rows": []}))
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", str(tmp_path))
    assert carried("new.json") == {"commit": "abc1234", "date": "2026-12-07", "source": "recorded in the file"}
    assert carried("old.json") is None
    assert added("overhead.json")["source"] == "git: the commit that added the file"


def test_a_results_file_no_pattern_covers_is_named():
    with pytest.raises(AssertionError, match="no row of MEASURES"):
        measured("a-new-measurement.json")


@needs_history
def test_a_file_is_stale_once_its_code_changed_in_more_commits_than_the_limit():
    first = git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    assert stale(first, ("exporter/oomsight",)) == {"stale": True}
    assert stale(git("rev-parse", "HEAD"), ("exporter/oomsight",)) == {"stale": False}
    assert stale(first, ()) == {"stale": False}


@needs_history
def test_a_moved_path_counts_the_commits_of_its_former_name():
    """The predict results were judged on ``tools/predict``: their marks still count its commits."""
    recorded_on = "fbb5ada"  # predict.json's tree, before the move out of tools/
    package = "exporter/oomsight/predict"
    new_name = int(git("rev-list", "--count", f"{recorded_on}..HEAD", "--", package))
    both = int(git("rev-list", "--count", f"{recorded_on}..HEAD", "--", package, *FORMERLY[package]))
    assert both > new_name and stale(recorded_on, (package,)) == {"stale": True}


if __name__ == "__main__":
    current = rendered(provenance())
    if sys.argv[1:] == ["--write"]:
        with open(PROVENANCE, "w") as fh:
            fh.write(current)
    elif sys.argv[1:] == ["--check"]:
        with open(PROVENANCE) as fh:
            sys.exit(0 if fh.read() == current else 1)
    else:
        sys.exit("usage: python tests/test_results_index.py --write | --check")
