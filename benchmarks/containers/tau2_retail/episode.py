"""One half-duplex tau2 episode: the agent greets, then a user simulator (an LLM playing
the customer from the task's scenario) and the agent (the policy, with the retail tools)
take turns until the user's stop token, a transfer to a human, or the step limit."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from benchmarks.containers.tau2_retail.chat import ChatTurn, ToolChatClient
from benchmarks.containers.tau2_retail.tools import TOOL_SCHEMAS, TRANSFER_TOOL, RetailTools, ToolError

# tau2 src/tau2/agent/llm_agent.py (AGENT_INSTRUCTION, SYSTEM_PROMPT).
AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""
AGENT_SYSTEM = "<instructions>\n{agent_instruction}\n</instructions>\n<policy>\n{domain_policy}\n</policy>"
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"  # tau2's orchestrator opens with this

# tau2 data/tau2/user_simulator/simulation_guidelines.md, and the user SYSTEM_PROMPT around it.
USER_GUIDELINES = """# User Simulation Guidelines
You are playing the role of a customer contacting a customer service representative. 
Your goal is to simulate realistic customer interactions while following specific scenario instructions.

## Core Principles
- Generate one message at a time, maintaining natural conversation flow.
- Strictly follow the scenario instructions you have received.
- Never make up or hallucinate information not provided in the scenario instructions. Information that is not provided in the scenario instructions should be considered unknown or unavailable.
- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language to convey the same information
- Disclose information progressively. Wait for the agent to ask for specific information before providing it.

## Task Completion
- The goal is to continue the conversation until the task is complete.
- Do not end the conversation prematurely. Agreeing to an action is not the same as the action being completed. If the agent offers to do something (e.g., cancel an order, process a refund), wait for the agent to confirm it is done before ending the conversation.
- Before ending the conversation, verify that all items in your scenario instructions have been addressed. If your instructions include multiple requests, questions, or tasks, make sure every single one has been completed; do not stop after only some of them are resolved.
- If the instruction goal is satisified, generate the '###STOP###' token to end the conversation.
- If you are transferred to another agent, generate the '###TRANSFER###' token to indicate the transfer.
- If you find yourself in a situation in which the scenario does not provide enough information for you to continue the conversation, generate the '###OUT-OF-SCOPE###' token to end the conversation.
Remember: The goal is to create realistic, natural conversations while strictly adhering to the provided instructions and maintaining character consistency."""
USER_SYSTEM = "{guidelines}\n\n<scenario>\n{instructions}\n</scenario>"
USER_STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_STOP_TOKEN = "###STOP###"


def agent_system_prompt(domain_policy: str) -> str:
    return AGENT_SYSTEM.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=domain_policy)


def user_instructions(scenario: dict[str, Any]) -> str:
    """The scenario as tau2 renders StructuredUserInstructions (tab-indented sections)."""
    inst = scenario.get("instructions")
    if isinstance(inst, str):
        text = inst
    else:
        inst = inst or {}
        sections = [f"Domain: {inst.get('domain', 'retail')}"]
        for key, title in (("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                           ("unknown_info", "Unknown info"), ("task_instructions", "Task instructions")):
            if inst.get(key):
                sections.append(f"{title}:\n{textwrap.indent(str(inst[key]), chr(9))}")
        text = "\n".join(sections)
    persona = scenario.get("persona")
    return f"Persona:\n{textwrap.indent(str(persona), chr(9))}\nInstructions:\n{textwrap.indent(text, chr(9))}" \
        if persona else text


def user_system_prompt(scenario: dict[str, Any]) -> str:
    return USER_SYSTEM.format(guidelines=USER_GUIDELINES, instructions=user_instructions(scenario))


@dataclass(frozen=True)
class EpisodeLimits:
    max_steps: int = 100  # messages (agent, tool result, user), as tau2 counts steps
    max_errors: int = 10  # failed tool calls
    agent_max_tokens: int = 512
    user_max_tokens: int = 512
    user_temperature: float = 0.0


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def add(self, turn: ChatTurn) -> None:
        self.prompt_tokens += turn.prompt_tokens
        self.completion_tokens += turn.completion_tokens
        self.calls += 1


@dataclass
class Episode:
    """Everything one episode produced; filled as it runs so a failure keeps the partial record."""

    agent_system: str
    user_system: str
    history: list[dict[str, Any]] = field(default_factory=list)  # the agent's view, after its system message
    user_view: list[dict[str, Any]] = field(default_factory=list)  # the simulator's view (roles flipped)
    calls: list[dict[str, Any]] = field(default_factory=list)  # tool calls: name, arguments, ok, result
    agent_texts: list[str] = field(default_factory=list)
    termination: str = "running"
    steps: int = 0
    errors: int = 0
    agent_usage: Usage = field(default_factory=Usage)
    user_usage: Usage = field(default_factory=Usage)

    def transcript(self, limit: int = 6000) -> str:
        """A readable conversation (tool results left out) for `trace.output` and reflection."""
        lines = []
        for message in self.history:
            role = message["role"]
            if role == "tool":
                continue
            for call in message.get("tool_calls") or []:
                lines.append(f"agent -> {call['function']['name']}({call['function']['arguments']})")
            if message.get("content"):
                lines.append(f"{'agent' if role == 'assistant' else 'customer'}: {message['content']}")
        text = "\n".join(lines)
        return text if len(text) <= limit else text[: limit - 3] + "..."


def _execute(tools: RetailTools, episode: Episode, call_id: str, name: str, arguments: dict[str, Any] | None,
             raw_arguments: str) -> bool:
    record: dict[str, Any] = {"id": call_id, "name": name, "arguments": arguments if arguments is not None else {}}
    try:
        if arguments is None:
            raise ToolError(f"arguments are not a JSON object: {raw_arguments[:200]!r}")
        result, ok = tools.call(name, arguments), True
    except ToolError as exc:
        result, ok = f"Error: {exc}", False
    record.update(ok=ok, result=result if len(result) <= 2000 else result[:2000] + "...")
    episode.calls.append(record)
    episode.history.append({"role": "tool", "tool_call_id": call_id, "content": result})
    episode.steps += 1
    episode.errors += not ok
    return ok


async def run_episode(episode: Episode, *, agent: ToolChatClient, user: ToolChatClient, tools: RetailTools,
                      limits: EpisodeLimits, agent_temperature: float, seed: int | None) -> Episode:
    """Play the conversation; sets `episode.termination` to user_stop, agent_stop, transfer,
    max_steps or too_many_errors. Model failures (ServiceError) propagate to the caller."""
    episode.history.append({"role": "assistant", "content": FIRST_AGENT_MESSAGE})
    episode.user_view.append({"role": "user", "content": FIRST_AGENT_MESSAGE})
    episode.agent_texts.append(FIRST_AGENT_MESSAGE)
    episode.steps = 1
    while True:
        if episode.steps >= limits.max_steps:
            episode.termination = "max_steps"
            return episode
        reply = await user.chat([{"role": "system", "content": episode.user_system}, *episode.user_view],
                                temperature=limits.user_temperature, max_tokens=limits.user_max_tokens)
        episode.user_usage.add(reply)
        episode.steps += 1
        text = reply.content
        episode.user_view.append({"role": "assistant", "content": text})
        episode.history.append({"role": "user", "content": text})
        if any(token in text for token in USER_STOP_TOKENS):
            episode.termination = "user_stop"
            return episode
        # The agent acts until it speaks to the customer: tool calls, then one message.
        while True:
            if episode.steps >= limits.max_steps:
                episode.termination = "max_steps"
                return episode
            turn = await agent.chat([{"role": "system", "content": episode.agent_system}, *episode.history],
                                    tools=TOOL_SCHEMAS, temperature=agent_temperature,
                                    max_tokens=limits.agent_max_tokens, seed=seed, turn_index=episode.steps)
            episode.agent_usage.add(turn)
            episode.steps += 1
            episode.history.append(turn.assistant_message())
            if turn.content:
                episode.agent_texts.append(turn.content)
            if not turn.tool_calls:
                episode.user_view.append({"role": "user", "content": turn.content})
                if AGENT_STOP_TOKEN in turn.content:
                    episode.termination = "agent_stop"
                    return episode
                break
            transferred = False
            for call in turn.tool_calls:
                ok = _execute(tools, episode, call.id, call.name, call.arguments, call.raw_arguments)
                transferred |= ok and call.name == TRANSFER_TOOL
            if transferred:
                episode.termination = "transfer"
                return episode
            if episode.errors >= limits.max_errors:
                episode.termination = "too_many_errors"
                return episode
