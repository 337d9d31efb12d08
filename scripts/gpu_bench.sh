#!/usr/bin/env bash
# Issue 39's benchmarks on the GPU host in one call (about 400 s, at most 480 s + 30 s of kill grace): rescoring with
# Scorer(...).score end to end at the 1.5B shape, capture against vLLM's generate on a random 1.5B-shape
# Llama built in the run, the run recorder. Each step runs in its own process with its own time limit;
# a step that fails or runs past it is recorded in $OUT/gpu_bench.txt and the next still runs.
#
#   usage (from the project root, after the bundle's part1, part2 and part3; ../shared/gpu/README.md):
#     bash scripts/gpu_bench.sh "$OUT"
#
# Writes into OUT: rescoring_<card>_1p5b.json, capture_<card>.json, recorder_<card>_host.json, a log per
# step and gpu_bench.txt (one line per step: exit code and seconds; 124 = ran past its limit).
set -u
out=${1:-${OUT:-}}
if [[ -z "$out" ]]; then
  echo "usage: bash scripts/gpu_bench.sh OUT_DIR (or set OUT)" >&2
  exit 2
fi
if [[ ! -f /tmp/site/.rlparity-gpu-ok ]]; then
  echo "vLLM is not installed on this host (/tmp/site/.rlparity-gpu-ok missing: the host was given back);" \
       "install the bundle's part1, part2 and part3 again (../shared/gpu/README.md)" >&2
  exit 9
fi
if [[ ! -f /tmp/site/.rlparity-gpu-part3 ]]; then
  echo "warning: the bundle's part3 is not installed (zarr, numcodecs, plotly): the recorder step will fail" >&2
fi
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn \
  RLPARITY_ENGINE_LOCK=off
py=${PYTHON:-python3}
card=$($py -c "import torch; print(torch.cuda.get_device_name().replace('NVIDIA ', '').split()[0].lower())" 2>/dev/null \
  || echo gpu)
echo "card: $card; $(date -u +%FT%TZ)" | tee "$out/gpu_bench.txt"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/gpu_bench.txt"
  grep -v "^(EngineCore\|^(Worker\|^(VllmWorker\| INFO \|^INFO" "$out/$name.log" | tail -n 30
}

# 1. rescoring, 1.5B shape: bare forward, Scorer's per-batch path (fp32 and bf16 heads), and
#    Scorer(...).score(trace) end to end (first call, steady with / without the self-check); ~80-130 s (a passed-in model is checksummed at every call)
step rescoring 160 $py benchmarks/rescoring.py --device cuda --shape 1.5b \
  --methods bare scorer_fp32_new scorer_bf16_new score_end_to_end --out-dir "$out"
# 2. capture vs vLLM's generate, same engine, same SamplingParams (logprobs=0), 256 prompts x 512 tokens
#    on a random 1.5B-shape Llama written in the run; engine start 30-70 s, ~6 s a pass; ~130-200 s
step capture 230 $py benchmarks/capture.py --shape 1.5b --device cuda --prompts 256 --prompt-length 64 \
  --max-tokens 512 --repeats 3 --gpu-memory-utilization 0.8 --profile --out-dir "$out"
# 3. the run recorder's share of a 1.08 s step (the host's CPU; random weights to digest: no model to train)
step recorder 90 $py benchmarks/recorder.py --steps 15 --step-seconds 1.08 --weights random --weights-mb 64 \
  --repeats 3 --out "$out/recorder_${card}_host.json"
ls -la "$out"
