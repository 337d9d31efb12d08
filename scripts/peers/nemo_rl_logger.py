# Copyright (c) 2025, NVIDIA CORPORATION.  All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Minimal functions copied from NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909
# (2026-08-22), licensed under the Apache License 2.0 (header above). Used only by
# scripts/make_io_fixtures.py to write test fixtures with NeMo-RL's own logger:
# - BatchedDataDict.slice / make_microbatch_iterator / size: nemo_rl/distributed/batched_data_dict.py
#   (the PackedTensor branch of slice dropped: the logged fields are lists)
# - Logger.log_batched_dict_as_jsonl and get_next_experiment_dir: nemo_rl/utils/logger.py
# - _should_log_nemo_gym_responses, compute_and_apply_seq_logprob_error_masking and the "Log training data" block of grpo_train
#   (as log_grpo_train_data): nemo_rl/algorithms/grpo.py
# - the "Log training data" block of distillation_train (as log_distillation_train_data):
#   nemo_rl/algorithms/distillation.py
from __future__ import annotations

import glob
import json
import os
import re
from collections import UserDict
from typing import Any, Iterator, Optional

import numpy as np
import torch


class BatchedDataDict(UserDict):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

        self.micro_batch_indices = None
        self.micro_batch_lengths = None
        self.elem_counts_per_gb = None

    def slice(self, start: int, end: int) -> "SlicedDataDict":
        """Slices the batch from start to end.

        Args:
            start: Starting index (inclusive)
            end: Ending index (exclusive)

        Returns:
            BatchedDataDict: A new BatchedDataDict containing the sliced data
        """
        sliced_batch = SlicedDataDict()
        for k in self.data:
            if isinstance(self.data[k], torch.Tensor):
                assert end <= self.data[k].shape[0], (
                    f"end: {end} is greater than the shape of the tensor: {self.data[k].shape[0]} for key: {k}"
                )
            sliced_batch[k] = self.data[k][start:end]
        return sliced_batch

    def make_microbatch_iterator(
        self, microbatch_size: int
    ) -> Iterator["SlicedDataDict"]:
        """Make an iterator over the batch that yields microbatches of size microbatch_size."""
        bsize = self.size
        assert bsize % microbatch_size == 0, (
            f"Data dict size ({bsize}) is not a multiple of the provided microbatch size ({microbatch_size})"
        )
        for i in range(0, bsize, microbatch_size):
            yield self.slice(i, i + microbatch_size)

    @property
    def size(self) -> int:
        """Get the batch size of the batch."""
        # Get the first key and use its size as the batch size
        # This assumes all keys have the same batch size
        if not self.data:
            return 0
        key = next(iter(self.data))
        if not torch.is_tensor(self.data[key]):
            return len(self.data[key])
        return self.data[key].shape[0]  # type: ignore # it's a tensor here


class SlicedDataDict(BatchedDataDict):
    pass


class Logger:
    def __init__(self, base_log_dir: str):
        self.base_log_dir = base_log_dir
        os.makedirs(self.base_log_dir, exist_ok=True)

    def log_batched_dict_as_jsonl(
        self, to_log: BatchedDataDict[Any] | dict[str, Any], filename: str
    ) -> None:
        """Log a list of dictionaries to a JSONL file.

        Args:
            to_log: BatchedDataDict to log
            filename: Filename to log to (within the log directory)
        """
        if not isinstance(to_log, BatchedDataDict):
            to_log = BatchedDataDict(to_log)

        # Create full path within log directory
        filepath = os.path.join(self.base_log_dir, filename)
        os.makedirs(os.path.dirname(filepath), exist_ok=True)

        # Write to JSONL file
        with open(filepath, "w") as f:
            for i, sample in enumerate(to_log.make_microbatch_iterator(1)):
                for key, value in sample.items():
                    if isinstance(value, torch.Tensor):
                        sample[key] = value.tolist()
                    elif isinstance(value, np.ndarray):
                        sample[key] = value.tolist()
                # default=str is a fallback for non-JSON-serializable types (e.g., datetime, custom objects)
                f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")

        print(f"Logged data to {filepath}")


def get_next_experiment_dir(base_log_dir: str) -> str:
    """Create a new experiment directory with an incremented ID.

    Args:
        base_log_dir (str): The base log directory path

    Returns:
        str: Path to the new experiment directory with incremented ID
    """
    # Check if the log directory already contains an experiment ID pattern (e.g., /exp_001/)
    pattern = re.compile(r"exp_(\d+)")
    next_exp_id = 1

    # Check for existing experiment directories
    existing_dirs = glob.glob(os.path.join(base_log_dir, "exp_*"))

    if existing_dirs:
        # Extract experiment IDs and find the maximum
        exp_ids = []
        for dir_path in existing_dirs:
            match = pattern.search(dir_path)
            if match:
                exp_ids.append(int(match.group(1)))

        if exp_ids:
            # Increment the highest experiment ID
            next_exp_id = max(exp_ids) + 1

    # Format the new log directory with the incremented experiment ID
    new_log_dir = os.path.join(base_log_dir, f"exp_{next_exp_id:03d}")

    # Create the new log directory
    os.makedirs(new_log_dir, exist_ok=True)

    return new_log_dir


def compute_and_apply_seq_logprob_error_masking(
    train_data: BatchedDataDict,
    rewards: torch.Tensor,
    seq_logprob_error_threshold: Optional[float],
) -> dict:
    """Compute sequence-level logprob error metrics and optionally mask high-error sequences.

    This function computes the multiplicative probability error per sequence
    (same calculation as token_mult_prob_error but aggregated per-sequence) and
    optionally masks sequences that exceed the configured threshold.

    Args:
        train_data: Training data dict containing token_mask, sample_mask,
                   prev_logprobs, and generation_logprobs. If masking is applied,
                   sample_mask will be updated in-place.
        rewards: Reward tensor for computing statistics on masked sequences.
        seq_logprob_error_threshold: If set, mask sequences with mult_prob_error
                                    exceeding this threshold. If None, only compute metrics.

    Returns:
        Dict with keys: max_seq_mult_prob_error, mean_seq_mult_prob_error,
        min_seq_mult_prob_error, max/mean/min_seq_mult_prob_error_after_mask,
        num_masked_seqs, masked_correct_pct
    """
    # Compute sequence-level logprob error metrics (always)
    token_mask = train_data["token_mask"][:, 1:]
    sample_mask = train_data["sample_mask"]
    prev_logprobs = train_data["prev_logprobs"][:, 1:]
    generation_logprobs = train_data["generation_logprobs"][:, 1:]
    lp_error = torch.abs(generation_logprobs - prev_logprobs)

    # Use combined mask exactly as in loss function
    mask = token_mask * sample_mask.unsqueeze(-1)

    # Calculate sequence-level multiplicative prob error.
    #
    # NOTE: When a sequence is fully masked (mask.sum == 0), it should not contribute to
    # min/mean/max statistics; otherwise, it would yield a spurious 0 due to denominator
    # clamping and incorrectly drag min_seq_mult_prob_error to 0.
    denom = mask.sum(dim=-1)
    valid_seq_mask = denom > 0

    # EXACT same calculation as token_mult_prob_error but per-sequence (for valid sequences)
    seq_mult_prob_error = torch.zeros_like(denom, dtype=lp_error.dtype)
    if valid_seq_mask.any():
        num = (torch.exp(lp_error * mask) * mask).sum(dim=-1)
        seq_mult_prob_error[valid_seq_mask] = num[valid_seq_mask] / denom[
            valid_seq_mask
        ].clamp(min=1)

        valid_errors = seq_mult_prob_error[valid_seq_mask]
        max_seq_mult_prob_error = valid_errors.max().item()
        mean_seq_mult_prob_error = valid_errors.mean().item()
        min_seq_mult_prob_error = valid_errors.min().item()
    else:
        max_seq_mult_prob_error = 0.0
        mean_seq_mult_prob_error = 0.0
        min_seq_mult_prob_error = 0.0

    # Apply sequence-level masking if configured
    num_masked_seqs = 0
    masked_correct_pct = 0.0

    # After-mask metrics (same as before if no threshold)
    max_seq_mult_prob_error_after_mask = max_seq_mult_prob_error
    mean_seq_mult_prob_error_after_mask = mean_seq_mult_prob_error
    min_seq_mult_prob_error_after_mask = min_seq_mult_prob_error

    if seq_logprob_error_threshold is not None:
        print(
            f"▶ Applying sequence-level logprob error masking (threshold={seq_logprob_error_threshold})...",
            flush=True,
        )

        original_sample_mask = sample_mask.clone()

        # Create mask for sequences below threshold
        seq_error_mask = (
            seq_mult_prob_error <= seq_logprob_error_threshold
        ).float() * original_sample_mask

        diff_mask = original_sample_mask - seq_error_mask
        num_masked_seqs = int(diff_mask.sum().item())

        if num_masked_seqs > 0:
            diff_mask_bool = diff_mask.bool()
            masked_correct_count = int(
                (rewards.view(-1)[diff_mask_bool] == 1).sum().item()
            )
            masked_correct_pct = masked_correct_count / num_masked_seqs

        # Compute after-mask metrics (only for sequences that passed the threshold)
        kept_mask = seq_error_mask.bool() & valid_seq_mask
        if kept_mask.sum() > 0:
            kept_errors = seq_mult_prob_error[kept_mask]
            max_seq_mult_prob_error_after_mask = kept_errors.max().item()
            mean_seq_mult_prob_error_after_mask = kept_errors.mean().item()
            min_seq_mult_prob_error_after_mask = kept_errors.min().item()
        else:
            # All sequences were masked
            max_seq_mult_prob_error_after_mask = 0.0
            mean_seq_mult_prob_error_after_mask = 0.0
            min_seq_mult_prob_error_after_mask = 0.0

        # Update sample_mask in train_data
        train_data["sample_mask"] = seq_error_mask

        print(
            f"  Masked {num_masked_seqs} sequences with mult_prob_error > {seq_logprob_error_threshold}",
            flush=True,
        )
        if num_masked_seqs > 0:
            print(
                f"  • {masked_correct_count}/{num_masked_seqs} masked sequences were correct (reward=1)"
                f" → {masked_correct_pct:.2%}",
                flush=True,
            )

    return {
        "max_seq_mult_prob_error": max_seq_mult_prob_error,
        "mean_seq_mult_prob_error": mean_seq_mult_prob_error,
        "min_seq_mult_prob_error": min_seq_mult_prob_error,
        "max_seq_mult_prob_error_after_mask": max_seq_mult_prob_error_after_mask,
        "mean_seq_mult_prob_error_after_mask": mean_seq_mult_prob_error_after_mask,
        "min_seq_mult_prob_error_after_mask": min_seq_mult_prob_error_after_mask,
        "num_masked_seqs": num_masked_seqs,
        "masked_correct_pct": masked_correct_pct,
    }


def _should_log_nemo_gym_responses(master_config) -> bool:
    """Whether NeMo Gym is responsible for full response logging.

    When **True**, skip the expensive per-step ``train_data_step*.jsonl`` dump.
    When **False** (the default if unset), write the local JSONL file.

    W&B full-result Tables are controlled independently by
    ``logger.wandb.log_nemo_gym_full_result_tables``.
    """
    env_config = master_config.env
    should_log_nemo_gym_responses = bool(
        env_config.get("should_log_nemo_gym_responses")
    )

    return should_log_nemo_gym_responses


def log_grpo_train_data(logger, master_config, repeated_batch, flat_messages, rewards, input_lengths, train_data,
                        total_steps):
    # grpo.py, grpo_train, "# Log training data" (indentation and the enclosing loop removed)
    if not _should_log_nemo_gym_responses(master_config):
        log_data = {}
        if "agent_ref" in repeated_batch:
            log_data["agent_ref"] = repeated_batch["agent_ref"]
        log_data["content"] = flat_messages["content"]
        log_data["rewards"] = rewards.tolist()
        if master_config.grpo.use_dynamic_sampling:
            log_data["filtered_rewards"] = rewards.tolist()
            log_data["rewards"] = repeated_batch["total_reward"].tolist()
        log_data["input_lengths"] = input_lengths.tolist()
        log_data["token_ids"] = train_data["input_ids"].tolist()
        log_data["token_loss_mask"] = train_data["token_mask"].tolist()
        log_data["sample_loss_mask"] = train_data["sample_mask"].tolist()
        log_data["advantages"] = train_data["advantages"].tolist()
        log_data["generation_logprobs"] = train_data[
            "generation_logprobs"
        ].tolist()
        log_data["prev_logprobs"] = train_data["prev_logprobs"].tolist()

        logger.log_batched_dict_as_jsonl(
            log_data, f"train_data_step{total_steps + 1}.jsonl"
        )
        del log_data
    del flat_messages



def log_distillation_train_data(logger, flat_messages, input_lengths, total_steps):
    # distillation.py, distillation_train, "# Log training data"
    log_data = {"content": flat_messages["content"]}
    log_data["input_lengths"] = input_lengths.tolist()
    logger.log_batched_dict_as_jsonl(
        log_data, f"train_data_step{total_steps + 1}.jsonl"
    )
