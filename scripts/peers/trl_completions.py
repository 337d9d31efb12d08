# Copyright 2020-2026 The HuggingFace Team. All rights reserved.
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
# Minimal function copied from huggingface/trl at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8
# (2026-07-24), licensed under the Apache License 2.0 (header above): the completions Parquet of
# GRPOTrainer.log (trl/trainer/grpo_trainer.py, `if self.accelerator.is_main_process and
# self.log_completions:`), without the rich print and the wandb/trackio tables. Used only by
# scripts/make_io_fixtures.py; `self` is any object with state.global_step, args.output_dir, _logs.
import os

import pandas as pd


def write_completions(self):
    table = {
        "step": [self.state.global_step] * len(self._logs["prompt"]),
        "prompt": self._logs["prompt"],
        "completion": self._logs["completion"],
        **self._logs["rewards"],
        **self._logs["extra"],
        "advantage": self._logs["advantages"],
    }

    df_base = pd.DataFrame(table)
    df_base.to_parquet(
        os.path.join(
            self.args.output_dir,
            "completions",
            f"completions_{self.state.global_step:05d}.parquet",
        )
    )
