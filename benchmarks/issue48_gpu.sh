#!/usr/bin/env bash
# Issue 48, item 6, on one GPU machine (device tool, repo root as cwd): the eight fresh held-out jobs of
# benchmarks/heldout/wl_issue48.py under `oomsight run --tape`, each with its remedy run, the judgement of
# the tapes (benchmarks/corpus/evaluate.py: cause, first remedy against the fix that fitted, the live leak
# flag), one archive of what tests/fixtures/heldout-issue48/ takes, and a summary. Under 9 minutes wall
# (about 4-6 expected). Results under $OUT (6 files; the device tool brings back at most 8):
#   $OUT/env.log $OUT/heldout.log $OUT/judge.log   the stages' output
#   $OUT/issue48-judged.json                       evaluate.py's JSON
#   $OUT/issue48-tapes.tar                         the 8 tapes + labels.json (these 8) + runs.json: untar it
#                                                  into tests/fixtures/heldout-issue48/ for CI
#   $OUT/summary.txt                               one line a run and a judgement a workload (also on stdout)
# JOBS=8 (default) runs the 7 capped plain runs at once, then the 7 capped remedy runs at once: their caps
# sum to ~53 GiB (GiB: Trainer 4, attention LM ~11, BERT ~5.6, BART 20, ResNet ~3.8, GAN ~2.9, MoCo ~6; those
# set from a measured graph print "cap ..." first in their output, estimated here from saved-tensor bytes)
# plus ~0.5 GiB of CUDA context each: ~57 GiB, under 78 GiB. Stage limits (40 + 400 + 60 s) keep the script under 9 minutes even if runs hang. JOBS=4 halves that per wave and takes
# about 2 minutes longer. The worker job (other_process) fills the real GPU and runs alone, after them.
# PYTHON=python3 (default).
set -u
export PYTHONPATH=exporter:sidecar:webhook PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
NAMES=hf_trainer_evaluate_keeps_logits,lm_attention_keeps_last_probs_for_plots,bert_large_mlm_foreach_adamw_first_step,finetune_spawn_workers_augment_on_gpu,bart_beam_search_summaries_batch_too_large,resnet_validation_in_train_mode_keeps_logits,progan_generator_step_with_frozen_discriminator,moco_deque_queue_fills_then_batch_grows
H=$OUT/heldout
stage() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s)"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/$name.log"; }

stage env 40 bash -c "nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; nproc; free -g | head -2; df -h /dev/shm; $PY -c 'import sys, torch, transformers, accelerate; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, accelerate.__version__)'"
# 7 capped plain runs, 7 capped remedy runs (JOBS at once), then the worker job and its remedy alone
stage heldout 400 "$PY" benchmarks/heldout/run.py --out "$H" --only "$NAMES" --jobs "${JOBS:-8}" --timeout 150
# labels.json of these eight only (run.py writes every held-out workload's), as the fixture folder keeps it
"$PY" - "$H" "$NAMES" <<'EOF'
import json, os, sys
path = os.path.join(sys.argv[1], "labels.json")
labels = json.load(open(path))
json.dump({n: labels[n] for n in sys.argv[2].split(",")}, open(path, "w"), indent=1)
EOF
stage judge 60 "$PY" benchmarks/corpus/evaluate.py "$H" --json "$OUT/issue48-judged.json"
( cd "$H" && tar cf ../issue48-tapes.tar labels.json runs.json ./*.tape.jsonl.gz )

echo "== summary (${SECONDS}s wall)"
"$PY" benchmarks/heldout/summarize.py "$OUT" issue48-judged.json --detail | tee "$OUT/summary.txt"
# the spools stay on the device; the tapes travel in the archive
rm -rf "$H"
echo "== done (${SECONDS}s wall)"
