"""The catalogue of finding codes: every ``Finding.name`` a diagnosis can emit, in one registry.

Each :class:`FindingCode` says which layer emits it, at which severities, what it means, the rule
that decides it with the thresholds it reads (a field of :func:`rlparity.config.defaults`, or a
module constant) and what those thresholds were calibrated on, and the fix in the user's terms.
The fixes are the checks' own constants where the check has one, so the catalogue and the
findings say the same thing.

``catalogue()`` is the registry; :func:`thresholds` reads each threshold's value and description
from the code at the moment it is called; :func:`catalogue_markdown` is the book's page
``book/reference/findings.md`` (written by the book build, one anchor per code, see
:func:`rlparity.diagnose.findings.catalogue_anchor`); ``rlparity findings [CODE]`` prints it in a
terminal. ``tests/test_catalogue.py`` holds the registry to the source: the codes listed here are
exactly the names the package's ``Finding(...)`` calls can take.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlparity.config.defaults import defaults
from rlparity.diagnose import head_precision, inflight, layers, objective, routing, semantic, sync, trainer
from rlparity.diagnose.findings import Layer, Severity, catalogue_anchor

I, W, E = Severity.INFO, Severity.WARNING, Severity.ERROR
SEM, PATH, OBJ = Layer.SEMANTIC, Layer.INFERENCE_PATH, Layer.OBJECTIVE

# what a threshold was calibrated on, in the words of the defaults' descriptions (rlparity.config.defaults)
CPU_TINY = "CPU float32, the tiny model"
H200_BF16 = "H200 bf16 (vLLM 0.26), the small model"
LITERATURE = "conventions from the literature and the peers' docs (verl, GSPO), not calibrated on rlparity captures"
NOT_RECORDED = "not recorded in the code"
NO_THRESHOLD = "no threshold: the check is exact"
FIX_NONE = "nothing to fix: information"
FIX_SETTING = ("keep the reference profile's value; the finding names it as LLM(...) keyword arguments and "
               "`vllm serve` flags (rlparity.diagnose.path.setting_fix)")
LOCALIZED = ("mean |r| of the tokens the cause explains against the background of tokens no cause explains "
             "(r: the residual once the semantic cause is corrected): measured when at least `stale_ratio` times "
             "the background, or above it by `tol_trainer` nats and 4 standard errors; small when the excess is "
             "below `tol_trainer` with 97.5% confidence (ArmEvidence.localized_test)")


@dataclass(frozen=True)
class FindingCode:
    """One finding code: where it comes from, what it means, how it is decided and how to fix it.

    Parameters
    ----------
    code : str
        The finding's name (``Finding.name``).
    layer : Layer
        The layer that emits it.
    severities : tuple of Severity
        The severities the check itself gives it; the attribution may turn a warning or an error
        that another cause explains into information (``Finding.explained_by``).
    meaning : str
        What the finding means, in prose.
    fix : str
        The fix in the user's terms (the check's own constant where it has one).
    module : str
        The module that emits it (``"rlparity.diagnose.semantic"``).
    rule : str, default ""
        The rule that decides it.
    thresholds : tuple of str, default ()
        What the rule reads: a field of :func:`rlparity.config.defaults` (``"tol"``,
        ``"objective.ess_min"``) or a module constant (``"rlparity.diagnose.trainer:FLOOR_SHARE"``).
    calibrated_on : str, default NO_THRESHOLD
        What the thresholds were calibrated on (device, dtype, model), or why there is nothing to
        calibrate.
    causes : tuple of str, default ()
        The keys of :data:`rlparity.diagnose.causes.CAUSES` the finding can claim.
    across_arms : bool, default False
        True when it is emitted over the arms of a store rather than per arm.
    """

    code: str
    layer: Layer
    severities: tuple[Severity, ...]
    meaning: str
    fix: str
    module: str
    rule: str = ""
    thresholds: tuple[str, ...] = ()
    calibrated_on: str = NO_THRESHOLD
    causes: tuple[str, ...] = ()
    across_arms: bool = False

    @property
    def anchor(self) -> str:
        """The code's anchor on the book's catalogue page.

        Returns
        -------
        str
            The anchor (:func:`rlparity.diagnose.findings.catalogue_anchor`).
        """
        return catalogue_anchor(self.code)

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain data, with its thresholds' current values.

        Returns
        -------
        dict
            ``code``, ``layer``, ``severities``, ``meaning``, ``rule``, ``thresholds``
            (:func:`thresholds`), ``calibrated_on``, ``fix``, ``causes``, ``module``, ``across_arms``
            and ``anchor``.
        """
        return {"code": self.code, "layer": self.layer.value, "severities": [s.value for s in self.severities],
                "meaning": self.meaning, "rule": self.rule, "thresholds": thresholds(self),
                "calibrated_on": self.calibrated_on, "fix": self.fix, "causes": list(self.causes),
                "module": self.module, "across_arms": self.across_arms, "anchor": self.anchor}


def _c(code, layer, sev, meaning, fix, module, **kw) -> FindingCode:
    return FindingCode(code, layer, tuple(sev), meaning, fix, f"rlparity.diagnose.{module}", **kw)


_CODES: tuple[FindingCode, ...] = (
    # --- semantic layer --------------------------------------------------------------------------------------
    _c("raw_logprobs_used_as_processed", SEM, (W, E),
       "The rollout's logprobs are raw (log softmax of the logits, before temperature and top-k/top-p) while the "
       "trainer recomputes the processed distribution the sampler drew from. An error when the fit of mu on the "
       "line between the trainer's raw and processed readings reads raw; a warning when the running engine "
       "reports logprobs_mode=raw_logprobs but the numbers cannot confirm it.",
       semantic.FIX_PROCESSED, "semantic",
       rule="mu - raw = alpha (processed - raw) + noise, a robust fit on the tokens no other cause explains: "
            "alpha within `semantic_tol` of 0 (or 3 standard errors, if larger) reads raw",
       thresholds=("semantic_tol",),
       calibrated_on="dimensionless (a share of the gap between the two readings); checked on " + H200_BF16
                     + " (example h200-semantic): the processed arms at alpha 1.000, the raw arms at 0.000",
       causes=("raw_logprobs",)),
    _c("logprobs_processed", SEM, (I,),
       "The rollout's logprobs are the processed distribution the sampler drew from (the parity reading).",
       FIX_NONE, "semantic", rule="alpha within `semantic_tol` of 1; with one trainer reading, the mean offset of d "
                                  "within `offset_z` standard errors of a faithful rollout's",
       thresholds=("semantic_tol", "offset_z"), calibrated_on="dimensionless; checked on " + H200_BF16),
    _c("logprobs_raw", SEM, (I,),
       "With one trainer reading (an imported dump) that is raw: the rollout's logprobs agree with it on average.",
       FIX_NONE, "semantic", rule="mean(d) + var(d)/2 within `offset_z` standard errors of 0",
       thresholds=("offset_z",), calibrated_on="a statistical bound in standard errors (any device)"),
    _c("logprobs_not_processed", SEM, (E,),
       "With one trainer reading (processed): the rollout's logprobs sit below the trainer's on average by more "
       "than a faithful rollout's noise allows, the signature of vLLM's raw logprobs.",
       semantic.FIX_PROCESSED + "; confirm with `rlparity score --model MODEL` (adds the raw reading)", "semantic",
       rule="a faithful rollout has mean(d) + var(d)/2 = 0; an offset above 0 by more than `offset_z` standard errors",
       thresholds=("offset_z",), calibrated_on="a statistical bound in standard errors (any device)",
       causes=("raw_logprobs",)),
    _c("logprobs_match_neither", SEM, (W,),
       "The rollout's logprobs lie between or beyond the trainer's processed and raw readings (or, with one "
       "reading, are offset from it): another temperature, other sampling parameters or another distribution.",
       "compare the engine's sampling parameters with the trainer's (temperature, top-k, top-p, penalties, the "
       "model's generation_config)", "semantic",
       rule="alpha neither within `semantic_tol` of 0 nor of 1; with one reading, an offset beyond `offset_z` "
            "standard errors that is not the raw-mode signature", thresholds=("semantic_tol", "offset_z"),
       calibrated_on="dimensionless; checked on " + H200_BF16),
    _c("logprob_semantics_untestable", SEM, (I,),
       "Which reading the rollout reports cannot be told: sampling is the identity (temperature 1, no top-k/top-p), "
       "so raw and processed coincide, or the two readings are too close at this noise.",
       "capture at the temperature / top-k / top-p your RL run uses, or capture more tokens", "semantic",
       rule="the fit's alpha band is wider than the gap between the readings (ArmEvidence.reading == 'untestable')",
       thresholds=("semantic_tol",), calibrated_on="dimensionless"),
    _c("trainer_temperature_differs", SEM, (E,),
       "The trainer computed its processed reading at another temperature than the engine sampled at, on some "
       "sequences: it describes another distribution than the sampler's, whatever the logprobs mode.",
       semantic.FIX_TRAINER_SAMPLING, "semantic", rule="per sequence, temperatures not equal (rtol 1e-6)",
       causes=("trainer_temperature",)),
    _c("trainer_logprobs_untempered", SEM, (E,),
       "By its own numbers the trainer's processed reading is at temperature ~1 while the tokens were drawn at the "
       "requests' temperature: the trainer does not divide its logits by it. Read from the logprobs alone (no "
       "recorded setting); a recorded trainer temperature the numbers contradict is named in the summary.",
       semantic.FIX_TRAINER_SAMPLING, "temperature",
       rule="per request temperature T (|log T| >= `temperature_min_gap`), the slope beta of log(-log p) of the "
            "processed reading on the raw one over tokens with -log p_raw in `sharpness_band`: untempered when "
            "|log beta| + `temperature_z` se < |log T| / 2 while the rollout's is tempered (|log beta| - z se above it)",
       thresholds=("sharpness_band", "temperature_z", "temperature_min_gap"),
       calibrated_on="H200 bf16 small at T=0.7: a tempered side reads T 0.66-0.68, an untempered one 0.99-1.02; tiny "
                     "CPU model at T=0.5/0.7/1.3: tempered 0.43/0.61/1.48, untempered 0.99-1.00 (held out: cpu-semantic, "
                     "h200-semantic)", causes=("trainer_temperature",)),
    _c("rollout_logprobs_untempered", SEM, (E,),
       "By their own numbers the rollout's logprobs are at temperature ~1 while the sampler drew at the requests' "
       "temperature: vLLM's raw logprobs. Named when the semantic fit cannot say it (the trainer's two readings "
       "coincide, or both sides are untempered).", semantic.FIX_PROCESSED, "temperature",
       rule="as trainer_logprobs_untempered, for the rollout's logprobs, while the trainer's reading is tempered or "
            "untempered too (then both are named)", thresholds=("sharpness_band", "temperature_z", "temperature_min_gap"),
       calibrated_on="as trainer_logprobs_untempered", causes=("raw_logprobs",)),
    _c("effective_temperatures", SEM, (I,),
       "The temperature each side's logprobs are at, read from the numbers, where they agree with each other.",
       FIX_NONE, "temperature", rule="metrics.effective_temperature per request temperature"),
    _c("trainer_cut_differs", SEM, (E,),
       "The trainer cut another top-k / top-p set than the engine's sampler on some sequences: it renormalises "
       "over another set of tokens.", semantic.FIX_TRAINER_SAMPLING, "semantic",
       rule="per sequence, top-k differs (0 and -1 both mean off) or top-p differs by more than 1e-9",
       causes=("trainer_top_k",)),
    _c("sampling_penalty_not_in_trainer", SEM, (E,),
       "The engine sampled with a repetition, presence or frequency penalty; its processed logprobs include it, "
       "the trainer's do not. The evidence compares the residual of repeated tokens with new ones.",
       "sample without penalties in RL (repetition_penalty=1, presence/frequency 0), or apply the same penalty to "
       "the trainer's logits (vLLM's rules)", "semantic", rule="any sequence with a penalty other than neutral",
       causes=("sampling_penalty",)),
    _c("trainer_is_rollout_copy", SEM, (E,),
       "The trainer's only reading (an imported dump's) equals the rollout's logprobs bit for bit: the trainer "
       "side is a copy of mu (verl's bypass mode), and parity of a copy with itself proves nothing. When it fires, "
       "the other semantic checks are skipped.",
       "recompute pi_old with the trainer: `rlparity score STORE --model MODEL` (or dump the trainer's own "
       "old_log_probs, not the rollout's)", "semantic",
       rule="at least 99% of at least 8 tokens bitwise identical, with one trainer reading",
       calibrated_on="exact (bitwise equality)"),
    _c("rollout_not_renormalized", SEM, (E,),
       "The rollout's logprobs apply temperature but not the top-k/top-p renormalization: they are off by the log "
       "of the kept mass on every token.",
       "return the sampler's distribution: " + semantic.FIX_PROCESSED + "; in your own sampler, renormalise over "
                                                                          "the kept set", "semantic",
       rule="mu - log pi_processed = beta * log kept mass: beta within `semantic_tol` of 1 (or 3 standard errors) "
            "and clearly away from 0", thresholds=("semantic_tol",), calibrated_on="dimensionless"),
    _c("topk_topp_renormalization", SEM, (I,),
       "How much top-k/top-p cut on average (the mean log kept mass): what a trainer that skipped the "
       "renormalization would be off by, per token.", FIX_NONE, "semantic",
       rule="reported whenever a request uses top-k/top-p and the trainer recorded the kept mass"),
    _c("topk_boundary_flips", SEM, (I, W),
       "Sampled tokens the trainer's processed distribution excludes, sitting just outside its top-k/top-p set "
       "within rounding of the edge: the engine's precision put them inside. A handful is expected from a bf16 "
       "engine.",
       "mask them out of the loss (pi_old = 0 makes the ratio infinite) or compute the cut in float32 on both sides",
       "semantic", rule="a flip is within `boundary_flip_ulps` bfloat16 ulps of the largest logit (or 3 noise RMS) "
                        "of the edge; a warning when their share of tokens exceeds `boundary_flip_share`",
       thresholds=("boundary_flip_share", "boundary_flip_ulps"),
       calibrated_on="H200 bf16: the parity arm has about 1e-4 flips per token (the default's description)"),
    _c("zero_probability_tokens", SEM, (E,),
       "Sampled tokens clearly outside the trainer's top-k/top-p set (pi_old = 0: the ratio is infinite there): the "
       "two sides cut different sets (another top-k/top-p, ties at the k-th logit dropped).",
       "make the trainer apply the engine's exact top-k/top-p (vLLM keeps ties at the k-th logit) with the same "
       "sampling parameters, or mask these tokens out of the loss; do not average log 0 away", "semantic",
       rule="any sampled token with trainer probability 0 beyond the boundary-flip margin; its tokens have "
            "infinite |d|, so it takes a share of the excess only together with trainer_cut_differs (a trainer "
            "that cuts another set acts on every token); alone it is evidence about those tokens",
       thresholds=("boundary_flip_ulps",), calibrated_on="bfloat16 rounding (2^-7 relative)",
       causes=("trainer_top_k",)),
    _c("prompt_token_mismatch", SEM, (E,),
       "The engine's prompt ids differ from the trainer's own tokenization of the same prompt (a chat template, "
       "BOS or special-token setting): the trainer scores the response after another prompt.",
       "send the trainer's token ids to the engine (prompt_token_ids=...) or tokenize the same way on both sides: "
       "the same add_special_tokens, and chat through the chat template", "semantic",
       rule="any prompt whose ids differ", calibrated_on="exact (token ids)", causes=("prompt_token_mismatch",)),
    _c("prompt_tokens_match", SEM, (I,),
       "The engine's prompt ids equal the trainer's tokenization of every prompt.", FIX_NONE, "semantic",
       calibrated_on="exact (token ids)"),
    _c("prompt_tokens_unchecked", SEM, (I,),
       "Prompts were given as token ids only: nothing for the trainer to re-tokenize.",
       "store the prompt text (or chat messages) with the ids to check them", "semantic"),
    # --- inference path: engine settings and the ablation ----------------------------------------------------
    _c("enable_prefix_caching_differs", PATH, (I,),
       "The engine ran with prefix caching other than the reference profile: a cached prefix is reused from another "
       "request's computation (a risk for parity, not a measurement: the ablation measures what it moves).",
       FIX_SETTING, "path", rule="the engine's effective setting, read back from the running engine, against the "
                                 "profile (`profile`)", thresholds=("profile",), calibrated_on="exact (a setting)"),
    _c("async_scheduling_differs", PATH, (I,),
       "The engine ran with async scheduling other than the reference profile: it overlaps scheduling with the "
       "previous step's execution (a risk for parity, not a measurement).", FIX_SETTING, "path",
       rule="the effective setting against the profile (`profile`)", thresholds=("profile",),
       calibrated_on="exact (a setting)"),
    _c("generation_config_differs", PATH, (I, W),
       "The engine's generation_config differs from the reference profile; a warning when the model's "
       "generation_config.json really sets sampling defaults (requests that omit them sample from another "
       "distribution).", FIX_SETTING, "path", rule="the effective setting against the profile (`profile`)",
       thresholds=("profile",), calibrated_on="exact (a setting)"),
    _c("setting_not_applicable", PATH, (I,),
       "An ablation setting this platform could not run (e.g. a GPU-only knob on CPU), with the reason.",
       "run the ablation on a platform that supports it (e.g. the GPU) to measure this setting", "path",
       across_arms=True),
    _c("batch_composition_nondeterminism", PATH, (W,),
       "The ablation's reference engine is not batch-invariant: one prompt at temperature 0 gives several greedy "
       "outputs or a logprob spread depending on the batch it runs in.",
       "the settings of the same ablation that cut the spread to half the reference's or less, named with their "
       "spreads (on the H100: FLEX attention 0, eager 0.014, batch-invariant kernels 0.016 against 0.063 nats), "
       "and whether batch-invariant kernels removed it; with none, enable batch-invariant kernels "
       "(VLLM_BATCH_INVARIANT=1) where the platform supports them, or accept it and rescore every rollout with "
       "the trainer", "path",
       rule="more than one distinct greedy output, or a logprob spread above `tol_reference` nats",
       thresholds=("tol_reference",), calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    _c("setting_moves_trainer_gap", PATH, (I, W),
       "An ablation setting moves the mean |d| against the trainer: a warning when it widens the gap, "
       "information when it narrows it.", FIX_SETTING, "path",
       rule="|mean |d| of the arm - mean |d| of the reference arm| above `tol_trainer` nats",
       thresholds=("tol_trainer",), calibrated_on=NOT_RECORDED, across_arms=True),
    _c("setting_changes_numerics", PATH, (I,),
       "An ablation setting changes the rollout logprobs against the reference arm (or the sampled tokens) but not "
       "the gap to the trainer.", FIX_NONE, "path",
       rule="max |d_ref| above `tol_reference` nats or fewer than all sequences identical, trainer gap unmoved",
       thresholds=("tol_reference", "tol_trainer"), calibrated_on="exact (0: any bitwise difference)",
       across_arms=True),
    _c("batch_determinism_worse", PATH, (W,),
       "With this ablation setting one prompt's greedy output depends on its batch more than in the reference.",
       FIX_SETTING, "path", rule="(distinct greedy outputs, logprob spread) above the reference arm's",
       thresholds=("tol_reference",), calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    _c("batch_determinism_better", PATH, (I,),
       "With this ablation setting one prompt's greedy output depends on its batch less than in the reference.",
       "to make batch composition matter less, use the setting (the finding names it)", "path",
       rule="(distinct greedy outputs, logprob spread) below the reference arm's", thresholds=("tol_reference",),
       calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    _c("setting_no_effect", PATH, (I,),
       "An ablation setting leaves every rollout logprob bitwise equal to the reference arm's on this platform "
       "(with the share of prompt tokens served from the prefix cache).", FIX_NONE, "path",
       rule="no metric moves beyond `tol_reference` / `tol_trainer`", thresholds=("tol_reference", "tol_trainer"),
       calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    # --- inference path: LM head -----------------------------------------------------------------------------
    _c("head_precision_mismatch", PATH, (W,),
       "The rollout engine and the trainer project to logits in different precisions: they round every logit "
       "differently, so every token's probability disagrees (MiniMax-M1's mismatch).",
       head_precision.FIX_ROLLOUT_FP32 + " (a low-precision rollout head); or " + head_precision.FIX_TRAINER_FP32
       + " (a low-precision trainer head)", "head_precision", rule="the two recorded head dtypes differ",
       calibrated_on="exact (recorded dtypes)", causes=("rollout_bf16_head", "trainer_bf16_head")),
    _c("head_precision_low", PATH, (I, W),
       "Both sides project to logits in a low precision (e.g. bf16): matched, but each rounds its logits in its own "
       "kernel; a warning when the measured gap is above the tolerance.",
       head_precision.FIX_ROLLOUT_FP32 + "; and " + head_precision.FIX_TRAINER_FP32, "head_precision", rule="RMS of d above `tol` nats",
       thresholds=("tol",), calibrated_on=CPU_TINY, causes=("rollout_bf16_head",)),
    _c("head_precision_matched", PATH, (I,),
       "Both sides project to logits in float32: the LM head adds no precision mismatch.", FIX_NONE, "head_precision",
       calibrated_on="exact (recorded dtypes)"),
    _c("head_precision_unrecorded", PATH, (I,),
       "The rollout's or the trainer's LM-head dtype is not recorded: the head precision cannot be compared.",
       "capture with rlparity (it reads the engine's head dtype back) and record the trainer's head dtype", "head_precision"),
    _c("head_rounding_in_differences", PATH, (W,),
       "The head dtypes are not recorded, and the differences have the size of bfloat16 rounding of the logits: one "
       "side computes its logits in bf16 and the other does not (or both, in different kernels). The numbers do not "
       "say which side.", head_precision.FIX_EITHER_FP32, "head_precision",
       rule="median over non-argmax tokens of |r| / (bf16 spacing of the trainer's largest logit / sqrt 6 / T) at "
            "least `head_rounding_share` by `temperature_z` jackknife errors; untestable beside another cause that "
            "moves every token (penalty, temperature, cut, dropout) or a trainer whose run-to-run noise is a quarter "
            "of the rounding scale", thresholds=("head_rounding_share", "temperature_z"),
       calibrated_on="held out from the H200 fault matrix: parity 0.001-0.33 (h200-inflight, h100-ablation, h200-rl, "
                     "h200-moe, the fp32 semantic arms), one bf16 side 0.42-1.22 (h200-head, h200-semantic, cpu-head, "
                     "cpu-semantic, h200-rl's bf16-head arm); checked on three held-out H100 matrices: parity arms "
                     "0.10-0.20, one bf16 side 0.55-0.78", causes=("bf16_head_rounding",)),
    _c("head_record_contradicted", PATH, (W,),
       "Both sides are recorded as computing their logits in float32, yet the differences have the size of bfloat16 "
       "rounding of the logits: a logits cast, a bf16 lm_head weight or a kernel that rounds its output.",
       head_precision.FIX_EITHER_FP32, "head_precision", rule="as head_rounding_in_differences, on an arm whose "
       "recorded head dtypes are both float32", thresholds=("head_rounding_share", "temperature_z"),
       calibrated_on="as head_rounding_in_differences", causes=("bf16_head_rounding",)),
    _c("head_fp32_matched_closest", PATH, (I,),
       "Over a head-dtype matrix: the matched float32 cell has the smallest gap; every mismatched cell is larger.",
       FIX_NONE, "head_precision", rule="the matched cell's RMS of d is the lowest of the matrix", across_arms=True),
    _c("head_fp32_not_closest", PATH, (W,),
       "Over a head-dtype matrix: a mismatched cell is as close as the matched float32 one, so something other than "
       "the head (e.g. the body precision) limits parity.",
       "pin the body dtype on both sides and compare the body's hidden states", "head_precision",
       rule="some mismatched cell's RMS of d is not above the matched cell's", across_arms=True),
    # --- inference path: MoE routing -------------------------------------------------------------------------
    _c("moe_routing_disagreement", PATH, (I, W),
       "The engine and the trainer route some tokens to different experts (routing flips); those tokens are "
       "computed by different weights on each side. A warning when the flipped tokens stand above the background or "
       "routing replay removes at least half of their mismatch; information when the flips barely move them or "
       "another cause explains them.", routing.FIX_REPLAY + "; " + routing.FIX_FP32_ROUTER, "routing",
       rule=LOCALIZED + "; or replay removes at least REPLAY_SHARE of the flipped tokens' mean |d|",
       thresholds=("stale_ratio", "tol_trainer", "rlparity.diagnose.routing:REPLAY_SHARE"),
       calibrated_on="stale_ratio on CPU float32; REPLAY_SHARE " + NOT_RECORDED,
       causes=("moe_routing_disagreement", "trainer_bf16_router", "rollout_bf16_router")),
    _c("moe_routes_agree", PATH, (I,),
       "The engine and the trainer route every token to the same experts in every MoE layer.", FIX_NONE, "routing",
       calibrated_on="exact (expert ids)"),
    # --- inference path: inflight weight updates --------------------------------------------------------------
    _c("stale_prefix_cache_after_update", PATH, (W, E),
       "Sequences took prompt tokens from a prefix cache filled before a weight update that did not reset it: their "
       "prefix KV was computed by the old weights. An error when the trace is unscored (stale by construction) or "
       "the effect is measured; a warning when the blocks may have been written after the update or another "
       "cause's mismatch hides the effect.", inflight.FIX_STALE, "inflight", rule=LOCALIZED,
       thresholds=("stale_ratio", "tol_trainer"), calibrated_on="CPU float32 (the bar of 3x is met by 10^4x there); "
                                                               "tol_trainer " + NOT_RECORDED,
       causes=("stale_prefix_cache",)),
    _c("kv_carried_over_update", PATH, (I, W),
       "Requests kept across a weight update (pause mode keep, cache not cleared) sampled their later tokens with "
       "the new weights on KV the old weights computed. A warning when measured or not separable from another "
       "cause; information when small or the trace is unscored.", inflight.FIX_CARRIED, "inflight", rule=LOCALIZED,
       thresholds=("stale_ratio", "tol_trainer"), calibrated_on="CPU float32; tol_trainer " + NOT_RECORDED,
       causes=("kv_carried_over",)),
    _c("scored_at_one_version", PATH, (W,),
       "The tokens come from several policy versions but the trainer scored them all with one set of weights: d "
       "mixes policy lag with the backend mismatch.", inflight.FIX_VERSIONS, "inflight",
       rule="two or more versions and the trainer did not score by policy_version", causes=("mixed_versions",)),
    _c("policy_lag", PATH, (I,),
       "The policy lag of the tokens (share sampled by weights older than the latest, mean and max lag per token "
       "and per sequence), as PipelineRL logs it.", FIX_NONE, "inflight",
       rule="reported when the trace records updates or holds several versions"),
    _c("inflight_stale_arms", PATH, (I,),
       "Over an inflight matrix: the arms with stale prefix-cache hits, and each one's mean |d| after the update "
       "against the same arm with the cache reset (each stale arm has its own finding).", inflight.FIX_STALE,
       "inflight", across_arms=True),
    # --- inference path: weight sync -------------------------------------------------------------------------
    _c("engine_weights_differ", PATH, (E,),
       "For a policy version the engine ran other values than the trainer's weights in some tensors (named, with "
       "their layers): the update did not carry them (a partial sync).", sync.FIX_ENGINE, "sync",
       rule="per-tensor checksums of the engine's loads against the trainer's weights differ",
       calibrated_on="exact (checksums)", causes=("partial_weight_sync",)),
    _c("trainer_weights_stale", PATH, (E,),
       "The trainer scored the tokens of a version with the weights the engine ran as an older version: its sync to "
       "the new version did not happen before it computed pi_old.", sync.FIX_TRAINER, "sync",
       rule="the trainer's checksums for version v equal the engine's for another version",
       calibrated_on="exact (checksums)", causes=("trainer_stale_weights",)),
    _c("weights_differ_at_version", PATH, (W,),
       "Without fingerprints: the tokens of a later policy version disagree with the trainer far more than the "
       "first version's (semantic cause corrected), so the two sides held different weights for it (side unknown).",
       sync.FIX_ENGINE + "; or " + sync.FIX_TRAINER, "sync",
       rule="a later version's median |r| at least `version_ratio` times the first version's and its log-ratio "
            "`version_z` jackknife (over sequences) standard errors above 0, each over its own floor where the "
            "trainer's self-check measured one per version; never for a version whose fingerprints were recorded on "
            "both sides and agree (evidence.version_excess)",
       thresholds=("version_ratio", "version_z"),
       calibrated_on="held out: the H200 inflight arms (no weight fault) at 0.83-0.89x; on the H200 fault matrix the "
                     "arms without a weight fault read 0.46-1.30x, a one-layer partial sync 2.06x, a skipped trainer "
                     "sync 5.26x; on three held-out H100 matrices (seeds 1-3) clean 0.41-0.61x, a skipped trainer sync "
                     "9.2-11.7x (named), a one-layer partial sync 0.74-1.29x (not seen: version 1's own level is "
                     "unknown within one arm)",
       causes=("weights_differ",)),
    # --- inference path: where the layers part ---------------------------------------------------------------
    _c("divergence_starts_at", PATH, (W, E),
       "From a per-layer profile: the first layer and module at which the engine's states leave their floor, and the "
       "cause that place identifies (the LM head's precision, a stale prefix cache, other attention kernels, or one "
       "module's weights). An error for weights or a stale cache, a warning for precision or kernels.",
       "the fix of the cause it names: " + layers.FIX_STALE + "; " + layers.FIX_KERNEL + "; "
       + layers.FIX_WEIGHTS_UNKNOWN, "layers",
       rule="a site leaves its floor when its relative error exceeds `layer_floor_ratio` times the clean arm's there "
            "and `layer_min_rel`", thresholds=("layer_floor_ratio", "layer_min_rel"),
       calibrated_on=CPU_TINY + " (eager): clean arms on other prompts stay within 2x",
       causes=("rollout_bf16_head", "trainer_bf16_head", "stale_prefix_cache", "batch_variant_attention",
               "partial_weight_sync", "weights_differ")),
    _c("layers_not_judged", PATH, (W,),
       "The layer profile holds no sequence, or no finite difference at any site: nothing can be concluded about "
       "where the states diverge (neither within the floor nor diverging).", layers.FIX_PROFILE, "layers",
       rule="no finite relative error at any site of the profile (or zero layer sequences)",
       calibrated_on=NOT_RECORDED),
    _c("layers_within_floor", PATH, (I,),
       "Every layer and module stays within its floor: the two sides agree layer by layer (with the largest ratio "
       "to the floor).", FIX_NONE, "layers", thresholds=("layer_floor_ratio", "layer_min_rel"),
       calibrated_on=CPU_TINY + " (eager)"),
    # --- inference path: the two sides' own floors -----------------------------------------------------------
    _c("trainer_not_deterministic", PATH, (W, E),
       "A second identical forward moves the trainer's logprobs (its self-check): dropout left on or "
       "nondeterministic kernels, so pi_old changes from run to run. An error in train mode with dropout.",
       trainer.FIX_DROPOUT + "; or nondeterministic kernels: torch.use_deterministic_algorithms(True)", "trainer",
       rule="run-to-run RMS at least RUN_TO_RUN_SHARE of the background RMS (or train mode with dropout > 0)",
       thresholds=("rlparity.diagnose.trainer:RUN_TO_RUN_SHARE",), calibrated_on=NOT_RECORDED,
       causes=("trainer_dropout",)),
    _c("trainer_not_batch_invariant", PATH, (I, W),
       "The trainer's logprobs move with the batch shape (the same sequences scored alone vs in their batch): a "
       "warning when that floor is a large part of the measured gap, information (part of the floor) below.",
       trainer.FIX_TRAINER_BATCH, "trainer",
       rule="floor mean |x| at least FLOOR_SHARE of the gap (mean |d|), on a gap above `tol_trainer` nats",
       thresholds=("rlparity.diagnose.trainer:FLOOR_SHARE", "tol_trainer"), calibrated_on=NOT_RECORDED,
       causes=("trainer_batch_variance",)),
    _c("engine_not_batch_invariant", PATH, (I, W),
       "The engine's logprobs move with the batch a request runs in (the same requests sampled again alone): a "
       "warning when that floor is a large part of the measured gap, information (part of the floor) below.",
       trainer.FIX_ENGINE_BATCH, "trainer",
       rule="floor mean |x| at least FLOOR_SHARE of the gap (mean |d|), on a gap above `tol_trainer` nats",
       thresholds=("rlparity.diagnose.trainer:FLOOR_SHARE", "tol_trainer"), calibrated_on=NOT_RECORDED,
       causes=("batch_variant_attention",)),
    # --- objective layer -------------------------------------------------------------------------------------
    _c("backend_ratio_not_centred", OBJ, (W, E),
       "The mean backend ratio pi_old/mu is not 1 (it is in expectation under mu when both are distributions over "
       "the same tokens): every correction weight built on it is biased.", objective.FIX_BACKEND_FIRST, "objective",
       rule="|mean - 1| above `objective.backend_ratio_tol` and `objective.backend_ratio_z` standard errors; an "
            "error beyond 5x the tolerance", thresholds=("objective.backend_ratio_tol", "objective.backend_ratio_z"),
       calibrated_on="rlparity check's band (mean ratio in [0.98, 1.02]; peers' published gates)"),
    _c("ess_collapse", OBJ, (W, E),
       "The normalised effective sample size of the raw (untruncated) importance weights of a pair (backend or "
       "update), token or sequence level, is low: the batch counts as a small share of its size.",
       objective.FIX_BACKEND_FIRST + " (backend pair); " + objective.FIX_UPDATE + " (update pair)", "objective",
       rule="ESS below `objective.ess_min` warns, below `objective.ess_collapse` is an error",
       thresholds=("objective.ess_min", "objective.ess_collapse"), calibrated_on=LITERATURE),
    _c("masked_fraction_high", OBJ, (W, E),
       "A configured rejection rule drops a large share of the tokens: the update trains on a different, smaller "
       "batch.", objective.FIX_BACKEND_FIRST + " (backend pair); widen the band or take a smaller step (update pair)",
       "objective", rule="masked share above `objective.masked_fraction_max` warns, above "
                         "`objective.masked_fraction_error` is an error",
       thresholds=("objective.masked_fraction_max", "objective.masked_fraction_error"), calibrated_on=LITERATURE),
    _c("update_ratio_clipped_often", OBJ, (W,),
       "The update pair (pi_theta, pi_old) is clipped often: PPO's token clip or GSPO's sequence clip; the step "
       "leaves the trust region.", objective.FIX_UPDATE, "objective",
       rule="token clip fraction (ratio outside [1-eps, 1+eps]) above `objective.clip_fraction_max`, or GSPO "
            "sequence clip fraction above `objective.sequence_clip_fraction_max`; when the trace records the "
            "step (`train_step`), only that loss's rule, at the step's own clip",
       thresholds=("eps", "objective.gspo_eps_low", "objective.gspo_eps_high", "objective.clip_fraction_max",
                   "objective.sequence_clip_fraction_max"), calibrated_on=LITERATURE),
    _c("correction_hides_backend_mismatch", OBJ, (E,),
       "An off-policy correction is configured (or token TIS makes the backend weights pass verl's health rules) "
       "while the semantic or inference-path layer reports an error: the correction compensates the bug, its "
       "metrics look healthy, and the update is not the parity update.",
       objective.FIX_BACKEND_FIRST + "; remove the correction until the backend pair is in parity", "objective",
       rule="a backend error plus a configured correction, or corrected weights within verl's health rules (mean in "
            "[0.5, 2], ESS >= 0.3, std <= 1, chi2_token <= 1) at the cap `objective.is_cap`",
       thresholds=("objective.is_cap", "rlparity.diagnose.objective:VERL_HEALTHY"), calibrated_on=LITERATURE),
)

CATALOGUE: dict[str, FindingCode] = {c.code: c for c in _CODES}


def catalogue() -> dict[str, FindingCode]:
    """Every finding code, in layer order.

    Returns
    -------
    dict of str to FindingCode
        ``{code: FindingCode}`` (a copy of :data:`CATALOGUE`).
    """
    return dict(CATALOGUE)


def lookup(code: str) -> FindingCode:
    """The catalogue entry of ``code``.

    Parameters
    ----------
    code : str
        A finding code.

    Returns
    -------
    FindingCode
        Its entry.

    Raises
    ------
    KeyError
        If there is no such code; the message names the closest codes.
    """
    if code in CATALOGUE:
        return CATALOGUE[code]
    import difflib

    close = difflib.get_close_matches(code, list(CATALOGUE), n=3, cutoff=0.5)
    raise KeyError(f"no finding code {code!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                   f"; {len(CATALOGUE)} codes: `rlparity findings` lists them"))


def _threshold(ref: str) -> dict[str, Any]:
    if ":" in ref:
        module, name = ref.split(":")
        return {"name": name, "value": getattr(importlib.import_module(module), name), "where": ref,
                "description": ""}
    obj, model = defaults(), None
    for part in ref.split("."):
        model, obj = obj, getattr(obj, part)
    field = type(model).model_fields[ref.split(".")[-1]]
    return {"name": ref, "value": obj, "where": f"defaults().{ref}", "description": field.description or ""}


def thresholds(entry: FindingCode) -> list[dict[str, Any]]:
    """What ``entry``'s rule reads, as the code holds it now.

    Defaults changed with :func:`rlparity.config.defaults_context` show here.

    Parameters
    ----------
    entry : FindingCode
        A catalogue entry.

    Returns
    -------
    list of dict
        One ``{name, value, where, description}`` per threshold of the entry.
    """
    return [_threshold(t) for t in entry.thresholds]


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    return str(v)


def _md(text: str) -> str:
    """Text safe in a Markdown table cell and in prose (no stray table bars)."""
    return text.replace("|", "\\|")


def catalogue_markdown() -> str:
    """The book's catalogue page (MyST Markdown).

    A table of every code, then one section per layer and code with its anchor
    (:func:`rlparity.diagnose.findings.catalogue_anchor`): severities, emitting module, meaning,
    rule, thresholds with their current values, what they were calibrated on, the causes it can
    name and the fix.

    Returns
    -------
    str
        The page's Markdown.
    """
    from rlparity.diagnose.causes import CAUSES

    cat = catalogue()
    by_layer: dict[Layer, list[FindingCode]] = {}
    for c in cat.values():
        by_layer.setdefault(c.layer, []).append(c)
    out = ["# Findings catalogue\n",
           f"Every finding code the diagnoses can emit ({len(cat)} codes), generated from the code "
           "(`rlparity.diagnose.catalogue`): the layer, the severities it can have, what it means, the rule and the "
           "thresholds it reads with their current values and what they were calibrated on, and the fix. A report "
           "links each finding here; in a terminal, `rlparity findings CODE` prints the same entry.\n",
           "The severities are the check's own. The attribution (`rlparity.diagnose.attribution`) turns a warning or "
           "an error that another cause explains into information, naming that cause (`explained_by`).\n",
           "| code | layer | severity | meaning |", "|---|---|---|---|"]
    for c in cat.values():
        first = c.meaning.split(". ")[0].rstrip(".") + "."
        out.append(f"| [`{c.code}`](#{c.anchor}) | {c.layer.value} | {', '.join(s.value for s in c.severities)} "
                   f"| {_md(first)} |")
    out.append("")
    for layer, codes in by_layer.items():
        out.append(f"## {layer.value.replace('_', ' ').capitalize()} layer\n")
        for c in codes:
            out += [f"({c.anchor})=", f"### `{c.code}`\n",
                    f"**{', '.join(s.value for s in c.severities)}** · emitted by `{c.module}`"
                    + (" over the arms of a store" if c.across_arms else " per arm") + "\n",
                    _md(c.meaning) + "\n"]
            if c.rule:
                out.append(f"**Rule.** {_md(c.rule)}\n")
            for t in thresholds(c):
                desc = f": {_md(t['description'])}" if t["description"] else ""
                out.append(f"- `{t['where']}` = `{_value(t['value'])}`{desc}")
            if c.thresholds:
                out.append("")
            out.append(f"**Calibrated on.** {_md(c.calibrated_on)}\n")
            if c.causes:
                out.append("**Causes it can name.** " + "; ".join(
                    f"`{k}` ({_md(CAUSES[k].title)})" for k in c.causes) + "\n")
            out.append(f"**Fix.** {_md(c.fix)}\n")
    return "\n".join(out)


def catalogue_text(code: str | None = None) -> str:
    """Plain text of the catalogue for a terminal.

    Parameters
    ----------
    code : str, optional
        A finding code; None lists every code.

    Returns
    -------
    str
        One line per code (code, layer, severities, first sentence of the meaning), or the full
        entry of ``code``.

    Raises
    ------
    KeyError
        If ``code`` is not a finding code (:func:`lookup`).
    """
    if code is None:
        cat = catalogue()
        width = max(len(c) for c in cat)
        return "\n".join(f"{c.code:<{width}}  {c.layer.value:<14}  {'/'.join(s.value for s in c.severities):<13}  "
                         + c.meaning.split(". ")[0].rstrip(".") for c in cat.values())
    c = lookup(code)
    lines = [f"{c.code} ({c.layer.value}; {', '.join(s.value for s in c.severities)}; {c.module})", "",
             c.meaning, ""]
    if c.rule:
        lines += [f"rule: {c.rule}"]
    for t in thresholds(c):
        lines.append(f"  {t['where']} = {_value(t['value'])}" + (f": {t['description']}" if t["description"] else ""))
    lines += [f"calibrated on: {c.calibrated_on}"]
    if c.causes:
        lines += [f"causes: {', '.join(c.causes)}"]
    lines += [f"fix: {c.fix}"]
    return "\n".join(lines)


__all__ = ["CATALOGUE", "FindingCode", "catalogue", "catalogue_markdown", "catalogue_text", "lookup", "thresholds"]
