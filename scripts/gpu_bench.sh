#!/usr/bin/env bash
# Issue 39's benchmarks on the GPU host in one call of at most 600 s (about 430 s expected): rescoring at the
# 1.5B shape (bare forward, Scorer's per-batch path, Scorer(...).score end to end, padded and packed layouts,
# fp32 and bf16 heads), capture against vLLM's generate on a random 1.5B-shape Llama built in the run, the run
# recorder, then rescoring at the 7B shape with what time is left. Each step runs in its own process under
# its own time limit, cut to what is left of the call's budget (GPU_BENCH_BUDGET_S, default 570 s); the
# rescoring and capture steps also get a --budget-s a little under their limit, so they stop repeating and
# still write their JSON. A step that fails or runs past its limit is recorded in $OUT/gpu_bench.txt and
# the next still runs; a step with less than its minimum left is skipped (recorded too).
#
#   usage (from the project root, after the bundle's part1, part2 and part3; ../shared/gpu/README.md):
#     bash scripts/gpu_bench.sh "$OUT"
#
# Writes into OUT seven files (a GPU call brings back at most 8): rescoring_<card>_1p5b.json, capture_<card>.json,
# capture_outputs_<card>.json (the last generate's outputs, about 7 MB: benchmarks/capture_client.py --outputs
# replays them on any CPU), recorder_<card>_host.json, rescoring_<card>_7b.json, gpu_bench.txt (one line per
# step: exit code and seconds; 124 = ran past its limit) and gpu_bench.log (every step's output, one after the
# other).
set -u
out=${1:-${OUT:-}}
if [[ -z "$out" ]]; then
  echo "usage: bash scripts/gpu_bench.sh OUT_DIR (or set OUT)" >&2
  exit 2
fi
site=${GPU_BENCH_SITE:-/tmp/site}  # where the bundle installed vLLM
dry=${GPU_BENCH_DRY:-0}  # 1: a check of this script's logic on a CPU machine (same steps and methods, tiny sizes)
if [[ ! -f $site/.rlparity-gpu-ok ]]; then
  echo "vLLM is not installed on this host ($site/.rlparity-gpu-ok missing: the host was given back);" \
       "install the bundle's part1, part2 and part3 again (../shared/gpu/README.md)" >&2
  exit 9
fi
if [[ ! -f $site/.rlparity-gpu-part3 ]]; then
  echo "warning: the bundle's part3 is not installed (zarr, numcodecs, plotly): the recorder step will fail" >&2
fi
mkdir -p "$out"
export PYTHONPATH=$site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
py=${PYTHON:-python3}
if [[ $dry == 1 ]]; then  # a shared CPU machine: rlparity's engine lock stays on
  card=cpu
  r15=(--device cpu --shape small --vocab 1024 --sequences 4 --length 48 --prompt 16 --batch 2)
  r7=("${r15[@]}")
  cap=(--shape tiny --device cpu --prompts 4 --prompt-length 8 --max-tokens 8)
  rec=(--steps 2 --sequences 8 --length 16 --step-seconds 0.05 --weights-mb 1 --tensors 8)
else
  export RLPARITY_ENGINE_LOCK=off  # the GPU host is this call's alone
  card=$($py -c "import torch; print(torch.cuda.get_device_name().replace('NVIDIA ', '').split()[0].lower())" \
    2>/dev/null || echo gpu)
  r15=(--device cuda --shape 1.5b)
  r7=(--device cuda --shape 7b --sequences 64)
  cap=(--shape 1.5b --device cuda --prompts 256 --prompt-length 64 --max-tokens 512 --gpu-memory-utilization 0.8)
  rec=(--steps 15 --step-seconds 1.08 --weights-mb 64)
fi
echo "card: $card; $(date -u +%FT%TZ)" | tee "$out/gpu_bench.txt"

budget=${GPU_BENCH_BUDGET_S:-570}

step() {  # step NAME LIMIT_S MIN_S COMMAND... ("{budget}" in COMMAND: the limit less 25 s)
  local name=$1 limit=$2 min=$3 t0=$SECONDS rc left
  shift 3
  left=$((budget - SECONDS))
  (( limit > left )) && limit=$left
  if (( limit < min )); then
    echo "$name: skipped, $left s left of the $budget s budget (needs $min s)" | tee -a "$out/gpu_bench.txt"
    return
  fi
  timeout -k 10 "$limit" "${@//\{budget\}/$((limit - 25))}" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/gpu_bench.txt"
  grep -v "^(EngineCore\|^(Worker\|^(VllmWorker\| INFO \|^INFO" "$out/$name.log" | tail -n 30
  { echo "===== $name: exit $rc"; cat "$out/$name.log"; } >> "$out/gpu_bench.log" && rm -f "$out/$name.log"
}

# 1. rescoring, 1.5B shape (256 x 577 tokens, batch 16): bare forward, Scorer's per-batch path (fp32 and bf16
#    heads), Scorer(...).score(trace) end to end (first call, steady with / without the self-check), and the
#    scoring path alone (no self-check, no checksums) padded and packed, fp32 and bf16 heads, and the weight
#    checksums alone (fingerprint; zlib's CRC where the bundle lacks isal: the same values); ~100-140 s
step rescoring 160 60 $py benchmarks/rescoring.py "${r15[@]}" --budget-s {budget} \
  --methods bare scorer_fp32_new scorer_bf16_new score_end_to_end score_padded_fp32_head score_padded_bf16_head \
  score_packed_fp32_head score_packed_bf16_head fingerprint --out-dir "$out"
# 2. capture vs vLLM's generate, same engine, same SamplingParams (logprobs=0, flat), and vLLM's default
#    list logprobs, 256 prompts x 512 tokens on a random 1.5B-shape Llama written in the run; engine start
#    30-70 s, ~6 s a pass; ~150-200 s
step capture 220 90 $py benchmarks/capture.py "${cap[@]}" --repeats 3 --profile --budget-s {budget} --out-dir "$out" \
  --save-outputs "$out/capture_outputs_$card.json"
# 3. the run recorder's share of a 1.08 s step (the host's CPU; random weights to digest: no model to train);
#    3 loops of 15 steps, ~55 s
step recorder 80 70 $py benchmarks/recorder.py "${rec[@]}" --weights random --repeats 3 \
  --out "$out/recorder_${card}_host.json"
# 4. rescoring, 7B shape (64 x 577 tokens, batch 8; ~15 GiB of random bf16 weights built on the card): bare
#    forward, Scorer's fp32 head, Scorer(...).score end to end, padded and packed; ~90-130 s, with what is left
step rescoring_7b 150 80 $py benchmarks/rescoring.py "${r7[@]}" --repeats 2 \
  --budget-s {budget} --no-equality --methods bare scorer_fp32_new score_end_to_end score_padded_fp32_head \
  score_packed_fp32_head --out-dir "$out"
ls -la "$out"
