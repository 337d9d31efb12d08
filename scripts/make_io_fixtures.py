"""Build the importer fixtures in tests/data/io with each framework's own writer code.

The files are written by the peers' serialization functions, copied (minimal, with their licence
and commit) into scripts/peers/ and run with their heavy imports stubbed:

* prime-rl ``TokenExporter`` (559b447; the multi-run trainer's at 3ab5e04), fed packed
  micro-batches as ``prime_rl/trainer/batch.py`` packs them (rl/ce weight streams with their
  identity fill, padding to a multiple) and the trainer's shifted logprobs/entropy;
* NeMo-RL ``Logger.log_batched_dict_as_jsonl`` with ``grpo_train``'s and ``distillation_train``'s
  logging blocks, ``get_next_experiment_dir`` and ``compute_and_apply_seq_logprob_error_masking``
  (7ea279a);
* slime ``Sample.to_dict`` / ``save_debug_rollout_data`` / ``_convert_samples_to_train_data`` /
  ``_build_dump_payload`` (624b824), and the ``Sample`` of f81ecfe whose dumps need pickle;
* PipelineRL ``make_training_text`` and ``FileStreamWriter`` (58d3934; needs ``pip install orjson``);
* verl ``_log_rollout_data`` / ``_dump_generations`` (b178a3c) and TRL ``GRPOTrainer.log``'s
  completions Parquet (f2cd577): text only;
* the recipes of rlparity/importers/GENERIC_FORMAT.md ("From verl", "From TRL"), executed as written on
  tensors shaped as verl's ``batch.batch`` and TRL's ``_generate_and_score_completions`` output.

Values come from rlparity's tiny model (``make_model("tiny")``, float32, CPU): prompts from
``make_prompts``, responses sampled from the processed distribution (temperature, top-k, top-p
as vLLM applies them). Per token the script knows every reading: raw (full vocabulary, T = 1),
tempered (temperature only) and processed (temperature, top-k, top-p, renormalised). A "parity"
dump's engine logprobs are the processed ones plus 0.002 nats of Gaussian noise; a "raw-mode"
dump's are the raw ones while sampling at T = 0.7 with top-k 8 (vLLM's default
``logprobs_mode=raw_logprobs``). The trainer side is what each framework's trainer computes:
tempered (prime-rl, slime, verl, TRL) or processed (NeMo-RL).

Deterministic: ``PYTHONPATH=.cache/pydeps python scripts/make_io_fixtures.py`` (orjson installed
there with ``pip install --target .cache/pydeps orjson``) rewrites the same files (committed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

SEED = 0
NOISE = 0.002  # nats of engine noise on the rollout side
TOOL_TEXT = ";7*3="  # "tool output" inserted between two assistant turns of multi-turn samples
NS = types.SimpleNamespace


@dataclass
class Sampled:
    ids: list[int]          # prompt + every later token
    sampled: list[bool]     # which tokens the engine sampled
    raw: list[float]        # per token i: log p(token i | < i), full vocabulary, T = 1
    tempered: list[float]   # temperature only
    processed: list[float]  # temperature, top-k, top-p, renormalised
    tempered_entropy: list[float]
    prompt_len: int
    turns: list[tuple[int, int]]  # [start, end) of each assistant turn
    finished: bool
    reward: float           # share of correct problems in the text (rlparity.models.score_answers)


class TinyModel:
    def __init__(self):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlparity.models import make_model

        path = make_model("tiny", progress=False)
        torch.manual_seed(SEED)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.vocab = self.model.get_output_embeddings().weight.shape[0]

    def logits(self, ids: list[int]):
        with self.torch.inference_mode():
            return self.model(input_ids=self.torch.tensor([ids])).logits[0].float()

    def processed(self, logits, t, k, p):
        from rlparity.score import processed_logits

        n = logits.shape[0]
        torch = self.torch
        return processed_logits(logits, torch.full((n,), float(t)), torch.full((n,), int(k), dtype=torch.long),
                                torch.full((n,), float(p)))

    def text_ids(self, text: str) -> list[int]:
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]

    def sample(self, prompt_ids: list[int], *, t: float, k: int, p: float, gen, max_new: int = 10,
               turns: int = 1) -> Sampled:
        from rlparity.models import score_answers

        torch = self.torch
        ids = list(prompt_ids)
        prompt_len = len(ids)
        sampled = [False] * prompt_len
        spans, finished = [], True
        for turn in range(turns):
            if turn:
                tool = self.text_ids(TOOL_TEXT)
                ids += tool
                sampled += [False] * len(tool)
            start = len(ids)
            finished = False
            for _ in range(max_new):
                logits = self.logits(ids)[-1:]
                probs = self.processed(logits, t, k, p).log_softmax(-1).exp()
                nxt = int(torch.multinomial(probs[0], 1, generator=gen))
                ids.append(nxt)
                sampled.append(True)
                if nxt == self.tok.eos_token_id:
                    finished = True
                    break
            spans.append((start, len(ids)))
        logits = self.logits(ids)[:-1]  # row i predicts token i + 1
        nxt = torch.tensor(ids[1:])
        rows = torch.arange(len(nxt))
        raw = logits.log_softmax(-1)[rows, nxt]
        tempered_lp = (logits / t).log_softmax(-1)
        tempered = tempered_lp[rows, nxt]
        processed = self.processed(logits, t, k, p).log_softmax(-1)[rows, nxt]
        ent = -(tempered_lp.exp() * tempered_lp).sum(-1)
        first = math.log(1.0 / self.vocab)

        def full(v, pad):
            return [pad] + [float(x) for x in v]

        return Sampled(ids=ids, sampled=sampled, raw=full(raw, first), tempered=full(tempered, first),
                       processed=full(processed, first), tempered_entropy=full(ent, math.log(self.vocab)),
                       prompt_len=prompt_len, turns=spans, finished=finished,
                       reward=score_answers(self.tok.decode(ids, skip_special_tokens=True)))

    def decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def engine(s: Sampled, mode: str, rng: np.random.Generator) -> list[float]:
    """The engine's logprob per token (0.0 where it sampled nothing, as the frameworks store)."""
    src = s.processed if mode == "processed" else s.raw
    noise = rng.normal(0.0, NOISE, size=len(src))
    return [min(v + float(e), 0.0) if m else 0.0 for v, e, m in zip(src, noise, s.sampled)]


def prompts(model: TinyModel, n: int, seed: int, *, template: bool = True) -> list[list[int]]:
    """Prompt ids: the chat template (``<bos>`` + text) tokenized, as every framework here does."""
    from rlparity.models import make_prompts

    out = []
    for text in make_prompts(n, seed=seed):
        rendered = model.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True) if template else text
        out.append(model.text_ids(rendered))
    return out


def samples(model: TinyModel, n_prompts: int, *, per_prompt: int = 1, t: float, k: int = 0, p: float = 1.0,
            seed: int, multi_turn: int = 0, max_new: int = 10) -> list[Sampled]:
    """``per_prompt`` samples of each prompt, consecutive (GRPO groups); the first ``multi_turn``
    samples have two assistant turns."""
    gen = model.torch.Generator().manual_seed(seed)
    out = []
    for pr in prompts(model, n_prompts, seed):
        for _ in range(per_prompt):
            out.append(model.sample(pr, t=t, k=k, p=p, gen=gen, max_new=max_new,
                                    turns=2 if len(out) < multi_turn else 1))
    return out


def load_peer(name: str, as_module: str | None = None):
    """A module of scripts/peers, optionally registered under another name (its pickled path)."""
    path = ROOT / "scripts" / "peers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(as_module or f"peers.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- prime-rl


def _micro_batch(model: TinyModel, bin_samples: list[dict], pad_to_multiple_of: int, rank_dims=None):
    """A packed micro-batch as prime_rl/trainer/batch.py builds it (streams filled with STREAM_FILL
    for samples that lack them, padding to a multiple), plus the trainer's model output (logprobs
    and entropy shifted right, the first position padded with log(1/V) and log(V))."""
    torch = model.torch
    fill = {"rl_weights": 1.0, "ce_weights": 0.0, "ref_kl_weights": 0.0}  # batch.py STREAM_FILL
    cols = {k: [] for k in ("input_ids", "loss_mask", "advantages", "inference_logprobs", "position_ids",
                            "temperatures", "env_names", "logprobs", "entropy")}
    streams = {k: ([] if any(s.get(k) is not None for s in bin_samples) else None) for k in fill}
    lengths = []
    for s in bin_samples:
        n = len(s["input_ids"])
        for k in cols:
            cols[k].extend(s[k] if k != "position_ids" else list(range(n)))
        for k, stream in streams.items():
            if stream is not None:
                stream.extend(s.get(k) if s.get(k) is not None else [fill[k]] * n)
        lengths.append(n)
    pad = (pad_to_multiple_of - len(cols["input_ids"]) % pad_to_multiple_of) % pad_to_multiple_of
    if pad:  # batch.py pad_micro_batch
        cols["input_ids"] += [1] * pad
        cols["advantages"] += [0.0] * pad
        cols["loss_mask"] += [False] * pad
        cols["position_ids"] += list(range(pad))
        cols["inference_logprobs"] += [0.0] * pad
        cols["temperatures"] += [1.0] * pad
        cols["env_names"] += [""] * pad
        cols["logprobs"] += [math.log(1.0 / model.vocab)] * pad
        cols["entropy"] += [math.log(model.vocab)] * pad
        for k, stream in streams.items():
            if stream is not None:
                stream.extend([0.0] * pad)
        lengths[-1] += pad
    mb = {"input_ids": torch.tensor([cols["input_ids"]]), "loss_mask": torch.tensor([cols["loss_mask"]]),
          "advantages": torch.tensor([cols["advantages"]]), "position_ids": torch.tensor([cols["position_ids"]]),
          "inference_logprobs": torch.tensor([cols["inference_logprobs"]]),
          "temperatures": torch.tensor([cols["temperatures"]]), "env_names": cols["env_names"],
          **{k: (torch.tensor([v]) if v is not None else None) for k, v in streams.items()}}
    out = {"logprobs": torch.tensor([cols["logprobs"]]), "entropy": torch.tensor([cols["entropy"]])}
    return mb, out, lengths


def _prime_sample(model: TinyModel, s: Sampled, rng, *, t: float, advantage: float, kind: str = "rl",
                  minus_inf_at: int | None = None) -> dict:
    """One TrainingSample as the orchestrator ships it, with the trainer's outputs at its tokens.
    ``kind``: ``rl`` (no weight streams), ``zero_advantage`` (train_sink._prune_zero_advantages sets
    rl_weights 0), ``ce`` (algo/routing.stamp_loss_routing("ce"): tokens of a frozen model,
    inference_logprobs placeholders 0.0)."""
    n = len(s.ids)
    inf = engine(s, "processed", rng) if kind != "ce" else [0.0] * n
    logprobs = list(s.tempered)
    if minus_inf_at is not None:
        logprobs[minus_inf_at] = -math.inf  # a token the trainer gives probability 0
    out = {"input_ids": s.ids, "loss_mask": list(s.sampled), "advantages": [advantage] * n,
           "inference_logprobs": [float(np.float32(v)) for v in inf], "temperatures": [t] * n,
           "env_names": ["arith"] * n, "logprobs": logprobs, "entropy": list(s.tempered_entropy)}
    if kind == "zero_advantage":
        out["rl_weights"] = [0.0] * n
        out["advantages"] = [0.0] * n
    elif kind == "ce":
        out["rl_weights"] = [0.0] * n
        out["ce_weights"] = [1.0 if m else 0.0 for m in s.sampled]
    return out


def prime_rl(model: TinyModel, out: Path) -> None:
    """token_exports of the single-run trainer (step_3: packed bins with rl/ce weight streams,
    a multi-turn sample; step_4: a trainer -inf written as null) and of the multi-run trainer
    (two runs, export step 7, trainer step 0). T = 0.7, processed engine logprobs."""
    from peers import stubs

    stubs.install_prime_rl()
    te = load_peer("prime_rl_token_export")
    rng = np.random.default_rng(SEED)
    t = 0.7
    loss = stubs.DefaultLossConfig()
    d = out / "prime-rl" / "single"
    for rank, n in ((0, 10), (1, 4)):
        ss = samples(model, n, t=t, seed=10 + rank, multi_turn=1 if rank == 0 else 0)
        exporter = te.TokenExporter(d, rank)
        if rank == 0:
            kinds = ["rl", "rl", "rl", "rl", "rl", "zero_advantage", "ce", "ce", "rl", "rl"]
            bins = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        else:
            kinds, bins = ["rl"] * 4, [[0, 1], [2, 3]]
        batch = [_prime_sample(model, s, rng, t=t, advantage=round(float(rng.normal()), 4) or 0.5, kind=kind)
                 for s, kind in zip(ss, kinds)]
        for micro_step, idx in enumerate(bins):
            mb, mo, lengths = _micro_batch(model, [batch[i] for i in idx], pad_to_multiple_of=8)
            exporter.export(3, micro_step, mb, mo, lengths, loss)
        exporter.mark_stable()
    # step 4: one sampled token has trainer logprob -inf (prime-rl writes null)
    ss = samples(model, 3, t=t, seed=13)
    exporter = te.TokenExporter(d, 0)
    batch = [_prime_sample(model, s, rng, t=t, advantage=0.5,
                           minus_inf_at=(s.turns[0][0] + 1 if j == 1 else None)) for j, s in enumerate(ss)]
    mb, mo, lengths = _micro_batch(model, batch, pad_to_multiple_of=8)
    exporter.export(4, 0, mb, mo, lengths, loss)
    exporter.mark_stable()

    # the multi-run trainer: two runs packed into trainer step 0, each at its own run step 7
    te_multi = load_peer("prime_rl_token_export_multirun")
    d = out / "prime-rl" / "multirun"
    exporter = te_multi.TokenExporter(d, 0)
    for j, run in enumerate(("run_a", "run_b")):
        ss = samples(model, 4, t=t, seed=20 + j)
        batch = [_prime_sample(model, s, rng, t=t, advantage=0.5) for s in ss]
        mb, mo, lengths = _micro_batch(model, batch, pad_to_multiple_of=8)
        mb["run_id"], mb["run_step"] = run, 7
        exporter.export(0, j, mb, mo, lengths, loss)
    exporter.mark_stable({"run_a", "run_b"})


# --------------------------------------------------------------------------- NeMo-RL


ENV_OBSERVATION = {True: "Environment: correct", False: "Environment: incorrect"}


def _nemo_batch(model: TinyModel, ss: list[Sampled], mode: str, rng, *, reward_components: int = 1):
    """The tensors grpo_train logs: flat messages (user, assistant, environment per sample, as
    nemo_rl/experience/rollouts.py appends an environment message after each assistant turn),
    right-padded input_ids, token/sample masks, generation and previous logprobs (processed; 0
    outside the loss mask)."""
    torch = model.torch
    rows, contents = [], []
    for s in ss:
        obs = model.text_ids(ENV_OBSERVATION[s.reward == 1.0])
        gen = engine(s, mode, rng)
        prev = [v if m else 0.0 for v, m in zip(s.processed, s.sampled)]  # 0 outside the loss mask
        contents.append([model.tok.decode(s.ids[: s.prompt_len]), model.tok.decode(s.ids[s.prompt_len:]),
                         ENV_OBSERVATION[s.reward == 1.0]])
        rows.append((s.ids + obs, [int(m) for m in s.sampled] + [0] * len(obs), gen + [0.0] * len(obs),
                     prev + [0.0] * len(obs)))
    width = max(len(r[0]) for r in rows)
    pad = model.tok.pad_token_id

    def padded(i, fill, dtype):
        return torch.tensor([r[i] + [fill] * (width - len(r[i])) for r in rows], dtype=dtype)

    rewards = torch.tensor([s.reward for s in ss], dtype=torch.float32)
    train_data = {"input_ids": padded(0, pad, torch.long), "token_mask": padded(1, 0, torch.long),
                  "generation_logprobs": padded(2, 0.0, torch.float32), "prev_logprobs": padded(3, 0.0, torch.float32),
                  "sample_mask": torch.ones(len(ss), dtype=torch.float32)}
    adv = (rewards - rewards.view(-1, 2).mean(-1).repeat_interleave(2))
    train_data["advantages"] = adv[:, None].expand(-1, width).contiguous()
    if reward_components > 1:  # a second component per sample (a format reward): a 2-d rewards
        rewards = torch.stack([rewards, torch.tensor([0.225] * len(ss))], dim=1)
    input_lengths = torch.tensor([len(r[0]) for r in rows], dtype=torch.int32)
    return {"content": contents}, rewards, input_lengths, train_data


def nemo_rl(model: TinyModel, out: Path) -> None:
    """Two launches of one log dir (logs/exp_001: parity, the two samples of one prompt with
    sample_loss_mask 0, a validation log; logs/exp_002: raw-mode, 2-d rewards, sequences over
    seq_logprob_error_threshold 1.4 masked), and a distillation log. T = 0.7, top-k 8, GRPO
    groups of 2 (consecutive, as repeat_interleave leaves them)."""
    nl = load_peer("nemo_rl_logger")
    config = NS(grpo=NS(use_dynamic_sampling=False), env={})
    base = out / "nemo-rl" / "logs"
    for mode, components in (("processed", 1), ("raw", 2)):
        rng = np.random.default_rng(SEED)
        ss = samples(model, 6, per_prompt=2, t=0.7, k=8, seed=20, max_new=10)
        logger = nl.Logger(nl.get_next_experiment_dir(str(base)))
        flat, rewards, input_lengths, train_data = _nemo_batch(model, ss, mode, rng, reward_components=components)
        td = nl.BatchedDataDict(train_data)
        if mode == "processed":  # the data processors set loss_multiplier 0 on a datum they exclude (prompt 2)
            td["sample_mask"] = torch_tensor(model, [0.0 if i // 2 == 2 else 1.0 for i in range(len(ss))])
        else:
            nl.compute_and_apply_seq_logprob_error_masking(td, rewards[:, 0] if rewards.ndim == 2 else rewards, 1.4)
        nl.log_grpo_train_data(logger, config, {}, flat, rewards, input_lengths, td, total_steps=0)
        if mode == "processed":
            logger.log_batched_dict_as_jsonl({"content": flat["content"][:4], "rewards": rewards[:4].tolist()},
                                             "val_data_step0.jsonl")
    logger = nl.Logger(nl.get_next_experiment_dir(str(out / "nemo-rl" / "distillation")))
    flat, _, input_lengths, _ = _nemo_batch(model, samples(model, 2, per_prompt=2, t=0.7, k=8, seed=21),
                                            "processed", np.random.default_rng(SEED))
    nl.log_distillation_train_data(logger, flat, input_lengths, total_steps=0)


def torch_tensor(model: TinyModel, values):
    return model.torch.tensor(values, dtype=model.torch.float32)


# --------------------------------------------------------------------------- slime


def _slime_samples(model: TinyModel, Sample, ss: list[Sampled], rng, *, removed: int | None = None) -> list:
    out = []
    for i, s in enumerate(ss):
        gen = engine(s, "processed", rng)
        rlen = len(s.ids) - s.prompt_len
        sample = Sample(group_index=i // 2, index=i, prompt=model.tok.decode(s.ids[: s.prompt_len]), tokens=s.ids,
                        response=model.tok.decode(s.ids[s.prompt_len:]), response_length=rlen, reward=s.reward,
                        loss_mask=[int(m) for m in s.sampled[s.prompt_len:]], weight_versions=["5"] * len(s.turns),
                        rollout_log_probs=[float(np.float32(v)) for v in gen[s.prompt_len:]],
                        status=Sample.Status.COMPLETED if s.finished else Sample.Status.TRUNCATED)
        if i == removed:  # a field of newer slime versions only
            sample.remove_sample = True
        out.append(sample)
    return out


def slime(model: TinyModel, out: Path) -> None:
    """debug/rollout_2.pt (training rollout 2, one multi-turn sample, one remove_sample),
    debug/rollout_eval_2.pt (the eval rollout of the same id), debug/train_2_0.pt (format_version
    2, two DP shards, raw_reward, the trainer's log_probs at --rollout-temperature 0.7); specinfo/
    rollout_3.pt written by the Sample of f81ecfe (needs pickle)."""
    import torch

    sd = load_peer("slime_dump")
    rng = np.random.default_rng(SEED)
    ss = samples(model, 4, per_prompt=2, t=0.7, seed=30, multi_turn=1)
    train_samples = _slime_samples(model, sd.Sample, ss, rng, removed=7)
    d = out / "slime" / "debug"
    template = str(d / "rollout_{rollout_id}.pt")
    sd.save_debug_rollout_data(template, train_samples, rollout_id=2, evaluation=False)
    eval_ss = samples(model, 2, per_prompt=2, t=0.7, seed=31)
    eval_samples = _slime_samples(model, sd.Sample, eval_ss, rng)
    sd.save_debug_rollout_data(template, {"arith": {"samples": eval_samples}}, rollout_id=2, evaluation=True)

    args = NS(advantage_estimator="grpo", rewards_normalization=True, n_samples_per_prompt=2, rollout_batch_size=4,
              grpo_std_normalization=True, reward_key=None, rollout_top_p=1.0, use_rollout_routing_replay=False)
    data = sd.convert_samples_to_train_data(args, train_samples)
    shards = []
    for r, rollout_data in enumerate(sd.split_train_data_by_dp(data, [[0, 2, 4, 6], [1, 3, 5, 7]])):
        # the trainer's own per-sample outputs (what the training step adds before the dump)
        rollout_data["log_probs"] = [torch.tensor(ss[j].tempered[ss[j].prompt_len:], dtype=torch.float32)
                                     for j in rollout_data["partition"]]
        shards.append({"rank": r, "data_parallel_rank": r, "rollout_data": rollout_data})
    sd.write_debug_train_data(str(d / "train_{rollout_id}_{rank}.pt"), shards, rollout_id=2, rank=0)

    # slime from f81ecfe to 5472cab: Sample.to_dict() keeps spec_info as an object
    for name in ("slime", "slime.utils"):
        sys.modules.setdefault(name, types.ModuleType(name))
    old = load_peer("slime_types_f81ecfe", as_module="slime.utils.types")
    old_samples = _slime_samples(model, old.Sample, ss[:2], rng)
    sd.save_debug_rollout_data(str(out / "slime" / "specinfo" / "rollout_{rollout_id}.pt"), old_samples,
                               rollout_id=3, evaluation=False)
    for name in ("slime.utils.types", "slime.utils", "slime"):
        sys.modules.pop(name)


# --------------------------------------------------------------------------- PipelineRL


class ChatTokenizer:
    """The tiny tokenizer as PipelineRL expects it (transformers 4.x: apply_chat_template with
    tokenize=True returns the ids list)."""

    def __init__(self, tok):
        self.tok = tok
        self.bos_token, self.eos_token = tok.bos_token, tok.eos_token

    def apply_chat_template(self, conversation, tokenize=True, **kw):
        out = self.tok.apply_chat_template(conversation, tokenize=tokenize, **kw)
        return list(out["input_ids"]) if tokenize else out


def pipelinerl(model: TinyModel, out: Path) -> None:
    """exp/streams/actor/0/{0,1}/0.jsonl (training rollouts, two partitions) and
    exp/streams/actor_test/0/0/0.jsonl (test rollouts), parity; raw_exp/streams/actor/0/0/0.jsonl
    raw-mode. T = 0.7, top-k 8, groups of 2, model versions 0-3."""
    pl = load_peer("pipelinerl_streams")
    from rlparity.models import make_prompts

    llm = NS(model_name="tiny", tokenizer=ChatTokenizer(model.tok), chat_template_kwargs=None)
    for exp, mode, topics in (("exp", "processed", (("actor", 8, 40), ("actor_test", 2, 41))),
                              ("raw_exp", "raw", (("actor", 8, 40),))):
        rng = np.random.default_rng(SEED)
        for topic, n_groups, seed in topics:
            gen = model.torch.Generator().manual_seed(seed)
            for g, text in enumerate(make_prompts(n_groups, seed=seed)):
                messages = [{"role": "user", "content": text}]
                prompt_ids = llm.tokenizer.apply_chat_template(messages, add_special_tokens=True,
                                                               add_generation_prompt=True)
                group = []
                for j in range(2):
                    s = model.sample(prompt_ids, t=0.7, k=8, p=1.0, gen=gen)
                    lps = engine(s, mode, rng)[s.prompt_len:]
                    call = NS(prompt=NS(messages=messages, tools=None, id=f"{topic}_{g}"),
                              output=NS(content=model.decode(s.ids[s.prompt_len:]), tool_calls=None),
                              llm_info={"finish_reason": "stop" if s.finished else "length"},
                              logprobs=[NS(token_id=t_, logprob=lp) for t_, lp in zip(s.ids[s.prompt_len:], lps)],
                              prompt_length_tokens=s.prompt_len, output_length_tokens=len(s.ids) - s.prompt_len)
                    text_ = pl.make_training_text(llm, call)
                    text_.reward = s.reward
                    text_.group_id = f"rollout_maker_0_{g}"
                    text_.metadata.update(model_version=g // 2, rollout_index=j, step_index=0)
                    group.append(text_)
                stream = pl.SingleStreamSpec(exp_path=out / "pipelinerl" / exp, topic=topic, instance=0,
                                             partition=g % 2 if topic == "actor" and mode == "processed" else 0)
                with pl.FileStreamWriter(stream, "a") as writer:  # actor.py: one line per group
                    writer.write([t_.model_dump() for t_ in group])


# --------------------------------------------------------------------------- verl, TRL


def _snippet(title: str) -> str:
    doc = (ROOT / "rlparity" / "importers" / "GENERIC_FORMAT.md").read_text()
    return doc.split(f"**{title}**")[1].split("```python")[1].split("```")[0]


def _padded(model: TinyModel, ss: list[Sampled], rng, trainer: str):
    """verl's layout: left-padded prompts, right-padded responses, response-shaped masks/logprobs."""
    torch = model.torch
    P = max(s.prompt_len for s in ss)
    R = max(len(s.ids) - s.prompt_len for s in ss)
    pad = model.tok.pad_token_id
    n = len(ss)
    prompt_ids = torch.full((n, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros((n, P), dtype=torch.long)
    response_ids = torch.full((n, R), pad, dtype=torch.long)
    response_mask = torch.zeros((n, R), dtype=torch.long)
    rollout = torch.zeros((n, R), dtype=torch.float32)
    old = torch.zeros((n, R), dtype=torch.float32)
    scores = torch.zeros((n, R), dtype=torch.float32)
    for i, s in enumerate(ss):
        p, r = s.prompt_len, len(s.ids) - s.prompt_len
        prompt_ids[i, P - p:] = torch.tensor(s.ids[:p])
        prompt_mask[i, P - p:] = 1
        response_ids[i, :r] = torch.tensor(s.ids[p:])
        response_mask[i, :r] = 1
        rollout[i, :r] = torch.tensor(engine(s, "processed", rng)[p:])
        old[i, :r] = torch.tensor(getattr(s, trainer)[p:])
        scores[i, r - 1] = s.reward
    return prompt_ids, prompt_mask, response_ids, response_mask, rollout, old, scores


def verl(model: TinyModel, out: Path) -> None:
    """rollout_data_dir/5.jsonl (verl's own text dump) and generic/verl/step_5.npz, written by
    GENERIC_FORMAT.md's "From verl" recipe from verl-shaped batch tensors (T = 0.7, verl's
    defaults top_k=-1, top_p=1)."""
    import os

    vr = load_peer("verl_rollout_data_dir")
    rng = np.random.default_rng(SEED)
    ss = samples(model, 4, per_prompt=2, t=0.7, seed=50)
    prompt_ids, prompt_mask, response_ids, response_mask, rollout, old, scores = _padded(model, ss, rng, "tempered")
    batch = NS(batch={"prompts": prompt_ids, "responses": response_ids, "token_level_scores": scores},
               non_tensor_batch={"reward_model": [{"ground_truth": "arith"}] * len(ss)})
    vr.RolloutDataDir(model.tok, 5)._log_rollout_data(batch, {}, str(out / "verl" / "rollout_data_dir"))
    torch = model.torch
    tensors = {"input_ids": torch.cat([prompt_ids, response_ids], 1),
               "attention_mask": torch.cat([prompt_mask, response_mask], 1), "response_mask": response_mask,
               "rollout_log_probs": rollout, "old_log_probs": old}
    trainer = NS(global_steps=5, config=NS(actor_rollout_ref=NS(rollout=NS(temperature=0.7, top_k=-1, top_p=1.0))))
    cwd = os.getcwd()
    (out / "generic" / "verl").mkdir(parents=True, exist_ok=True)
    os.chdir(out / "generic" / "verl")
    try:
        exec(_snippet("From verl"), {"batch": NS(batch=tensors), "self": trainer})
    finally:
        os.chdir(cwd)


def trl(model: TinyModel, out: Path) -> None:
    """completions/completions_00005.parquet (GRPOTrainer.log's text log) and rlparity_dump/
    step_5_rank_0_0.npz, written by GENERIC_FORMAT.md's "From TRL" recipe from tensors shaped as
    _generate_and_score_completions returns them (T = 0.9, TRL's defaults top_k=0, top_p=1)."""
    import os

    tc = load_peer("trl_completions")
    rng = np.random.default_rng(SEED + 2)
    ss = samples(model, 4, per_prompt=2, t=0.9, seed=70)
    prompt_ids, prompt_mask, completion_ids, completion_mask, sampling, old, _ = _padded(model, ss, rng, "tempered")
    advantages = [s.reward - 0.5 for s in ss]
    (out / "trl" / "completions").mkdir(parents=True, exist_ok=True)
    tc.write_completions(NS(state=NS(global_step=5), args=NS(output_dir=str(out / "trl")), _logs={
        "prompt": [model.decode(s.ids[: s.prompt_len]) for s in ss],
        "completion": [model.decode(s.ids[s.prompt_len:]) for s in ss],
        "rewards": {"accuracy_reward": [s.reward for s in ss]}, "extra": {}, "advantages": advantages}))
    outputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
               "completion_mask": completion_mask, "sampling_per_token_logps": sampling,
               "old_per_token_logps": old}
    trainer = NS(args=NS(temperature=0.9, top_k=0, top_p=1.0), state=NS(global_step=5),
                 accelerator=NS(process_index=0))
    cwd = os.getcwd()
    os.chdir(out / "trl")
    try:
        exec(_snippet("From TRL"), {"out": outputs, "self": trainer})
    finally:
        os.chdir(cwd)


# --------------------------------------------------------------------------- generic (custom loop)


def custom(model: TinyModel, out: Path) -> None:
    """generic/custom/rows.jsonl and rows.parquet: a custom loop at T=1 without top-k/top-p (the
    two readings coincide), prompt_length + response-length arrays, prompt text, one multi-turn row."""
    rng = np.random.default_rng(SEED + 1)
    ss = samples(model, 4, per_prompt=2, t=1.0, seed=60, multi_turn=1)
    rows = []
    for i, s in enumerate(ss):
        gen = engine(s, "processed", rng)
        row = {"input_ids": s.ids, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "policy_version": 7,
               "reward": s.reward, "finish_reason": "stop" if s.finished else "length",
               "prompt_index": i // 2, "sample_index": i % 2,
               "prompt_text": model.tok.decode(s.ids[1: s.prompt_len])}  # without <bos>: tokenized with special tokens
        if len(s.turns) > 1:  # multi-turn: a full-length response_mask marks the assistant tokens
            row.update(response_mask=[int(m) for m in s.sampled], rollout_log_probs=[round(v, 6) for v in gen],
                       old_log_probs=[round(v, 6) for v in s.tempered])
        else:
            row.update(prompt_length=s.prompt_len, rollout_log_probs=[round(v, 6) for v in gen[s.prompt_len:]],
                       old_log_probs=[round(v, 6) for v in s.tempered[s.prompt_len:]])
        rows.append(row)
    d = out / "generic" / "custom"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = sorted({k for r in rows for k in r})  # the same rows as Parquet (missing columns are null)
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), d / "rows.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "io"))
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = TinyModel()
    for build in (prime_rl, nemo_rl, slime, pipelinerl, verl, trl, custom):
        build(model, out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    print(f"wrote {len(files)} files under {out} ({sum(p.stat().st_size for p in files) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
