"""A spool written by the previous release (its shipped H200 tape, from c66b275) still reads with
zero invalid documents: a newer reader reads an older writer's files."""

import os

from oomsight.tools import tape
from oomsight.wire.spool import SpoolReader

from fakes import ROOT

OLD_TAPE = os.path.join(ROOT, "tests", "fixtures", "h200", "previous-release.tape.jsonl.gz")


def test_the_previous_releases_spool_reads_with_zero_skipped_documents(tmp_path):
    spool = str(tmp_path / "spool")
    tape.replay(OLD_TAPE, spool, speed=1e6, sleep=lambda s: None)
    state = SpoolReader(spool).read()
    assert len(state.snapshots) == 2 and len(state.events) == 1
    assert sum(state.skipped_total.values()) == 0, state.skipped_total
