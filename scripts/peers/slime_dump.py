# Minimal functions copied from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515
# (2026-08-21), licensed under the Apache License 2.0
# (https://github.com/THUDM/slime/blob/main/LICENSE). Used only by scripts/make_io_fixtures.py to
# write test fixtures with slime's own dump code:
# - Sample (fields, Status, SpecInfo, PrefixCacheInfo, to_dict, from_dict, get_reward_value,
#   effective_response_length): slime/utils/types.py
# - _cpu_tensor, tensorize_rollout_data_for_training, save_debug_rollout_data:
#   slime/observability/rollout_data_utils.py
# - _is_per_sample, _build_dump_payload (and its constants): slime/observability/train_data_utils.py
# - RolloutManager._post_process_rewards / _convert_samples_to_train_data (as functions of args)
#   and the per-rank key loop of _split_train_data_by_dp (as split_train_data_by_dp, given the
#   partitions instead of build_dp_schedule's): slime/ray/rollout.py
# - the end of save_debug_train_data (as write_debug_train_data): slime/observability/train_data_utils.py
# - get_source: slime/utils/data.py
import logging
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """The sample generated"""

    group_index: int | None = None
    index: int | None = None
    # Id of the rollout this sample came from. Defaults to ``None`` and the
    # downstream pipeline falls back to ``index`` (so the default rollout
    # path, where one execution = one training sample, sees rollout_id ==
    # index). Compact / subagent paths that split one rollout execution into
    # multiple training samples should set the same ``rollout_id`` on every
    # sibling, so loss aggregation averages within the rollout instead of
    # over-counting it.
    rollout_id: int | None = None
    # prompt
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None  # raw multimodal data, e.g. images, videos, etc.
    multimodal_train_inputs: dict[str, Any] | None = None  # processed multimodal data, e.g. pixel_values, etc.
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    # response
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # Log probabilities from rollout engine
    # Ragged top-p nucleus token ids replayed from rollout sampling. For response
    # token i, kept ids are rollout_top_p_token_ids[offsets[i]:offsets[i + 1]].
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None  # Routed experts from rollout engine
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None  # Log probabilities from teacher model for OPD

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        # Indicates a recoverable or non-critical failure during generation (e.g., tool call failure,
        # external API error, parsing error). Unlike ABORTED, FAILED samples may still contain partial
        # valid output and can be retried or handled gracefully.
        FAILED = "failed"

    status: Status = Status.PENDING

    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    # metadata used during training, e.g., what loss to use for this sample.
    train_metadata: dict | None = None

    # Session ID for consistent hashing routing (used when router policy is consistent_hashing)
    session_id: str | None = None

    non_generation_time: float = 0.0  # time spent in non-generation steps

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

        def add(self, meta_info: dict):
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self):
            return {
                "spec_accept_token_num": self.spec_accept_token_num,
                "spec_draft_token_num": self.spec_draft_token_num,
                "spec_verify_ct": self.spec_verify_ct,
                "completion_token_num": self.completion_token_num,
            }

        @staticmethod
        def from_dict(data: dict):
            info = Sample.SpecInfo()
            info.spec_accept_token_num = data.get("spec_accept_token_num", 0)
            info.spec_draft_token_num = data.get("spec_draft_token_num", 0)
            info.spec_verify_ct = data.get("spec_verify_ct", 0)
            info.completion_token_num = data.get("completion_token_num", 0)
            return info

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

        def add(self, meta_info: dict):
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            # new_tokens = input_tokens - cached_tokens
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self):
            return {
                "cached_tokens": self.cached_tokens,
                "total_prompt_tokens": self.total_prompt_tokens,
            }

        @staticmethod
        def from_dict(data: dict):
            info = Sample.PrefixCacheInfo()
            info.cached_tokens = data.get("cached_tokens", 0)
            info.total_prompt_tokens = data.get("total_prompt_tokens", 0)
            return info

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self):
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict):
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))

        field_names = set(Sample.__dataclass_fields__.keys())
        init_data = {k: v for k, v in data.items() if k in field_names}
        sample = Sample(**init_data)

        for key, value in data.items():
            if key not in field_names:
                setattr(sample, key, value)

        return sample

    def get_reward_value(self, args) -> float:
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    @property
    def effective_response_length(self):
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length



_ROLLOUT_DATA_TENSOR_DTYPES = {
    "tokens": torch.long,
    "loss_masks": torch.int,
    "rollout_log_probs": torch.float32,
    "rollout_top_p_token_ids": torch.int32,
    "rollout_top_p_token_offsets": torch.int32,
    "teacher_log_probs": torch.float32,
    "rollout_routed_experts": None,
}


def _cpu_tensor(value, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()
    tensor = torch.as_tensor(value, dtype=dtype) if dtype is not None else torch.as_tensor(value)
    return tensor.detach().cpu().contiguous()


def tensorize_rollout_data_for_training(rollout_data: dict[str, Any]) -> None:
    for key, dtype in _ROLLOUT_DATA_TENSOR_DTYPES.items():
        if key in rollout_data:
            rollout_data[key] = [_cpu_tensor(value, dtype=dtype) for value in rollout_data[key]]

    if "multimodal_train_inputs" in rollout_data:
        rollout_data["multimodal_train_inputs"] = [
            (
                {
                    key: _cpu_tensor(value) if isinstance(value, (np.ndarray, torch.Tensor)) else value
                    for key, value in mm_dict.items()
                }
                if mm_dict is not None
                else None
            )
            for mm_dict in rollout_data["multimodal_train_inputs"]
        ]

    if "rollout_mask_sums" in rollout_data:
        rollout_data["rollout_mask_sums"] = _cpu_tensor(
            rollout_data["rollout_mask_sums"],
            dtype=torch.float32,
        )

def save_debug_rollout_data(path_template, data, *, rollout_id: int, evaluation: bool) -> None:
    if path_template is None:
        return

    path = Path(path_template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))
    logger.info(f"Save debug rollout data to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)

    if evaluation:
        samples = [sample.to_dict() for info in data.values() for sample in info["samples"]]
    else:
        samples = [sample.to_dict() for sample in data]

    torch.save({"rollout_id": rollout_id, "samples": samples}, path)


# Per-rank scheduling arrangement (not per-sample); stored under `dp_shards` so
# the flat `samples` view can stay aligned with the rollout debug dump.
_LAYOUT_FIELDS = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")
# Whole-batch fields that are identical on every DP shard; stored once at the top.
_WHOLE_BATCH_FIELDS = ("raw_reward",)


def _is_per_sample(value, num_samples: int) -> bool:
    if torch.is_tensor(value):
        return value.dim() >= 1 and value.size(0) == num_samples
    if isinstance(value, (list, tuple)):
        return len(value) == num_samples
    return False


def _build_dump_payload(dp_shards, *, rollout_id, writer_rank):
    """Turn the gathered per-rank shards into a rollout-dump-aligned payload.

    Mirrors the rollout debug dump: a ``samples`` list (one dict per training
    sample, sorted so it lines up with the rollout dump's ``samples``), plus a
    parallel ``dp_shards`` key that keeps the DP/mbs layout (``sample_indices``,
    ``partition`` + ``micro_batch_indices`` / ``num_microbatches`` /
    ``global_batch_sizes``) without duplicating any per-sample tensor.

    Ordering key preference: ``partition`` (each sample's index in the rollout
    debug dump, always available when dumping) restores exact rollout order
    regardless of ``sample.index``; ``sample_indices`` (``sample.index``, may be
    ``None``) is the fallback; failing both, DP-gather order is kept.
    """
    samples = []
    layout = []
    whole_batch = {}
    # Per-sample id columns handled specially: pulled out of the generic
    # transpose and surfaced as scalar keys on each sample dict.
    id_columns = {"sample_indices": "sample_index", "partition": "rollout_position"}
    for shard in dp_shards:
        rollout_data = shard["rollout_data"]
        dp_rank = shard["data_parallel_rank"]
        num_local = len(rollout_data["response_lengths"])

        shard_layout = {"rank": shard["rank"], "data_parallel_rank": dp_rank}
        for column in id_columns:
            value = rollout_data.get(column)
            shard_layout[column] = list(value) if value is not None else None
        per_sample_columns = {}
        for key, value in rollout_data.items():
            if key in id_columns:
                continue
            if key in _WHOLE_BATCH_FIELDS:
                whole_batch.setdefault(key, value)
            elif key in _LAYOUT_FIELDS or not _is_per_sample(value, num_local):
                # Scheduling / non-per-sample fields stay in the layout so the
                # flat sample view holds only what pairs with a single sample.
                shard_layout[key] = value
            else:
                per_sample_columns[key] = value

        for i in range(num_local):
            sample = {"data_parallel_rank": dp_rank}
            for column, scalar_key in id_columns.items():
                values = rollout_data.get(column)
                if values is not None:
                    sample[scalar_key] = values[i]
            for key, column in per_sample_columns.items():
                sample[key] = column[i]
            samples.append(sample)
        layout.append(shard_layout)

    order_key = next(
        (
            scalar_key
            for scalar_key in ("rollout_position", "sample_index")
            if samples and all(sample.get(scalar_key) is not None for sample in samples)
        ),
        None,
    )
    if order_key is not None:
        samples.sort(key=lambda sample: sample[order_key])
    else:
        logger.warning(
            "Cannot restore global sample order for the train debug dump: samples carry neither "
            "partition nor sample_index. Saving samples in DP-gather order instead."
        )

    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": writer_rank,
        "samples": samples,
        "dp_shards": layout,
        **whole_batch,
    }


def write_debug_train_data(path_template, dp_shards, *, rollout_id, rank):
    # the end of save_debug_train_data (after the DP gather onto the writer rank)
    dp_size = len(dp_shards)
    path = Path(path_template.format(rollout_id=rollout_id, rank=rank))
    logger.info(f"Save debug train data from {dp_size} DP shard(s) to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(_build_dump_payload(dp_shards, rollout_id=rollout_id, writer_rank=rank), path)


def get_source(sample: Sample) -> str:
    # slime/utils/data.py
    metadata = getattr(sample, "metadata", None) or {}
    if getattr(sample, "source", None):
        return sample.source
    if metadata.get("source_name"):
        return metadata["source_name"]
    return "unknown"


def post_process_rewards(args, samples: list[Sample] | list[list[Sample]]):
    if getattr(args, "custom_reward_post_process_func", None) is not None:
        return args.custom_reward_post_process_func(args, samples)

    raw_rewards = [sample.get_reward_value(args) for sample in samples]
    if (
        args.advantage_estimator in ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"]
        and args.rewards_normalization
    ):
        # group norm
        rewards = torch.tensor(raw_rewards, dtype=torch.float)
        if rewards.shape[-1] == args.n_samples_per_prompt * args.rollout_batch_size:
            rewards = rewards.reshape(-1, args.n_samples_per_prompt)
        else:
            # when samples count are not equal in each group
            rewards = rewards.view(-1, rewards.shape[-1])
        mean = rewards.mean(dim=-1, keepdim=True)
        rewards = rewards - mean

        if args.advantage_estimator in ["grpo", "gspo", "cispo"] and args.grpo_std_normalization:
            std = rewards.std(dim=-1, keepdim=True)
            rewards = rewards / (std + 1e-6)

        return raw_rewards, rewards.flatten().tolist()

    return raw_rewards, raw_rewards


def convert_samples_to_train_data(args, samples: list[Sample] | list[list[Sample]]):
    """
    Convert inference generated samples to training data.
    """
    if getattr(args, "custom_convert_samples_to_train_data_func", None) is not None:
        return args.custom_convert_samples_to_train_data_func(args, samples)

    raw_rewards, rewards = post_process_rewards(args, samples)

    assert len(raw_rewards) == len(samples)
    assert len(rewards) == len(samples)

    rollout_ids = [sample.rollout_id for sample in samples]
    existed_rollout_id_values = set(rid for rid in rollout_ids if rid is not None)
    tmp_id = 0
    for i in range(len(rollout_ids)):
        if rollout_ids[i] is None:
            while tmp_id in existed_rollout_id_values:
                tmp_id += 1
            rollout_ids[i] = tmp_id
            existed_rollout_id_values.add(tmp_id)

    train_data = {
        "tokens": [sample.tokens for sample in samples],
        "response_lengths": [sample.response_length for sample in samples],
        # some reward model, e.g. remote rm, may return multiple rewards,
        # we could use key to select the reward.
        "rewards": rewards,
        "raw_reward": raw_rewards,
        "truncated": [1 if sample.status == Sample.Status.TRUNCATED else 0 for sample in samples],
        "sample_indices": [sample.index for sample in samples],
        "rollout_ids": rollout_ids,
    }

    # loss mask
    # TODO: compress the loss mask
    loss_masks = []
    for sample in samples:
        # always instantiate loss_mask if not provided
        if sample.loss_mask is None:
            sample.loss_mask = [1] * sample.response_length

        assert (
            len(sample.loss_mask) == sample.response_length
        ), f"loss mask length {len(sample.loss_mask)} != response length {sample.response_length}"
        if sample.remove_sample:
            sample.loss_mask = [0] * sample.response_length
        loss_masks.append(sample.loss_mask)
    train_data["loss_masks"] = loss_masks

    # Per-rollout aggregate, precomputed at the step level (where we can
    # see every sample of every rollout) and broadcast per-sample so the
    # per-mb loss reducer uses the correct whole-rollout denominator even
    # when a rollout's samples land in different micro-batches (first-fit
    # packing can split a rollout across mbs):
    #
    #   ``rollout_mask_sums[i]`` — sum of loss-mask totals over every
    #   sample in sample i's rollout. Used as the reducer's denominator
    #   so summing partial contributions across mbs yields one
    #   token-weighted mean per rollout.
    rollout_id_list = train_data["rollout_ids"]
    mask_sums_per_sample = [sum(m) for m in loss_masks]
    rollout_total_mask: dict[int, int] = {}
    for rid, ms in zip(rollout_id_list, mask_sums_per_sample, strict=True):
        rollout_total_mask[rid] = rollout_total_mask.get(rid, 0) + ms
    train_data["rollout_mask_sums"] = [rollout_total_mask[rid] for rid in rollout_id_list]

    # Overwrite raw_reward when available. Mixed-source batches may only
    # populate this field for a subset of samples (e.g. SWE but not code).
    if any(sample.metadata and "raw_reward" in sample.metadata for sample in samples):
        train_data["raw_reward"] = [
            sample.metadata["raw_reward"] if sample.metadata and "raw_reward" in sample.metadata else sample.reward
            for sample in samples
        ]

    # For rollout buffer
    if samples[0].metadata and "round_number" in samples[0].metadata:
        train_data["round_number"] = [sample.metadata["round_number"] for sample in samples]

    # Add rollout log probabilities for off-policy correction
    if samples[0].rollout_log_probs is not None:
        train_data["rollout_log_probs"] = [sample.rollout_log_probs for sample in samples]

    if getattr(args, "rollout_top_p", 1.0) != 1.0:
        for sample in samples:
            assert sample.rollout_top_p_token_ids is not None
            assert sample.rollout_top_p_token_offsets is not None
            assert len(sample.rollout_top_p_token_offsets) == sample.response_length + 1, (
                f"top-p token offsets length {len(sample.rollout_top_p_token_offsets)} "
                f"!= response length + 1 {sample.response_length + 1}"
            )
            offset_end = int(sample.rollout_top_p_token_offsets[-1])
            assert offset_end == len(sample.rollout_top_p_token_ids), (
                f"top-p token offsets[-1] {offset_end} "
                f"!= token ids length {len(sample.rollout_top_p_token_ids)}"
            )
        train_data["rollout_top_p_token_ids"] = [sample.rollout_top_p_token_ids for sample in samples]
        train_data["rollout_top_p_token_offsets"] = [sample.rollout_top_p_token_offsets for sample in samples]

    if samples[0].rollout_routed_experts is not None:
        routed_experts = [torch.as_tensor(sample.rollout_routed_experts) for sample in samples]
        if getattr(args, "use_rollout_routing_replay", False):
            validate_rollout_routed_experts_for_replay(routed_experts, args)
        train_data["rollout_routed_experts"] = routed_experts

    if samples[0].train_metadata is not None:
        train_data["metadata"] = [sample.train_metadata for sample in samples]

    if any(sample.multimodal_train_inputs is not None for sample in samples):
        train_data["multimodal_train_inputs"] = [sample.multimodal_train_inputs for sample in samples]

    if samples[0].teacher_log_probs is not None:
        train_data["teacher_log_probs"] = [sample.teacher_log_probs for sample in samples]

    if samples[0].metadata is not None:
        train_data["source_names"] = [get_source(sample) for sample in samples]

    return train_data


def split_train_data_by_dp(data, partitions):
    # RolloutManager._split_train_data_by_dp from "# Package per-rank rollout_data": the partitions are
    # given (build_dp_schedule's micro-batch layout is not needed for the dump) and kept in memory (no Ray)
    dp_size = len(partitions)
    total_lengths = [len(t) for t in data["tokens"]]
    data["total_lengths"] = total_lengths
    global_batch_sizes, num_microbatches = [len(total_lengths)], [1]
    micro_batch_indices = [[list(range(len(p)))] for p in partitions]
    # Package per-rank rollout_data
    rollout_data_refs = []
    for r in range(dp_size):
        partition = partitions[r]
        rollout_data = {"partition": partition}
        for key in [
            "tokens",
            "multimodal_train_inputs",
            "response_lengths",
            "rewards",
            "truncated",
            "loss_masks",
            "round_number",
            "sample_indices",
            "rollout_ids",
            "rollout_mask_sums",
            "rollout_log_probs",
            "rollout_top_p_token_ids",
            "rollout_top_p_token_offsets",
            "rollout_routed_experts",
            "source_names",
            "prompt",
            "teacher_log_probs",
        ]:
            if key not in data:
                continue
            rollout_data[key] = [data[key][j] for j in partition]
        # keys that need to be splited at train side
        for key in ["raw_reward", "total_lengths"]:
            if key not in data:
                continue
            rollout_data[key] = data[key]
        rollout_data["global_batch_sizes"] = global_batch_sizes
        rollout_data["num_microbatches"] = num_microbatches
        rollout_data["micro_batch_indices"] = micro_batch_indices[r]
        tensorize_rollout_data_for_training(rollout_data)
        rollout_data_refs.append(rollout_data)
    return rollout_data_refs
