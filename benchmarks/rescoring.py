"""Benchmark: trainer rescoring against a bare forward, in one run (issue 16).

Measures throughput (tokens per second over the whole set) and peak extra memory of:

* ``bare``: ``model(ids).logits`` (the body and the LM head in the model's dtype: bf16 logits on
  CUDA), the baseline every ratio is taken against;
* ``naive_fp32``: the same forward, then ``logits.float().log_softmax(-1)``, the sampled token's
  logprob and ``topk``;
* ``scorer_fp32_new`` / ``scorer_fp32_ref``: what :class:`rlparity.score.Scorer` does per batch
  (``response_hidden``: one body forward with the attention mask, the response rows; then the LM
  head statistics with a float32 head, one host copy) with :func:`rlparity.score.lm_head_stats.head_stats`
  (new) or :func:`~rlparity.score.lm_head_stats.head_stats_reference` (the implementation before issue 16);
* ``scorer_bf16_new`` / ``scorer_bf16_ref``: the same with a bf16 head;
* ``score_end_to_end`` (issue 39): what a user calls, ``Scorer(model, ...).score(trace)`` on a trace of the
  same sequences (the model passed in, as a trainer passes its own; fp32 head; validation, batching,
  the trainer's self-check of ``TrainerSettings.self_check`` sequences, weight checksums, assembling the
  scored trace): ``score_end_to_end_first`` is the first call of a fresh Scorer, timed before anything
  else ran in the process (compilation, allocator, kernels' first use included); the steady rows are
  later calls of one Scorer with the self-check on (the default), without its kernel pass
  (``kernel_check="off"``: the self-check without its kernel pass) and off (``self_check=0``); a row with the
  self-check on also reports ``self_check_pass_s``, the median seconds of each of its passes (``alone``,
  ``grouped``, ``again``, ``kernel``) as the scored trace records them.
  Needs rlparity importable (xarray, numpy); skipped with a note when it is not.
* ``score_{padded,packed}_{fp32,bf16}_head`` (issue 39): the same call with ``self_check=0`` and
  ``fingerprint=False`` (the scoring path alone: a model passed in is otherwise checksummed at every call),
  in the trainer layout ``TrainerSettings.layout`` (``padded``: one row per sequence; ``packed``: a micro-batch's
  sequences in one row with a block-diagonal causal mask) and with a float32 or bf16 LM head. Each row
  records its ``layout``, ``head_dtype``, ``self_check`` and ``fingerprint``.
* ``fingerprint`` (issue 39): the weight checksums alone, ``rlparity.score.fingerprint.checkpoint_checksums(model)``
  on the benchmark's model (what ``Scorer.score`` adds per call on a model passed in): seconds and GB/s of the
  bf16 values read (2 bytes a floating-point value of the state dict, tied tensors counted as often as they are
  checksummed); no tokens or FLOPs. Needs rlparity importable; skipped with a note when it is not.

Every row also reports its achieved FLOP/s (the useful matmul FLOPs: the body over every token, causal
attention within each sequence, the LM head over the rows that method projects: every token for ``bare``
and ``naive_fp32``, the response rows for the others; a packed row's kernels also multiply the masked
blocks between sequences, which are not counted) and, on an H100 or H200, that against the card's dense
bf16 peak (989 TFLOP/s).

The model is a Llama built from a config with random weights (no download). Every sequence has
``--prompt`` prompt tokens and the rest are response tokens; all have the same length, so the
bare forward wastes nothing on padding. Methods run round-robin, ``--repeats`` times each after a
warm-up (which compiles the new head's reduction), and report the median time. Peak extra memory
is the allocator's peak above what was allocated before the pass (CUDA), or the peak RSS of a
fresh process above its RSS after set-up and warm-up (CPU: one subprocess per method).

The new head's results are compared with the reference's on the first batch (max |diff| per
statistic, nats), for the float32 and the bf16 head.

    python benchmarks/rescoring.py                                   # CPU, small shapes
    python benchmarks/rescoring.py --vocab 151936                    # CPU, the real vocabulary
    python benchmarks/rescoring.py --device cuda --shape 1.5b --out rescoring_h200.json
    python benchmarks/rescoring.py --device cuda --shape 7b --sequences 64 --methods bare score_end_to_end

Needs torch, transformers and numpy; it imports ``rlparity.score.lm_head_stats`` directly from the
checkout when the rest of rlparity's dependencies are missing (e.g. on a bare GPU machine).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {
    # the CPU default: small body, a real-sized vocabulary is one flag away (--vocab 151936)
    "small": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 32000, "tie_word_embeddings": False,
              "sequences": 32, "length": 192, "prompt": 32, "batch": 8, "dtype": "bfloat16"},
    # Qwen2-1.5B's shape as a Llama (tied embeddings), random weights
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
             "sequences": 256, "length": 577, "prompt": 64, "batch": 16, "dtype": "bfloat16"},
    # Qwen2-7B's shape as a Llama (untied head), random weights: about 15 GiB in bf16
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
           "sequences": 128, "length": 577, "prompt": 64, "batch": 8, "dtype": "bfloat16"},
}
# Scorer(...).score(trace) rows -> (layout, head dtype, self_check (None: the default), fingerprint); the method
# "score_end_to_end" is its first call and the two default rows, the others are methods of their own
END_TO_END = {"score_end_to_end": ("padded", "float32", None, True),
              "score_end_to_end_no_self_check": ("padded", "float32", 0, True),
              "score_end_to_end_no_kernel_check": ("padded", "float32", None, True),
              **{f"score_{layout}_{short}_head": (layout, head, 0, False)
                 for layout in ("padded", "packed", "packed_flex") for short, head in (("fp32", "float32"),
                                                                                   ("bf16", "bfloat16"))}}
# rows whose self-check skips its kernel pass (TrainerSettings.kernel_check; the others: "auto")
KERNEL_CHECK = {"score_end_to_end_no_kernel_check": "off"}
# rows whose trainer runs another attention implementation than the model's own (sdpa): the packed row
# through FlexAttention, which reads the sequences from the position ids and skips the masked blocks
ATTENTION = {f"score_packed_flex_{short}_head": "flex_attention" for short in ("fp32", "bf16")}
METHODS = ("bare", "naive_fp32", "scorer_fp32_new", "scorer_fp32_new_cast", "scorer_fp32_ref", "scorer_bf16_new",
           "scorer_bf16_ref", "score_end_to_end", *list(END_TO_END)[3:], "fingerprint")
# dense bf16 peak FLOP/s by card (SXM; the H200 has the H100's tensor cores)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


def load_head():
    """``rlparity.score.lm_head_stats``, from the package or, without rlparity's other dependencies, from its folder."""
    sys.path.insert(0, str(ROOT))
    try:
        from rlparity.score import lm_head_stats as head
        return head
    except ImportError as err:
        print(f"# importing rlparity failed ({err}); loading rlparity/score/lm_head_stats/ on its own", file=sys.stderr)
        folder = ROOT / "rlparity/score/lm_head_stats"  # a package whose modules import each other relatively
        spec = importlib.util.spec_from_file_location("rlparity_score_head", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


def build(a):
    """The model and the token batches of the chosen shape (seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SHAPES[a.shape])
    for key in ("vocab", "sequences", "length", "prompt", "batch", "dtype"):
        v = getattr(a, key)
        if v is not None:
            shape["vocab_size" if key == "vocab" else key] = v
    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "num_attention_heads", "num_key_value_heads", "vocab_size",
                                                 "tie_word_embeddings")},
                      max_position_embeddings=max(2048, shape["length"]))
    dtype = getattr(torch, shape["dtype"])
    with torch.device(a.device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (shape["sequences"], shape["length"]), generator=g)
    if a.ragged is None:
        batches = [ids[s: s + shape["batch"]] for s in range(0, len(ids), shape["batch"])]
        return model, batches, shape
    shape["lengths"] = ragged_lengths(shape, a.ragged)
    lengths = shape["lengths"]  # a padding trainer's micro-batches: each padded to its own longest sequence
    batches = [ids[s: s + shape["batch"], :max(lengths[s: s + shape["batch"]])]
               for s in range(0, len(ids), shape["batch"])]
    return model, batches, shape


def ragged_lengths(shape: dict, low: float) -> list[int]:
    """Seeded sequence lengths (prompt included) for ``--ragged LOW``: the prompt plus a response length drawn
    uniformly from ``ceil(LOW * R) .. R`` (``R``: the shape's response tokens), in arrival order (not sorted)."""
    import math
    import random

    if not 0 < low <= 1:
        raise SystemExit(f"--ragged {low}: give the shortest response as a fraction of the longest, in (0, 1]")
    prompt, longest = shape["prompt"], shape["length"] - shape["prompt"]
    rng = random.Random(2)
    return [prompt + rng.randint(max(1, math.ceil(low * longest)), longest) for _ in range(shape["sequences"])]


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def make_methods(model, head, a, shape):
    """name -> function(batch of ids) that does that method's work on one batch."""
    import torch

    dev = a.device
    prompt, topk, temp = shape["prompt"], a.top_k, a.temperature
    decoder = model.get_decoder()
    lm = model.get_output_embeddings()

    def bare(ids):
        return model(input_ids=ids.to(dev)).logits

    def naive(ids):
        ids = ids.to(dev)
        logp = model(input_ids=ids).logits.float().log_softmax(dim=-1)
        tok = logp[:, prompt - 1:-1].gather(-1, ids[:, prompt:].unsqueeze(-1))
        top = logp.topk(topk, dim=-1)
        return tok.cpu(), top.values[:, 0, 0].cpu()

    def scorer(fn, head_dtype, gemm=None):
        def run(ids):
            ids = ids.to(dev)
            # Scorer.response_hidden: the body with the attention mask, then the response rows
            hidden = decoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            rows = hidden[:, prompt - 1:-1].reshape(-1, hidden.shape[-1])
            tok = ids[:, prompt:].reshape(-1)
            n = rows.shape[0]
            ref = fn is head.head_stats_reference
            kw = {} if ref else {"compile": a.compile}
            if gemm:
                kw["fp32_gemm"] = gemm
            return fn(rows, lm.weight, getattr(lm, "bias", None), tok,
                      torch.full((n,), temp, device=dev), torch.full((n,), topk, dtype=torch.long, device=dev),
                      torch.full((n,), a.top_p, device=dev), head_dtype,
                      (a.chunk_tokens or 512) if ref else a.chunk_tokens, **kw)
        return run

    return {"bare": bare, "naive_fp32": naive,
            "scorer_fp32_new": scorer(head.head_stats, "float32"),
            "scorer_fp32_new_cast": scorer(head.head_stats, "float32", "cast"),
            "scorer_fp32_ref": scorer(head.head_stats_reference, "float32"),
            "scorer_fp32_ref_auto": scorer(head.head_stats_reference, "float32", "auto"),
            "scorer_bf16_new": scorer(head.head_stats, "bfloat16"),
            "scorer_bf16_ref": scorer(head.head_stats_reference, "bfloat16")}


def flops(cfg, shape, tokens: int, head_rows: int) -> float:
    """Matmul FLOPs of one pass: the body's projections over every token, causal attention (QK^T and AV over
    the earlier positions), the LM head over ``head_rows`` rows (2 FLOPs a multiply-add)."""
    h, n_layers, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_token = 2 * n_layers * (2 * h * h + 2 * h * kv + 3 * h * inter)
    if "lengths" in shape:  # --ragged: causal attention within each sequence of its own length
        attention = sum(2 * n_layers * h * n * (n + 1) for n in shape["lengths"])
    else:
        length = shape["length"]
        attention = 2 * n_layers * h * length * (length + 1) * (tokens // length)  # 4 h per (query, key) pair
    return float(per_token * tokens + attention + 2 * h * cfg.vocab_size * head_rows)


def card_peak(device: str) -> tuple[str, float | None]:
    """(card name, its dense bf16 peak FLOP/s or None when unknown)."""
    if device != "cuda":
        return platform.processor() or platform.machine(), None
    import torch

    name = torch.cuda.get_device_name()
    return name, next((v for k, v in PEAK_BF16.items() if k in name), None)


def end_to_end(model, a, shape, ids, rows):
    """``Scorer(model).score(trace)`` on a trace of ``ids``: a function per row of ``rows`` (names of
    :data:`END_TO_END`, each call a whole pass), and, when ``score_end_to_end`` is among them, the first call of
    a fresh Scorer timed now (else None); None when rlparity's own dependencies are missing."""
    try:
        from rlparity.config.settings import TrainerSettings
        from rlparity.score import Scorer
        from rlparity.trace import from_rollouts
    except ImportError as err:
        print(f"# score_end_to_end skipped: importing rlparity failed ({err})", file=sys.stderr)
        return None, None, str(err)
    import numpy as np

    prompt, n = shape["prompt"], len(ids)
    arr = [r[:m] for r, m in zip(ids.numpy(), shape.get("lengths", [shape["length"]] * len(ids)))]
    trace = from_rollouts(prompt_token_ids=[r[:prompt].tolist() for r in arr], token_ids=[r[prompt:].tolist() for r in arr],
                          rollout_logprobs=[np.full(len(r) - prompt, -1.0) for r in arr],
                          temperature=[a.temperature] * n, top_k=[a.top_k] * n, top_p=[a.top_p] * n)

    def scorer(row: str):
        layout, head_dtype, self_check, fingerprint = END_TO_END[row]
        settings = TrainerSettings(layout=layout.removesuffix("_flex"), fingerprint=fingerprint,
                                   attn_implementation=ATTENTION.get(row), kernel_check=KERNEL_CHECK.get(row, "auto"),
                                   **({} if self_check is None else {"self_check": self_check}))
        return Scorer(model, device=a.device, batch_size=shape["batch"], chunk_tokens=a.chunk_tokens,
                      compile_head=a.compile, progress=False, tokenize_prompts=False, head_dtype=head_dtype,
                      settings=settings)

    first = None
    if "score_end_to_end" in rows:
        t0 = time.perf_counter()
        scored = scorer("score_end_to_end").score(trace)
        sync(a.device)
        first = time.perf_counter() - t0
        assert int(np.isfinite(scored["trainer_logprob"].values).sum()) == sum(len(r) - prompt for r in arr)
    own = model.config._attn_implementation
    steady = {row: scorer(row) for row in rows}
    model.set_attn_implementation(own)  # a Scorer sets its attention on the model passed in

    def call(row: str, s):
        impl = ATTENTION.get(row, own)
        if model.config._attn_implementation != impl:  # one model, rows run round-robin
            model.set_attn_implementation(impl)
        scored = s.score(trace)
        check = scored.attrs["trainer"].get("self_check") or {}
        if check.get("pass_s"):  # what each self-check pass cost this call (the warm-up's first)
            SELF_CHECK_PASSES.setdefault(row, []).append(check["pass_s"])
        return scored

    return ({name: (lambda name=name, s=s: call(name, s)) for name, s in steady.items()}, first, None)


# row -> the self-check's seconds per pass (alone, grouped, again, kernel) of every call, the warm-up's first
SELF_CHECK_PASSES: dict[str, list[dict[str, float]]] = {}


def self_check_split(row: str) -> dict[str, float] | None:
    """The median seconds of each self-check pass over a row's timed calls (the warm-up left out), or None."""
    calls = SELF_CHECK_PASSES.get(row, [])[1:]
    if not calls:
        return None
    return {k: statistics.median(c[k] for c in calls if k in c) for k in calls[0]}


def fingerprint(model):
    """(a function computing ``checkpoint_checksums(model)``, the bytes of bf16 values it reads, the tensors);
    (None, None, why) when rlparity's own dependencies are missing."""
    try:
        from rlparity.score.fingerprint import checkpoint_checksums
    except ImportError as err:
        print(f"# fingerprint skipped: importing rlparity failed ({err})", file=sys.stderr)
        return None, None, str(err)
    floating = [t for t in model.state_dict().values() if t.is_floating_point()]
    return (lambda _batch: checkpoint_checksums(model)), 2 * sum(t.numel() for t in floating), len(floating)


def over_budget(a, t_start: float, next_s: float) -> bool:
    """Whether a step of ``next_s`` seconds would end past ``--budget-s`` (never with no budget)."""
    return a.budget_s is not None and time.perf_counter() - t_start + next_s > a.budget_s


def row_setup(name: str, body_dtype: str) -> dict:
    """A row's trainer layout and LM-head dtype (and, for ``Scorer.score`` rows, its self-check and fingerprint)."""
    if name in END_TO_END or name == "score_end_to_end_first":
        from rlparity.config.settings import TrainerSettings  # present: the row ran

        layout, head, check, fingerprint = END_TO_END["score_end_to_end" if name.endswith("_first") else name]
        return {"layout": layout.removesuffix("_flex"), "head_dtype": head, "attention": ATTENTION.get(name, "sdpa"),
                "self_check": TrainerSettings().self_check if check is None else check,
                "kernel_check": KERNEL_CHECK.get(name, "auto") if (check is None or check > 0) else "off",
                "fingerprint": fingerprint}
    head = {"bare": body_dtype, "naive_fp32": "float32"}.get(name, "bfloat16" if "bf16" in name else "float32")
    return {"layout": "padded", "head_dtype": head}


def _rows(batches):
    """Every sequence's row of ``batches`` (each a 2-D tensor, perhaps of another width)."""
    for b in batches:
        yield from b


def one_pass(fn, batches, device):
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            out = fn(b)
            del out
    sync(device)
    return time.perf_counter() - t0


def peak_cuda(fn, batches):
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    one_pass(fn, batches, "cuda")
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def peak_cpu_subprocess(a, method):
    """Peak extra RSS (MiB) of one pass of ``method`` in a fresh process."""
    cmd = [sys.executable, __file__, "--memory-of", method, "--shape", a.shape, "--device", "cpu",
           *(["--chunk-tokens", str(a.chunk_tokens)] if a.chunk_tokens else []), "--top-k", str(a.top_k), "--top-p", str(a.top_p),
           "--temperature", str(a.temperature)]
    for key in ("vocab", "sequences", "length", "prompt", "batch", "dtype", "ragged"):
        if getattr(a, key) is not None:
            cmd += [f"--{key}", str(getattr(a, key))]
    if a.compile is not None:
        cmd += ["--compile" if a.compile else "--no-compile"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"memory subprocess for {method} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])["extra_rss_mib"]


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_of(a):
    model, batches, shape = build(a)
    head = load_head()
    fn = make_methods(model, head, a, shape)[a.memory_of]
    one_pass(fn, [batches[0][:1]], "cpu")  # warm-up (compile) on one sequence
    gc.collect()
    try:  # reset the peak RSS to the current RSS (Linux >= 4.0), so warm-up and set-up don't count
        Path("/proc/self/clear_refs").write_text("5")
        base = _rss_mib("VmRSS")
    except OSError:
        base = _rss_mib("VmHWM")
    one_pass(fn, batches, "cpu")
    print(json.dumps({"extra_rss_mib": _rss_mib("VmHWM") - base}))


def _diffs(new, ref):
    import numpy as np

    out = {}
    for k in ref:
        x, y = np.asarray(new[k], dtype=float), np.asarray(ref[k], dtype=float)
        inf = ~np.isfinite(y)
        same_inf = bool((np.isfinite(x) == ~inf).all() and (x[inf] == y[inf]).all())
        fin = ~inf & np.isfinite(x)
        out[k] = {"max_abs_diff": float(np.abs(x[fin] - y[fin]).max()) if fin.any() else 0.0,
                  "same_infinities": same_inf}
    return out


def float64_check(model, head, a, shape, batch, new, ref):
    """max |x - float64| of the raw logprob and the entropy, for the new head and the reference
    on the same float32 logits (the logits recomputed, then log-softmax in float64)."""
    import numpy as np
    import torch

    dev, prompt = a.device, shape["prompt"]
    lm = model.get_output_embeddings()
    lps, ents = [], []
    with torch.inference_mode():
        ids = batch.to(dev)
        hidden = model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        rows = hidden[:, prompt - 1:-1].reshape(-1, hidden.shape[-1])
        tok = ids[:, prompt:].reshape(-1)
        for s in range(0, rows.shape[0], 256):
            logp = head.project(rows[s:s + 256], lm.weight, getattr(lm, "bias", None), "float32").double()
            logp = logp.log_softmax(dim=1)
            lps.append(logp.gather(1, tok[s:s + 256].unsqueeze(1)).squeeze(1).cpu().numpy())
            ents.append((-(logp.exp() * logp).sum(dim=1)).cpu().numpy())
    lp, ent = np.concatenate(lps), np.concatenate(ents)
    return {who: {"trainer_logprob": float(np.abs(r["trainer_logprob"] - lp).max()),
                  "trainer_entropy": float(np.abs(r["trainer_entropy"] - ent).max())}
            for who, r in (("new", new), ("reference", ref))}


def equality(model, head, a, shape, batch):
    """max |new - reference| per statistic on one batch (nats; ranks: count): the bf16 head; the
    fp32 head on the same logits (statistics only), and against the reference's own GEMM; and
    both against float64 on the same logits."""
    import torch

    m = make_methods(model, head, a, shape)
    with torch.inference_mode():
        runs = {name: m[name](batch) for name in ("scorer_fp32_new", "scorer_fp32_new_cast", "scorer_fp32_ref",
                                                  "scorer_fp32_ref_auto", "scorer_bf16_new", "scorer_bf16_ref")}
    return {"float32 head, same logits (statistics only)": _diffs(runs["scorer_fp32_new"], runs["scorer_fp32_ref_auto"]),
            "float32 head, both cast GEMM": _diffs(runs["scorer_fp32_new_cast"], runs["scorer_fp32_ref"]),
            "float32 head, new GEMM vs reference GEMM": _diffs(runs["scorer_fp32_new"], runs["scorer_fp32_ref"]),
            "bfloat16 head": _diffs(runs["scorer_bf16_new"], runs["scorer_bf16_ref"]),
            "float32 head vs float64, same logits": float64_check(model, head, a, shape, batch,
                                                                   runs["scorer_fp32_new"],
                                                                   runs["scorer_fp32_ref_auto"])}


def versions(device):
    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "machine": platform.machine(),
            "cpu_threads": torch.get_num_threads()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="default: small on CPU, 1.5b on CUDA")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--sequences", type=int)
    ap.add_argument("--length", type=int, help="tokens per sequence, prompt included")
    ap.add_argument("--prompt", type=int, help="prompt tokens per sequence")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="the body's dtype (default: bfloat16)")
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--chunk-tokens", type=int, default=None,
                    help="rows per LM-head chunk (default: head_stats' own, 2048 on CUDA and 512 on CPU; "
                         "the reference's 512)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the new head's reduction (default: head_stats' own choice)")
    ap.add_argument("--ragged", type=float, default=None, metavar="LOW",
                    help="sequences of varied lengths: responses drawn uniformly between LOW x and 1 x the shape's "
                         "response length (seeded); the per-batch methods pad each micro-batch to its longest, as a "
                         "padding trainer does; tokens/s and FLOP/s count the useful tokens only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop repeating (at least one repeat) and skip the memory passes once another repeat would "
                         "end past this many seconds from the start, so a caller's time limit still gets the JSON")
    ap.add_argument("--no-equality", action="store_true", help="skip the equality check")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--out-dir", help="write the results as JSON into this folder, named after the card and the "
                    "shape: rescoring_<card>_<shape>.json (card: h100, h200, ..., cpu; shape 1.5b as 1p5b)")
    ap.add_argument("--memory-of", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.shape = a.shape or ("1.5b" if a.device == "cuda" else "small")
    if a.memory_of:
        memory_of(a)
        return
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device; run on a GPU machine or use --device cpu")
    t_start = time.perf_counter()
    model, batches, shape = build(a)
    head = load_head()
    methods = make_methods(model, head, a, shape)
    names = [m for m in METHODS if m in a.methods]
    if "bare" not in names:
        names.insert(0, "bare")
    tokens = sum(shape["lengths"]) if "lengths" in shape else sum(b.numel() for b in batches)  # useful tokens
    computed = sum(b.numel() for b in batches)  # what a padding trainer's forward computes
    print(f"# {a.shape}: {shape['sequences']} sequences x {shape['length']} tokens (prompt {shape['prompt']}), "
          f"batch {shape['batch']}, vocab {shape['vocab_size']}, body {shape['dtype']}, device {a.device}",
          file=sys.stderr)
    e2e, first_s, e2e_skipped = None, None, None
    e2e_rows = [n for n in names if n in END_TO_END]
    if "score_end_to_end" in e2e_rows:  # the default rows with it
        at = e2e_rows.index("score_end_to_end") + 1
        e2e_rows[at:at] = ["score_end_to_end_no_self_check", "score_end_to_end_no_kernel_check"]
    if e2e_rows:  # first: the first call of a fresh Scorer, before anything else ran
        import torch

        names = [n for n in names if n not in END_TO_END]
        e2e, first_s, e2e_skipped = end_to_end(model, a, shape, torch.cat(batches) if "lengths" not in shape
                                               else torch.nn.utils.rnn.pad_sequence(list(_rows(batches)), True),
                                               e2e_rows)
        if e2e:
            methods.update({k: (lambda _batch, f=f: f()) for k, f in e2e.items()})
            names += list(e2e)
    fp_bytes = fp_tensors = fp_skipped = None
    if "fingerprint" in names:
        fp, fp_bytes, fp_tensors = fingerprint(model)
        if fp is None:
            names.remove("fingerprint")
            fp_skipped = fp_tensors
        else:
            methods["fingerprint"] = fp
    one_call = {*END_TO_END, "fingerprint"}  # a whole pass is one call, not one per batch
    eq = {} if a.no_equality else equality(model, head, a, shape, batches[0])
    for name in names:  # warm-up: compile, allocator, kernels' autotuning
        one_pass(methods[name], batches[:1], a.device)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.repeats):
        t_repeat = time.perf_counter()
        for name in names:  # an end-to-end row is one call over the whole trace
            times[name].append(one_pass(methods[name], batches[:1] if name in one_call else batches, a.device))
        print(f"# repeat {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}s" for n in names), file=sys.stderr)
        if over_budget(a, t_start, time.perf_counter() - t_repeat):
            print(f"# --budget-s {a.budget_s}: stopping after {r + 1} repeats", file=sys.stderr)
            break
    mem: dict[str, float] = {}
    if not a.no_memory and not over_budget(a, t_start, 0.0):
        for name in names:
            if name in one_call:
                continue
            mem[name] = peak_cuda(methods[name], batches[:2]) if a.device == "cuda" else peak_cpu_subprocess(a, name)
    cfg, card, peak = model.config, *card_peak(a.device)
    responses = tokens - len(shape["lengths"]) * shape["prompt"] if "lengths" in shape else \
        sum(b.shape[0] for b in batches) * (shape["length"] - shape["prompt"])
    base_t = statistics.median(times["bare"])
    rows = []
    if first_s is not None:
        times["score_end_to_end_first"] = [first_s]
    for name in [n for n in names if n not in END_TO_END] + [n for n in ("score_end_to_end_first", *END_TO_END)
                                                                if n in times]:
        t = statistics.median(times[name])
        if name == "fingerprint":  # no tokens or FLOPs: the bytes of bf16 weights it reads
            rows.append({"method": name, "median_s": t, "times_s": times[name], "tensors": fp_tensors,
                         "bf16_bytes": fp_bytes, "gb_per_s": fp_bytes / t / 1e9, "throughput_vs_bare": base_t / t})
            continue
        work = flops(cfg, shape, tokens, tokens if name in ("bare", "naive_fp32") else responses)
        row = {"method": name, **row_setup(name, shape["dtype"]), "median_s": t, "times_s": times[name],
               "tokens_per_s": tokens / t,
               "throughput_vs_bare": base_t / t, "flops": work, "flops_per_s": work / t,
               "peak_share": work / t / peak if peak else None}
        if "naive_fp32" in times:
            row["throughput_vs_naive"] = statistics.median(times["naive_fp32"]) / t
        split = self_check_split(name)
        if split:
            row["self_check_pass_s"] = split
        if mem and name in mem:
            row["peak_extra_mib"] = mem[name]
            row["peak_vs_bare"] = mem[name] / mem["bare"] if mem["bare"] > 0 else float("nan")
        rows.append(row)
    result = {"date": time.strftime("%Y-%m-%d"), "device": a.device, "shape": a.shape,
              "config": {**shape, "top_k": a.top_k, "top_p": a.top_p, "temperature": a.temperature,
                         "chunk_tokens": a.chunk_tokens, "compile": a.compile, "repeats": a.repeats,
                         "repeats_done": len(times["bare"]), "budget_s": a.budget_s, "ragged": a.ragged},
              "tokens": tokens, "padded_tokens": computed, "padding_share": 1 - tokens / computed, "versions": versions(a.device), "card": card, "peak_bf16_flops": peak,
              "score_end_to_end": {"rows": [r["method"] for r in rows if r["method"].startswith("score_")],
                                   "skipped": e2e_skipped, "model": "passed in (loaded)",
                                   "first_call": "fresh Scorer, first thing in the process"},
              "fingerprint_skipped": fp_skipped,
              "rows": rows, "equality": eq,
              "wall_s": time.perf_counter() - t_start}
    print(f"\n{a.shape} on {result['versions'].get('gpu', a.device)}, {tokens} tokens, "
          f"median of {a.repeats}\n")
    print("| method | s / pass | tokens/s | throughput vs bare | vs naive | TFLOP/s | of peak | peak extra MiB | peak vs bare |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["method"] == "fingerprint":
            continue
        share = f"{100 * r['peak_share']:.0f}%" if r["peak_share"] is not None else "-"
        print(f"| {r['method']} | {r['median_s']:.3f} | {r['tokens_per_s']:.0f} | {r['throughput_vs_bare']:.2f} | "
              f"{r.get('throughput_vs_naive', float('nan')):.2f} | {r['flops_per_s'] / 1e12:.3g} | {share} | "
              f"{r.get('peak_extra_mib', float('nan')):.0f} | {r.get('peak_vs_bare', float('nan')):.2f} |")
    for r in rows:
        if r["method"] == "fingerprint":
            print(f"\nfingerprint (checkpoint_checksums, {r['tensors']} tensors, {r['bf16_bytes'] / 1e9:.3g} GB of bf16): "
                  f"{r['median_s']:.3f} s, {r['gb_per_s']:.2f} GB/s, {1 / r['throughput_vs_bare']:.2f}x the bare forward")
        elif r.get("self_check_pass_s"):
            print(f"\n{r['method']}: the self-check's passes (median s) "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["self_check_pass_s"].items())
                  + f" of {r['median_s']:.3f} s a call")
    for what, d in eq.items():
        if what.endswith("float64, same logits"):
            print("\nmax |x - float64| on the same logits, first batch: "
                  + ", ".join(f"{who} {k.removeprefix('trainer_')} {v:.1e}" for who, r in d.items() for k, v in r.items()))
            continue
        stat, worst = max(((k, v["max_abs_diff"]) for k, v in d.items() if k != "trainer_token_rank"),
                          key=lambda kv: kv[1])
        print(f"\nnew vs reference, {what}, first batch: max |diff| {worst:.2e} nats ({stat}), "
              f"ranks {d['trainer_token_rank']['max_abs_diff']:.0f}, "
              f"same -inf: {all(v['same_infinities'] for v in d.values())}")
    print(f"wall {result['wall_s']:.0f} s")
    write(result, a.out, a.out_dir and Path(a.out_dir) / f"rescoring_{card_tag(card, a.device)}_"
                                                         f"{a.shape.replace('.', 'p')}.json")


def write(result: dict, *paths) -> None:
    """``result`` as JSON at every path given (None skipped), folders made."""
    for path in filter(None, paths):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


def card_tag(card: str, device: str) -> str:
    """A file-name tag of the card: ``h100``, ``h200``, ... (the first word with digits of the name), ``cpu``."""
    if device != "cuda":
        return "cpu"
    words = [w.lower() for w in card.replace("-", " ").split() if any(c.isdigit() for c in w)]
    return words[0] if words else "gpu"


if __name__ == "__main__":
    main()
