# Copyright 2024 Bytedance Ltd. and/or its affiliates
# Copyright 2023-2024 SGLang Team
# Copyright 2025 ModelBest Inc. and/or its affiliates
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
#
# Minimal functions copied from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7
# (2026-01-29), licensed under the Apache License 2.0 (header above): RayPPOTrainer._dump_generations
# and the decoding part of RayPPOTrainer._log_rollout_data (verl/trainer/ppo/ray_trainer.py), what
# `trainer.rollout_data_dir` writes. Used only by scripts/make_io_fixtures.py; `self` is any object
# with global_steps and tokenizer, `batch` any object with .batch (tensors) and .non_tensor_batch.
import json
import os


class RolloutDataDir:
    def __init__(self, tokenizer, global_steps):
        self.tokenizer = tokenizer
        self.global_steps = global_steps

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        """Dump rollout/validation samples as JSONL."""
        os.makedirs(dump_path, exist_ok=True)
        filename = os.path.join(dump_path, f"{self.global_steps}.jsonl")

        n = len(inputs)
        base_data = {
            "input": inputs,
            "output": outputs,
            "gts": gts,
            "score": scores,
            "step": [self.global_steps] * n,
        }

        for k, v in reward_extra_infos_dict.items():
            if len(v) == n:
                base_data[k] = v

        lines = []
        for i in range(n):
            entry = {k: v[i] for k, v in base_data.items()}
            lines.append(json.dumps(entry, ensure_ascii=False))

        with open(filename, "w") as f:
            f.write("\n".join(lines) + "\n")

        print(f"Dumped generations to {filename}")

    def _log_rollout_data(self, batch, reward_extra_infos_dict: dict, rollout_data_dir: str):
        # the body of _log_rollout_data without marked_timer; DataProto items replaced by
        # batch.non_tensor_batch["reward_model"] (what `item.non_tensor_batch` reads per sample)
        inputs = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        outputs = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = batch.batch["token_level_scores"].sum(-1).cpu().tolist()
        sample_gts = [rm.get("ground_truth", None) for rm in batch.non_tensor_batch["reward_model"]]

        reward_extra_infos_to_dump = reward_extra_infos_dict.copy()
        if "request_id" in batch.non_tensor_batch:
            reward_extra_infos_dict.setdefault(
                "request_id",
                batch.non_tensor_batch["request_id"].tolist(),
            )

        self._dump_generations(
            inputs=inputs,
            outputs=outputs,
            gts=sample_gts,
            scores=scores,
            reward_extra_infos_dict=reward_extra_infos_to_dump,
            dump_path=rollout_data_dir,
        )
