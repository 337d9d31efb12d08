"""Build the importer fixtures in tests/data/io from the documented field lists.

No real dump is reachable here, so each framework's files are written the way its public source
writes them (field names, nesting, alignment: see the docstrings of rlparity/io/<format>.py),
with values from rlparity's tiny model (``make_model("tiny")``, float32, CPU): prompts from
``make_prompts``, responses sampled from the model's processed distribution (temperature, top-k,
top-p as vLLM applies them: ``rlparity.score.processed_logits``), seeded.

Per token the script knows every reading: raw (full vocabulary, temperature 1), tempered
(temperature only) and processed (temperature, top-k, top-p, renormalised). A "parity" dump's
engine logprobs are the processed ones (plus 0.002 nats of Gaussian engine noise); a "raw-mode"
dump's are the raw ones while tokens were sampled at temperature 0.7 with top-k 8 (vLLM's
default ``logprobs_mode=raw_logprobs``). The trainer side is what each framework's trainer
computes: tempered (prime-rl, slime, verl) or processed (NeMo-RL).

Deterministic: ``python scripts/make_io_fixtures.py`` rewrites the same files (committed).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 0
NOISE = 0.002  # nats of engine noise on the rollout side
TOOL_TEXT = ";7*3="  # "tool output" inserted between two assistant turns of multi-turn samples


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

    def sample(self, prompt: str, *, t: float, k: int, p: float, gen, max_new: int = 10, turns: int = 1) -> Sampled:
        from rlparity.models import score_answers

        torch = self.torch
        ids = [int(i) for i in self.tok(prompt)["input_ids"]]
        prompt_len = len(ids)
        sampled = [False] * prompt_len
        spans, finished = [], True
        for turn in range(turns):
            if turn:
                tool = [int(i) for i in self.tok(TOOL_TEXT, add_special_tokens=False)["input_ids"]]
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


def engine(s: Sampled, mode: str, rng: np.random.Generator) -> list[float]:
    """The engine's logprob per token (0.0 where it sampled nothing, as the frameworks store)."""
    src = s.processed if mode == "processed" else s.raw
    noise = rng.normal(0.0, NOISE, size=len(src))
    return [min(v + float(e), 0.0) if m else 0.0 for v, e, m in zip(src, noise, s.sampled)]


def samples(model: TinyModel, n: int, *, t: float, k: int = 0, p: float = 1.0, seed: int, multi_turn: int = 0,
            max_new: int = 10) -> list[Sampled]:
    from rlparity.models import make_prompts

    gen = model.torch.Generator().manual_seed(seed)
    prompts = make_prompts(n, seed=seed)
    return [model.sample(pr, t=t, k=k, p=p, gen=gen, max_new=max_new, turns=2 if i < multi_turn else 1)
            for i, pr in enumerate(prompts)]


def write_jsonl(path: Path, rows, *, allow_nan: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":"), allow_nan=allow_nan) + "\n")


def r6(values):
    return [round(float(v), 6) for v in values]


# --------------------------------------------------------------------------- prime-rl


def prime_rl(model: TinyModel, out: Path) -> None:
    """token_exports/step_3/rank_{0,1}.jsonl: T=0.7, no top-k/top-p (prime-rl sends top_p=1.0),
    processed engine logprobs (prime-rl's default logprobs_mode); trainer = tempered."""
    rng = np.random.default_rng(SEED)
    for rank, n in ((0, 10), (1, 4)):
        ss = samples(model, n, t=0.7, seed=10 + rank, multi_turn=1 if rank == 0 else 0)
        records, micro = [], []
        for s in ss:
            inf = engine(s, "processed", rng)
            L = len(s.ids)
            tr = s.tempered
            lir = [b - a for a, b in zip(inf, tr)]
            micro.append({
                "token_ids": s.ids, "position_ids": list(range(L)), "loss_mask": s.sampled,
                "advantages": [round(float(rng.normal()), 4)] * L, "inference_logprobs": r6(inf),
                "trainer_logprobs": r6(tr), "entropy": r6(s.tempered_entropy),
                "mismatch_kl": r6([math.exp(x) - 1 - x for x in lir]), "log_importance_ratio": r6(lir),
                "importance_ratio": r6([math.exp(x) for x in lir]),
                "prob_delta": r6([math.exp(b) - math.exp(a) for a, b in zip(inf, tr)]),
                "is_masked": [False] * L, "is_masked_high": [False] * L, "is_masked_low": [False] * L,
                "rl_weights": [None] * L, "ce_weights": [None] * L, "ref_kl_weights": [None] * L})
        # rank 0's last two samples packed into one record (position_ids restart at 0), as older exports did
        if rank == 0:
            a, b = micro[-2], micro.pop()
            for key in a:
                a[key] = a[key] + (b[key] if key != "position_ids" else list(range(len(b["token_ids"]))))
        for i, m in enumerate(micro):
            records.append({"schema_version": 1, "step": 3, "rank": rank, "micro_step": i // 4,
                            "micro_sequence_idx": i % 4, "export_sequence_idx": i, "env_name": "arith", **m})
        d = out / "prime-rl" / "token_exports" / "step_3"
        write_jsonl(d / f"rank_{rank}.jsonl", records)
        (d / "STABLE").touch()


# --------------------------------------------------------------------------- NeMo-RL


def nemo_rl(model: TinyModel, out: Path) -> None:
    """train_data_step1.jsonl, T=0.7 top-k 8: parity (processed_logprobs) and raw-mode (vLLM's
    default raw_logprobs, which NeMo-RL passes through unless vllm_cfg.logprobs_mode is set)."""
    for mode, name in (("processed", "parity"), ("raw", "raw_mode")):
        rng = np.random.default_rng(SEED)
        ss = samples(model, 12, t=0.7, k=8, seed=20)
        width = max(len(s.ids) for s in ss)
        pad = model.tok.pad_token_id
        rows = []
        for i, s in enumerate(ss):
            L = len(s.ids)
            gen = engine(s, mode, rng)
            prev = [0.0] + s.processed[1:]  # NeMo-RL prepends a 0 for the first token
            reward = s.reward
            batch = {  # NeMo-RL's logger keeps a leading batch dimension of 1 on every field
                "content": [[model.tok.decode(s.ids[: s.prompt_len]), model.tok.decode(s.ids[s.prompt_len:])]],
                "rewards": [reward], "input_lengths": [L],
                "token_ids": [s.ids + [pad] * (width - L)],
                "token_loss_mask": [[int(m) for m in s.sampled] + [0] * (width - L)],
                "sample_loss_mask": [1], "advantages": [[round(reward - 0.5, 4)] * width],
                "generation_logprobs": [r6(gen) + [0.0] * (width - L)],
                "prev_logprobs": [r6(prev) + [0.0] * (width - L)], "idx": i}
            rows.append(batch)
        # NeMo-RL's logger uses json.dumps defaults: -inf (a prompt token outside top-k) is written -Infinity
        write_jsonl(out / "nemo-rl" / name / "train_data_step1.jsonl", rows, allow_nan=True)


# --------------------------------------------------------------------------- slime


def _slime_sample(model: TinyModel, s: Sampled, i: int, rng) -> dict:
    gen = engine(s, "processed", rng)
    rlen = len(s.ids) - s.prompt_len
    return {  # Sample.to_dict(): status as its value, spec/prefix-cache info as dicts
        "group_index": i // 2, "index": i, "rollout_id": None,
        "prompt": model.tok.decode(s.ids[: s.prompt_len]), "tokens": s.ids, "multimodal_inputs": None,
        "multimodal_train_inputs": None, "multimodal_train_input_id": None, "apply_chat_template_kwargs": {},
        "response": model.tok.decode(s.ids[s.prompt_len:]), "response_length": rlen, "label": None,
        "reward": s.reward, "loss_mask": [int(m) for m in s.sampled[s.prompt_len:]],
        "weight_versions": ["5"] * len(s.turns), "rollout_log_probs": r6(gen[s.prompt_len:]),
        "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None, "rollout_routed_experts": None,
        "remove_sample": False, "teacher_log_probs": None,
        "status": "completed" if s.finished else "truncated", "metadata": {}, "generate_function_path": None,
        "custom_rm_path": None, "train_metadata": None, "session_id": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": rlen},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": s.prompt_len}}


def slime(model: TinyModel, out: Path) -> None:
    """rollout_data/2.pt (rollout side) and train_data/2.pt (format_version 2, adds log_probs at
    --rollout-temperature 0.7), plus a file that needs pickle."""
    import torch

    rng = np.random.default_rng(SEED)
    ss = samples(model, 8, t=0.7, seed=30, multi_turn=1)
    rollout = [_slime_sample(model, s, i, rng) for i, s in enumerate(ss)]
    d = out / "slime"
    (d / "rollout_data").mkdir(parents=True, exist_ok=True)
    (d / "train_data").mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": 2, "samples": rollout}, d / "rollout_data" / "2.pt")
    train = []
    for i, (s, r) in enumerate(zip(ss, rollout)):
        rlen = r["response_length"]
        train.append({
            "data_parallel_rank": 0, "rollout_position": i, "sample_index": i,
            "tokens": torch.tensor(s.ids), "response_lengths": rlen, "rewards": r["reward"],
            "truncated": int(r["status"] == "truncated"), "rollout_ids": i,
            "loss_masks": torch.tensor(r["loss_mask"], dtype=torch.int32),
            "rollout_log_probs": torch.tensor(r["rollout_log_probs"], dtype=torch.float32),
            "log_probs": torch.tensor(s.tempered[s.prompt_len:], dtype=torch.float32),
            "advantages": torch.full((rlen,), r["reward"] - 0.5), "total_lengths": len(s.ids)})
    torch.save({"format_version": 2, "rollout_id": 2, "rank": 0, "samples": train,
                "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": list(range(len(train))),
                               "partition": list(range(len(train)))}],
                "raw_reward": [r["reward"] for r in rollout]}, d / "train_data" / "2.pt")
    # what an older script would write: Sample objects, not dicts -> needs pickle, refused
    bad = [types.SimpleNamespace(**r) for r in rollout[:2]]
    torch.save({"rollout_id": 9, "samples": bad}, d / "needs_pickle.pt")


# --------------------------------------------------------------------------- PipelineRL


def pipelinerl(model: TinyModel, out: Path) -> None:
    """streams/actor/0/0/0.jsonl, T=0.7 top-k 8, groups of 2: parity and raw-mode."""
    for mode, name in (("processed", "parity"), ("raw", "raw_mode")):
        rng = np.random.default_rng(SEED)
        ss = samples(model, 16, t=0.7, k=8, seed=40)
        lines = []
        for g in range(0, len(ss), 2):
            group = []
            for j, s in enumerate(ss[g: g + 2]):
                gen = engine(s, mode, rng)
                P = s.prompt_len
                text = model.tok.decode(s.ids[1:])  # PipelineRL strips the BOS from the text
                out_text = model.tok.decode(s.ids[P:])
                group.append({
                    "text": text, "n_predicted": len(out_text), "reward": s.reward,
                    "logprobs": r6(gen[P:]), "ref_logprobs": [], "input_ids": s.ids,
                    "labels": [-100] * P + s.ids[P:], "group_id": f"actor_{g // 2}", "finished": s.finished,
                    "prompt_tokens": P, "output_tokens": len(s.ids) - P, "visual_features": None,
                    "metadata": {"model_version": g // 4, "rollout_index": j, "step_index": 0}})
            lines.append(group)
        write_jsonl(out / "pipelinerl" / name / "streams" / "actor" / "0" / "0" / "0.jsonl", lines)


# --------------------------------------------------------------------------- generic


def generic(model: TinyModel, out: Path) -> None:
    """verl/step_5.npz: verl's batch arrays as they are (left-padded prompts, right-padded
    responses, response-shaped masks and logprobs), T=0.7, verl's defaults top_k=-1, top_p=1.
    custom/rows.jsonl and rows.parquet: a custom loop at T=1 without top-k/top-p (the two
    readings coincide), prompt_length + response-length arrays, one multi-turn row."""
    rng = np.random.default_rng(SEED)
    ss = samples(model, 8, t=0.7, seed=50)
    P = max(s.prompt_len for s in ss)
    R = max(len(s.ids) - s.prompt_len for s in ss)
    pad = model.tok.pad_token_id
    n = len(ss)
    input_ids = np.full((n, P + R), pad, dtype=np.int64)
    attention = np.zeros((n, P + R), dtype=np.int64)
    response_mask = np.zeros((n, R), dtype=np.int64)
    rollout = np.zeros((n, R), dtype=np.float32)
    old = np.zeros((n, R), dtype=np.float32)
    for i, s in enumerate(ss):
        p, r = s.prompt_len, len(s.ids) - s.prompt_len
        gen = engine(s, "processed", rng)
        input_ids[i, P - p: P] = s.ids[:p]
        input_ids[i, P: P + r] = s.ids[p:]
        attention[i, P - p: P + r] = 1
        response_mask[i, :r] = 1
        rollout[i, :r] = gen[p:]
        old[i, :r] = s.tempered[p:]
    d = out / "generic" / "verl"
    d.mkdir(parents=True, exist_ok=True)
    np.savez(d / "step_5.npz", input_ids=input_ids, attention_mask=attention, response_mask=response_mask,
             rollout_log_probs=rollout, old_log_probs=old, temperature=0.7, top_k=-1, top_p=1.0)

    rng = np.random.default_rng(SEED + 1)
    ss = samples(model, 8, t=1.0, seed=60, multi_turn=1)
    rows = []
    for i, s in enumerate(ss):
        gen = engine(s, "processed", rng)
        row = {"input_ids": s.ids, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "policy_version": 7,
               "reward": s.reward, "finish_reason": "stop" if s.finished else "length",
               "prompt_index": i // 2, "sample_index": i % 2}
        if len(s.turns) > 1:  # multi-turn: a full-length response_mask marks the assistant tokens
            row.update(response_mask=[int(m) for m in s.sampled], rollout_log_probs=r6(gen),
                       old_log_probs=r6(s.tempered))
        else:
            row.update(prompt_length=s.prompt_len, rollout_log_probs=r6(gen[s.prompt_len:]),
                       old_log_probs=r6(s.tempered[s.prompt_len:]))
        rows.append(row)
    d = out / "generic" / "custom"
    write_jsonl(d / "rows.jsonl", rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the same rows as Parquet (missing columns are null)
    keys = sorted({k for r in rows for k in r})
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), d / "rows.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "io"))
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    model = TinyModel()
    for build in (prime_rl, nemo_rl, slime, pipelinerl, generic):
        build(model, out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    print(f"wrote {len(files)} files under {out} ({sum(p.stat().st_size for p in files) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
