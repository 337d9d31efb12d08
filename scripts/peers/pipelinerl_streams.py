# Minimal functions copied from ServiceNow/PipelineRL at commit 58d393458625ad63ed539f2dcd072c85700c557f
# (2026-06-19), licensed under the Apache License 2.0
# (https://github.com/ServiceNow/PipelineRL/blob/main/LICENSE). Used only by
# scripts/make_io_fixtures.py to write test fixtures with PipelineRL's own stream writer:
# - TrainingText: pipelinerl/rollouts.py
# - MASKED_TOKEN_ID: pipelinerl/finetune/data.py
# - RetryableAbortedCompletionError, _to_plain_obj, make_training_text: pipelinerl/async_llm.py
#   (extract_images_from_messages and get_processor, for vision models, are stubbed below: the
#   fixtures are text only; omegaconf containers do not occur)
# - StreamWriter, SingleStreamSpec, stream_dir, stream_file, FileStreamWriter: pipelinerl/streams.py
# orjson is PipelineRL's own dependency: pip install orjson to run the fixture script.
from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Self

import numpy as np
import orjson
import torch
from pydantic import BaseModel, Field

logger = logging.getLogger(__name__)
MASKED_TOKEN_ID = -100


class DictConfig(dict):  # stub: omegaconf is not needed for plain kwargs
    pass


ListConfig = DictConfig


def extract_images_from_messages(messages):  # stub: text-only fixtures
    return []


def get_processor(model_name):  # stub: text-only fixtures
    raise NotImplementedError


class TrainingText(BaseModel):
    """
    Training text instance used to finetune a language model.

    Attributes:
        text (str): The full text of the training instance.
        n_predicted (int): The number of predicted tokens in the text.
        reward (float): The reward associated with the training instance. Defaults to 0.0.
        logprobs (List[float]): A list of log probabilities of the completion tokens from the assistant model.
        ref_logprobs (List[float]): A list of reference log probabilities of the completion tokens from the reference model.
        input_ids (List[int]): A list of token IDs representing the input text, including the prompt and the predicted tokens.
        labels (List[int]): A list of token IDs that are used as labels for training. The last n_predicted tokens are set to MASKED_TOKEN_ID.
        group_id (str, optional): ID of the group. It is used by the RL finetuning script to normalize rewards.
        finished (bool): Indicates whether the text is finished or not.
        prompt_tokens (int): The number of tokens in the prompt part of the text.
        output_tokens (int): The number of tokens in the output part of the text.
        visual_features (Optional[Dict[str, np.ndarray]]): Optional visual features for vision language models.
        metadata (dict): Additional metadata associated with the training text.
        prompt_text (str): Portion of the text that serves as the prompt (i.e., the text excluding the predicted tokens).
        output_text (str): Portion of the text that represents the predicted output (i.e., the last n_predicted tokens).
    """

    text: str
    n_predicted: int
    reward: float = 0.0
    logprobs: List[float] = Field(default_factory=list)
    ref_logprobs: List[float] = Field(default_factory=list)
    input_ids: List[int] = Field(default_factory=list)
    labels: List[int] = Field(default_factory=list)
    group_id: str | None = None
    finished: bool = False
    prompt_tokens: int = Field(default=0)
    output_tokens: int = Field(default=0)
    visual_features: Optional[Dict[str, np.ndarray]] = None  # For vision language models
    metadata: dict = Field(default_factory=dict)

    model_config = {"arbitrary_types_allowed": True}

    @property
    def prompt_text(self) -> str:
        return self.text[: -self.n_predicted]

    @property
    def output_text(self) -> str:
        return self.text[-self.n_predicted :]



class RetryableAbortedCompletionError(TimeoutError):
    """Abort-shaped completion that should be retried instead of treated as data."""


def _to_plain_obj(value):
    """convert OmegaConf containers into Python types"""

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {key: _to_plain_obj(val) for key, val in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain_obj(item) for item in value]
    return value


def make_training_text(llm: TrainableLLM, llm_call: LLMCall) -> TrainingText:
    finish_reason = llm_call.llm_info.get("finish_reason")
    if finish_reason == "abort":
        raise RetryableAbortedCompletionError(
            f"Aborted completion for prompt {llm_call.prompt.id} should be retried"
        )

    # Extract visual features if present
    images = []
    use_processor = False
    visual_features = None
    assistant_msg: dict = {"role": "assistant", "content": llm_call.output.content or ""}
    if llm_call.output.tool_calls:
        assistant_msg["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {
                    "name": tc.function.name,
                    "arguments": tc.function.arguments,
                },
            }
            for tc in llm_call.output.tool_calls
        ]
    full_messages = llm_call.prompt.messages + [assistant_msg]

    if hasattr(llm_call.prompt, "messages"):
        images = extract_images_from_messages(llm_call.prompt.messages)
        if images:
            use_processor = True

    if use_processor:
        # Use processor for vision-language models
        processor = get_processor(llm.model_name)

        try:
            # Apply chat template using processor for proper image token handling
            prompt_text = processor.apply_chat_template(
                llm_call.prompt.messages,
                tokenize=False,
                add_generation_prompt=True,
            )

            # Create full conversation with assistant response
            text = processor.apply_chat_template(
                full_messages,
                tokenize=False,
            )

            # Process prompt with images to get token IDs with image placeholders
            prompt_inputs = processor(
                text=processor.apply_chat_template(
                    llm_call.prompt.messages, tokenize=False, add_generation_prompt=True
                ),
                images=images,
                return_tensors=None,
            )

            # prompt_inputs["input_ids"] is a list of list
            prompt_token_ids = prompt_inputs["input_ids"][0]

            # Process images to get visual features
            processed = processor(
                text=[prompt_text], images=images, padding=True, return_tensors=None
            )
            visual_features = {
                key: value
                for key, value in processed.items()
                if isinstance(value, np.ndarray)
                and key not in ["input_ids", "attention_mask"]
            }

        except Exception as e:
            raise ValueError(f"Failed to process with vision-language processor: {e}")
    else:
        # Use tokenizer for text-only models
        chat_kwargs = _to_plain_obj(llm.chat_template_kwargs) if llm.chat_template_kwargs else {}
        if llm_call.prompt.tools:
            chat_kwargs = {**chat_kwargs, "tools": _to_plain_obj(llm_call.prompt.tools)}
        prompt_text = llm.tokenizer.apply_chat_template(
            conversation=llm_call.prompt.messages,
            tokenize=False,
            add_generation_prompt=True,
            **chat_kwargs,
        )
        text = llm.tokenizer.apply_chat_template(
            full_messages,
            tokenize=False,
            **chat_kwargs,
        )
        prompt_token_ids = llm.tokenizer.apply_chat_template(
            llm_call.prompt.messages,
            add_special_tokens=True,
            add_generation_prompt=True,
            **chat_kwargs,
        )

    output_text = text[len(prompt_text) :]

    tokenizer = processor.tokenizer if use_processor else llm.tokenizer

    if tokenizer.bos_token and text.startswith(tokenizer.bos_token):
        text = text[len(tokenizer.bos_token) :]

    if not llm_call.logprobs:
        raise ValueError("Logprobs are required to make training data for RL")

    # We add the exact token ids and logprobs to "training_text" to ensure inference/training consistency
    labels = [lp.token_id for lp in llm_call.logprobs]
    input_ids = prompt_token_ids + labels
    # Apply masking to input tokens that aren't generated
    labels = [MASKED_TOKEN_ID] * len(prompt_token_ids) + labels
    logprobs = [lp.logprob for lp in llm_call.logprobs]
    if finish_reason is not None:
        finished = finish_reason != "length"
    else:
        eos_token = tokenizer.eos_token or ""
        finished = bool(eos_token) and (llm_call.output.content or "").endswith(eos_token)
    prompt_tokens = llm_call.prompt_length_tokens
    output_tokens = llm_call.output_length_tokens

    return TrainingText(
        text=text,
        n_predicted=len(output_text),
        input_ids=input_ids,
        labels=labels,
        logprobs=logprobs,
        finished=finished,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        visual_features=visual_features,
    )



class StreamWriter(ABC):
    @abstractmethod
    def __enter__(self) -> Self:
        pass

    @abstractmethod
    def __exit__(self, exc_type, exc_value, traceback):
        pass

    @abstractmethod
    def write(self, data: Any, partition: int | None = None):
        pass


class SingleStreamSpec(BaseModel):
    exp_path: Path
    topic: str
    instance: int = 0
    partition: int = 0

    def __str__(self):
        return f"{self.topic}/{self.instance}/{self.partition}"


def stream_dir(exp_path: Path, topic: str, instance: int, partition: int) -> Path:
    return exp_path / "streams" / topic / str(instance) / str(partition)


def stream_file(stream_dir: Path, shard_id: int) -> Path:
    return stream_dir / f"{shard_id}.jsonl"


# File-based streaming


class FileStreamWriter(StreamWriter):
    def __init__(self, stream: SingleStreamSpec, mode: Literal["w", "a"] = "a"):
        self.stream = stream
        self.mode = mode

    def __enter__(self):
        # TODO: sharding
        _file_dir = stream_dir(self.stream.exp_path, self.stream.topic, self.stream.instance, self.stream.partition)
        os.makedirs(_file_dir, exist_ok=True)
        self._file_path = stream_file(_file_dir, 0)
        self._file = open(self._file_path, self.mode)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._file.close()

    def write(self, data, partition: int | None = None):
        if partition is not None:
            raise ValueError()
        # Textual streams are so useful, that we try hard to jsonify the given object.
        if isinstance(data, BaseModel):
            data_dict = data.model_dump()
            for key, value in data_dict.items():
                if isinstance(value, torch.Tensor):
                    data_dict[key] = value.numpy()
            data = data_dict
        self._file.write(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode("utf-8"))
        self._file.write("\n")
        self._file.flush()
