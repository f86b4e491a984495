"""Multi-turn rollouts with tools (issue 69), TRL's way: the prompt carries the tools' schemas through the chat
template; after each assistant turn its tool calls are run and their results appended as `tool` messages (tokenized
as the template writes them: `tool_suffix_ids`), and the model goes on until it answers without a call, reaches
`max_calls` rounds, or the completion budget is spent. A row's completion is every token after its prompt: the
model's (trained, mask 1) and the tools' and the template's (mask 0, out of the loss and the log-prob ratio).

Training (train/rollout.py) and the held-out evaluation (eval/evaluate.py) run the same loop, one sampler call a
rollout: the sampler gives each row its results when its turn ends and keeps its KV cache (engine/conversation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..data import tools as tool_lib
from .conversation import Conversation


@dataclass
class Turns:
    """One row's conversation after its prompt: the completion's tokens, which of them the model wrote (1) and
    which the tools and the template did (0), its messages (assistant, tool, ...) and the tool calls it made."""

    ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    calls: int = 0
    failed: int = 0

    def add(self, ids: list[int], by_model: bool) -> None:
        self.ids += ids
        self.model_mask += [int(by_model)] * len(ids)


def prompt_ids(tok, chat: list[dict], schemas: list[dict]) -> list[int]:
    """The prompt with the tools' schemas, as the model's chat template renders them, and the assistant header."""
    text = tok.apply_chat_template(chat, tools=schemas, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def tool_suffix_ids(tok, tool_messages: list[dict]) -> list[int]:
    """The tokens the chat template writes between an assistant turn that called tools and the next assistant turn:
    the tool results and the next assistant header (TRL's way: a dummy conversation rendered with and without
    them; the difference after the assistant turn's end-of-turn token)."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = tok.apply_chat_template(dummy, tokenize=True, add_generation_prompt=False, return_dict=False)
    full = tok.apply_chat_template(dummy + tool_messages, tokenize=True, add_generation_prompt=True,
                                   return_dict=False)
    ends = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
    prefix = prefix[:ends[-1] + 1] if ends else prefix
    if full[:len(prefix)] != prefix:
        raise tool_lib.ToolError("the chat template renders tool results in a way that does not continue the "
                                 "conversation before them: use a model whose template takes tools")
    return full[len(prefix):]


Generate = Callable[[list[list[int]], int, Conversation], list[list[int]]]  # (prompts, completions each, ...)


def generating(sampler, sampling, gen=None) -> Generate:
    """The sampler as sample_with_tools calls it: `sampling` (its limit: the conversation's) and the generator."""
    return lambda prompts, k, conversation: sampler.generate(prompts, k, sampling, gen, conversation)


def sample_with_tools(tok, generate: Generate, chats: list[list[dict]], g: int, tools: list[list[Callable]],
                      budget: int, max_calls: int, stops: tuple[int, ...]) -> tuple[list[list[int]], list[Turns]]:
    """G conversations for each problem (group-major), each within `budget` completion tokens. `chats` and `tools`
    are one a row (B*G): an environment may add its observation to each row's prompt and give each row its own
    tools. `generate(prompts, k, conversation)` samples k conversations from each prompt (the run's sampler, its
    limit `budget`): each turn that calls a tool gets the results (`then`). Returns each problem's prompt (the
    tokens its rows' prompts share, the tools' schemas in them) and each row's Turns; a row's prompt past the shared
    part (an observation of its own) opens its completion, masked like a tool's result."""
    rendered: dict[tuple[int, int], list[int]] = {}  # rows that share their chat and tools are rendered once
    for chat, fns in zip(chats, tools, strict=True):
        if (id(chat), id(fns)) not in rendered:
            rendered[id(chat), id(fns)] = prompt_ids(tok, chat, tool_lib.schemas(fns))
    whole = [rendered[id(chat), id(fns)] for chat, fns in zip(chats, tools, strict=True)]
    prompts = [_shared(whole[b:b + g]) for b in range(0, len(whole), g)]
    rows = [Turns() for _ in whole]
    for r, ids in enumerate(whole):
        rows[r].add(ids[len(prompts[r // g]):], by_model=False)

    def then(r: int, turn: list[int]) -> list[int] | None:  # row r's turn ended in a stop token
        return _took_turn(tok, rows[r], turn, tools[r], max_calls, budget, stops)

    outs = generate(prompts, g, Conversation([t.ids.copy() for t in rows], then))
    for r, out in enumerate(outs):
        if len(out) > len(rows[r].ids):  # a last turn cut at the budget
            _took_turn(tok, rows[r], out[len(rows[r].ids):], tools[r], max_calls, budget, stops)
    return prompts, rows


def _took_turn(tok, turns: Turns, turn: list[int], tools: list[Callable], max_calls: int, budget: int,
               stops: tuple[int, ...]) -> list[int] | None:
    """Record the model's turn; run the tools it calls, unless it was its last round or cut at the budget: the
    tokens that give it their results (None: the conversation ends, also when no room is left to answer)."""
    rounds = sum(m["role"] == "assistant" for m in turns.messages)
    turns.add(turn, by_model=True)
    text = tok.decode(turn, skip_special_tokens=True)
    calls = tool_lib.tool_calls(text)
    turns.messages.append({"role": "assistant", "content": text,
                           **({"tool_calls": [c for c in calls if c["type"] == "function"]} if calls else {})})
    if not calls or rounds == max_calls or turn[-1] not in stops:
        return None  # an answer, the last round, or cut at the budget: the conversation ends here
    results = []
    for c in calls:
        name, result, failed = tool_lib.call(tools, c)
        turns.calls, turns.failed = turns.calls + 1, turns.failed + failed
        results.append({"role": "tool", "name": name, "content": result})
    suffix = tool_suffix_ids(tok, results)
    if len(turns.ids) + len(suffix) >= budget:  # no room to answer after the results: it ends here
        return None
    turns.messages += results
    turns.add(suffix, by_model=False)
    return suffix


def _shared(prompts: list[list[int]]) -> list[int]:
    """The tokens every prompt starts with.

    >>> _shared([[1, 2, 3, 4], [1, 2, 5]]), _shared([[7, 8]])
    ([1, 2], [7, 8])
    """
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return prompts[0][:n]
