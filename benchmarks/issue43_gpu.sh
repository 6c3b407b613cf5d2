#!/usr/bin/env bash
# Issue 43 on one GPU machine (device tool, repo root as cwd): the seven fresh held-out workloads
# (benchmarks/heldout/wl_unseen.py) under `oomsight run --tape`, their remedy runs, the judgement of
# the tapes (benchmarks/corpus/evaluate.py: diagnosis, remedy fits, the live leak flag), then the
# GPU tests of tests/test_gpu.py with whatever time is left. Under 9 minutes wall; results under $OUT:
#   $OUT/heldout/            labels.json, runs.json;  $OUT/heldout-tapes.tar the tapes
#   $OUT/issue43-judged.json evaluate.py's JSON;  $OUT/*.log the stages' output
#   GPU_TESTS=0              skip the GPU tests;  PYTHON=python3 (default);  JOBS=4 runs at once
#                            (8: each wave at once, the caps sum to ~65 GiB)
set -u
export PYTHONPATH=exporter:sidecar:webhook PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
NAMES=gpt2_batch_size_doubling,gpt2_accum_keeps_microbatch_logits,gpt2_accum_window_keeps_logits,gpt2_progressive_unfreezing_adamw,dqn_replay_buffer_fills_then_flat,classifier_epoch_metric_buffers_fits,gpt2_frozen_base_lora_no_room,moe_router_collapse_padded_dispatch
BUDGET=530  # seconds for the whole script
stage() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s)"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/$name.log"; }

stage env 30 bash -c "nvidia-smi --query-gpu=name,memory.total --format=csv; $PY -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'; $PY -c 'import bitsandbytes as b; print(\"bitsandbytes\", b.__version__)' || echo 'no bitsandbytes (the LoRA remedy takes its bf16 base)'"
# 7 plain runs (4 at a time) + 5 remedy runs (the two `none` jobs have none): two waves each
stage heldout 400 "$PY" benchmarks/heldout/run.py --out "$OUT/heldout" --only "$NAMES" --jobs "${JOBS:-4}" --timeout 170
stage judge 60 "$PY" benchmarks/corpus/evaluate.py "$OUT/heldout" --json "$OUT/issue43-judged.json"
# one archive of the tapes (the device tool brings back 8 files); the spools are left there
( cd "$OUT/heldout" && tar cf ../heldout-tapes.tar ./*.tape.jsonl.gz ) && rm -rf "$OUT/heldout/spools" "$OUT"/heldout/*.tape.jsonl.gz

left=$((BUDGET - SECONDS))
if [ "${GPU_TESTS:-1}" != "0" ] && [ "$left" -ge 60 ]; then
  lim=$(( left < 240 ? left : 240 ))
  stage gpu-tests "$lim" env PYTHONPATH=exporter:server:sidecar:webhook "$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py
else
  echo "== gpu-tests skipped (GPU_TESTS=${GPU_TESTS:-1}, ${left}s left)"
fi

echo "== summary (${SECONDS}s wall)"
"$PY" benchmarks/heldout/summarize.py "$OUT" issue43-judged.json
tail -n 3 "$OUT/gpu-tests.log" 2>/dev/null
