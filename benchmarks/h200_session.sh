#!/usr/bin/env bash
# One batched session on the H200 machine (device tool): fixtures, the demo tape, the GPU
# tests and every benchmark. Results land in $OUT/results.tgz (re-packed after each stage,
# so a stage that overruns loses only itself).
set -u
export PYTHONPATH=exporter:sidecar:webhook PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/r
mkdir -p "$R/bench" "$R/fixtures"
pack() { tar czf "$OUT/results.tgz" -C "$OUT" r; }
stage() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.log" 2>&1; echo "rc=$? seconds=$((SECONDS - t0))" | tee -a "$R/$name.log"; pack; }
STAGES="${STAGES:-env fixtures demo gpu-tests overhead sample-cost oom-latency sidecar lightning}"
CORPUS_ARGS="${CORPUS_ARGS:-}"  # e.g. "--cpu-smoke --bare" to try the corpus stages on a CPU (NPROC=2 for multigpu)
export CORPUS_ARGS
for s in $STAGES; do case $s in
  env) stage env 60 bash -c 'nvidia-smi; python3 -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)"; python3 -m pip list 2>/dev/null | grep -iE "torch|lightning|prometheus|nvidia-ml|pytest|hypothesis"';;
  fixtures) stage fixtures 90 python3 tests/fixtures/record_h200.py "$R/fixtures";;
  demo) stage demo 150 python3 -m oomsight run --port 0 --spool /tmp/demo-spool --tape "$R/h200-demo.tape.jsonl.gz" -- python3 -m oomsight.tools.demo_train;;
  gpu-tests) stage gpu-tests 300 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py;;
  gpu-image) stage gpu-image 200 python3 -m pytest -m gpu_image -v -p no:cacheprovider tests/test_predict.py;;
  overhead) stage overhead 240 python3 benchmarks/bench_overhead.py --out "$R/bench";;
  sample-cost) stage sample-cost 90 python3 benchmarks/bench_sample_cost.py --out "$R/bench";;
  oom-latency) stage oom-latency 120 python3 benchmarks/bench_oom_latency.py --out "$R/bench";;
  sidecar) stage sidecar 120 python3 benchmarks/bench_sidecar.py --out "$R/bench";;
  lightning) stage lightning 200 python3 benchmarks/bench_lightning.py --out "$R/bench";;
  gpu-advice) stage gpu-advice 420 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_advice.py;;
  gpu-integrations) stage gpu-integrations 240 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_integrations.py;;
  batch-probe) stage batch-probe 150 python3 benchmarks/bench_batch_probe.py --out "$R/bench";;
  profile) stage profile 300 python3 benchmarks/bench_profile.py --out "$R/bench";;
  profile-memory) stage profile-memory 330 python3 benchmarks/bench_profile.py --variants control,teardown_off,memory_only --reps 3 --name profile_overhead_memory_only.json --out "$R/bench";;
  overhead-launch) stage overhead-launch 240 python3 benchmarks/bench_overhead.py --models launch_bound --variants baseline,oomsight_defaults --rounds 150 --steps 100 --name overhead-launch-bound.json --out "$R/bench";;
  overhead-dose) stage overhead-dose 200 python3 benchmarks/bench_overhead.py --models launch_bound --variants baseline,oomsight_defaults,oomsight_sample_1khz --rounds 60 --steps 100 --name overhead-launch-bound-dose.json --out "$R/bench";;
  accounting) stage accounting 120 python3 benchmarks/bench_cost_accounting.py --out "$R/bench";;
  heldout) stage heldout 330 python3 benchmarks/heldout/run.py --out "$R/heldout" --jobs 8 --no-remedy;;
  heldout-remedy) stage heldout-remedy 420 python3 benchmarks/heldout/run.py --out "$R/heldout" --jobs 8;;
  piles) stage piles 240 bash -c 'python3 benchmarks/heldout/run.py --out "$1/piles" --jobs 2 --only gpt2_summed_microbatches_after_checkpoint_save,gpt2_eval_mode_summed_microbatches_after_checkpoint_save,reinforce_long_episode,lstm_tbptt_after_no_grad_validation,gpt2_validation_keeps_graphs_in_training_job
    python3 benchmarks/corpus/evaluate.py "$1/piles" --json "$1/piles/judged.json"' _ "$R";;  # -> tests/fixtures/heldout-wire18
  heldout-judge) stage heldout-judge 60 python3 benchmarks/corpus/evaluate.py "$R/heldout" --json "$R/heldout/judged.json";;
  predict-verify) stage predict-verify 300 python3 benchmarks/bench_predict.py --out "$R/bench" --measured benchmarks/results/predict.json --reuse benchmarks/results/predict.json --fresh bert-bf16-adamw,vit_b_16-fp32-adamw,vit_b_16-bf16-accum2 --deadline 200;;
  predict-real) stage predict-real 300 python3 benchmarks/bench_predict_real.py --out "$R/bench/predict-real.json" --deadline 210 --timeout 150;;
  cluster) stage cluster 280 python3 benchmarks/corpus/run.py --script cluster --out "$R/cluster" --jobs 4 --timeout 240 $CORPUS_ARGS;;
  multigpu) stage multigpu 230 bash -c 'n=${NPROC:-$(nvidia-smi -L | wc -l)}; if [ "$n" -lt 2 ]; then echo "SKIP multigpu: $n GPU"; exit 0; fi
    python3 benchmarks/corpus/run.py --script multigpu --nproc "$n" --out "$1/multigpu" --timeout 110 $CORPUS_ARGS' _ "$R";;
  cluster-judge) stage cluster-judge 30 bash -c 'for d in cluster multigpu; do [ -f "$1/$d/labels.json" ] || continue
    python3 benchmarks/corpus/evaluate.py "$1/$d" --json "$1/$d/judged.json"; done' _ "$R";;
  overhead-gpu) stage overhead-gpu 120 python3 benchmarks/bench_overhead.py --rounds 20 --models gpu_bound --name overhead-gpu-bound.json --out "$R/bench";;
esac; done
