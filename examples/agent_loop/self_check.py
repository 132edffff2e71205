"""A custom agent loop for rollout.mode=async (verl's AgentLoopBase): the model answers, is asked to
check its answer, and answers again. Its follow-up turn is masked out of the loss; each answer gets
half the response budget.

Run with actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/agent_loop/agent_loops.yaml
and this directory on PYTHONPATH (TESSERA_AGENT_PYTHON names an interpreter with verl installed).
"""
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer


def token_ids(rendered) -> list[int]:
    """apply_chat_template(tokenize=True)'s ids: transformers 4 returns them, 5 a BatchEncoding."""
    return list(rendered["input_ids"]) if hasattr(rendered, "keys") else list(rendered)


class SelfCheckAgentLoop(AgentLoopBase):
    def __init__(self, *args, follow_up: str = "Check your answer, then give the final one.", **kwargs):
        super().__init__(*args, **kwargs)
        self.follow_up = follow_up
        self.response_length = self.config.actor_rollout_ref.rollout.response_length
        # What the chat template renders before any message (e.g. a default system turn), cut from
        # the follow-up turn's rendering, as verl's tool agent loop does for tool answers.
        self.preamble = token_ids(self.tokenizer.apply_chat_template([{}], add_generation_prompt=False, tokenize=True))

    async def run(self, messages: list[dict[str, Any]], sampling_params: dict[str, Any]) -> AgentLoopOutput:
        metrics: dict[str, float] = {}
        request_id = uuid4().hex
        prompt_ids = token_ids(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        half = {**sampling_params, "max_tokens": max(1, self.response_length // 2)}
        with simple_timer("generate_sequences", metrics):
            answer = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=half)
        response, mask, turns = list(answer), [1] * len(answer), 2
        follow_up = token_ids(self.tokenizer.apply_chat_template(
            [{"role": "user", "content": self.follow_up}], add_generation_prompt=True, tokenize=True))[len(self.preamble):]
        if len(response) + len(follow_up) < self.response_length:
            with simple_timer("generate_sequences", metrics):
                checked = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response + follow_up, sampling_params=half)
            response += follow_up + list(checked)
            mask += [0] * len(follow_up) + [1] * len(checked)
            turns = 4
        n = self.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response[:n], response_mask=mask[:n],
                               num_turns=turns, metrics=metrics)
