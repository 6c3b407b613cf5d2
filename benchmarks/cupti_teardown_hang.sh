#!/usr/bin/env bash
# Does detaching CUPTI after an oomsight window (Kineto's TEARDOWN_CUPTI=1) hang the job?
# On the GPU machine, from the repository root: OUT=/some/dir bash benchmarks/cupti_teardown_hang.sh
# The job is tests/test_gpu_advice.py's PROFILED one under `oomsight run`: it trains until one
# on-demand 5-step window (asked by `oomsight profile`) is written, then runs its own
# torch.profiler session. Cases:
#   teardown  TEARDOWN_CUPTI=1, with oomsight's refusal switched off by the job (it patches
#             oomsight.hook.profiler.unavailable_reason): what oomsight did before it refused
#   off       TEARDOWN_CUPTI=0 (Kineto's default: CUPTI stays attached)
#   late      as teardown, the job's own session 3 s after the window instead of at once
#   nowindow  TEARDOWN_CUPTI=1 and the guard on: no oomsight window (the CLI is refused), the
#             job trains 3 s under oomsight, then runs its own session (done before the CLI asks): does oomsight's mere
#             presence (the sampler thread) hang a job with teardown?
#   memonly   as teardown, but the window is memory-only (`oomsight profile --memory-only`: the
#             autograd profiler without Kineto), then the job's own Kineto session
# A job still alive 3 s after the CLI returned is aborted with its Python stacks (faulthandler).
# Result recorded in benchmarks/results/cupti-teardown-h200.log, where `teardown` is named `unset`:
# that version of oomsight set TEARDOWN_CUPTI=1 itself at the window's start (no patch needed).
# nowindow and memonly: benchmarks/results/cupti-teardown-memonly-h200.log (3 s before the abort is
# short on a cold machine: set ABORT_AFTER=20 to tell a slow job from a hung one).
export PYTHONPATH=exporter:sidecar:webhook PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
D=$OUT/d; mkdir -p "$D"
python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
import test_gpu_advice as t
teardown = (
    'import os, oomsight.hook.profiler\n'
    'oomsight.hook.profiler.unavailable_reason = lambda environ=None: None  # the guard off, for this test only\n'
    'os.environ["TEARDOWN_CUPTI"] = "1"  # read by Kineto when a trace stops\n'
)
open("/tmp/job.py", "w").write(t.PROFILED)
open("/tmp/job_teardown.py", "w").write(teardown + t.PROFILED)
late = t.PROFILED.replace('ours = SpoolReader(spool).read().profiles[0]',
  'ours = SpoolReader(spool).read().profiles[0]\nprint("OURS DONE", flush=True)\nt1 = time.time() + 3\nwhile time.time() < t1: step()\nprint("THEIRS START", flush=True)')
open("/tmp/job_late.py", "w").write(teardown + late)
alone = t.PROFILED.replace("end = time.time() + 60", "end = time.time() + 3").replace(
  'ours = SpoolReader(spool).read().profiles[0]', 'ours = {"steps": 5, "top_by_memory": []}  # no window')
open("/tmp/job_nowindow.py", "w").write(alone)
PY
one() { local name=$1 job=$2; shift 2
  rm -rf "/tmp/sp-$name"
  env "$@" python3 -m oomsight run --port 0 --spool "/tmp/sp-$name" -- python3 "$job" > "$D/job-$name.log" 2>&1 &
  local pid=$!; sleep 10
  timeout 40 python3 -m oomsight profile --spool "/tmp/sp-$name" --steps 5 --wait 30 $CLI > "$D/cli-$name.log" 2>&1
  echo "$name cli rc=$?" | tee -a "$D/summary"
  sleep "${ABORT_AFTER:-3}"; pkill -ABRT -f "python3 $job\$" && echo "$name: job aborted (hung)" | tee -a "$D/summary"
  wait $pid; echo "$name job rc=$?" | tee -a "$D/summary"
  ls -la "/tmp/sp-$name/profiles" >> "$D/summary" 2>&1
}
for c in ${CASES:-teardown off late}; do case $c in
  teardown) one teardown /tmp/job_teardown.py OOMSIGHT_X=1;;
  off) one off /tmp/job.py TEARDOWN_CUPTI=0;;
  late) one late /tmp/job_late.py OOMSIGHT_X=1;;
  nowindow) one nowindow /tmp/job_nowindow.py TEARDOWN_CUPTI=1;;
  memonly) CLI=--memory-only one memonly /tmp/job_teardown.py OOMSIGHT_X=1;;
esac; done
