"""Multi-turn rollouts inside the sampler (issue 69): a row whose turn ends in a stop token is given its next
tokens (a tool's result, the next turn's header) and writes on. The fast path (sampler._fast_generate) feeds them a
token a step beside the rows still writing, into the row's own KV cache (`Turns`): no conversation is prefilled
again, no row waits for another's turn, as vLLM mixes prefills into its decode batches. Samplers that cannot
continue a row (transformers' generate, a test's scripted model) run it `in_rounds`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Conversation:
    """How the rows of a rollout go on past a stop token (engine/agent.py): `opening[r]`, tokens that open row r's
    completion before the model writes (an observation of its own); `then(r, turn)`, called when row r ends a turn
    (`turn`: the tokens it wrote since the last given ones, the stop token included): the tokens to give it next (a
    tool's result and the next turn's header), or None: the row is done. Given tokens are part of the completion
    (the caller knows which they are) and count towards its limit: past it they are cut and the row ends."""

    opening: list[list[int]]
    then: Callable[[int, list[int]], list[int] | None]


class Turns:
    """A Conversation inside the decode loop: the tokens each row is to be given next, fed in place of its sampled
    ones, and where its current turn began."""

    def __init__(self, conversation: Conversation):
        self.conversation = conversation
        self.queue = [list(reversed(ids)) for ids in conversation.opening]  # popped from the end
        self.start = [0] * len(conversation.opening)

    def give(self, rows: Tensor, tok: Tensor) -> Tensor:
        """Put each live row's next given token in place of its sampled one (in place); which rows were given."""
        given = torch.zeros(len(rows), dtype=torch.bool)
        for i, r in enumerate(rows.tolist()):
            if self.queue[r]:
                tok[i], given[i] = self.queue[r].pop(), True
                self.start[r] += 1
        return given

    def ended(self, rows: Tensor, ended: Tensor, out: list[list[int]]) -> Tensor:
        """Of the rows that ended a turn, those that are done (the rest get their next tokens queued)."""
        done = ended.clone()
        for i in ended.nonzero().squeeze(-1).tolist():
            r = int(rows[i])
            more = self.conversation.then(r, out[r][self.start[r]:])
            if more:
                self.queue[r], self.start[r], done[i] = list(reversed(more)), len(out[r]), False
        return done


def in_rounds(generate, prompts: list[list[int]], g: int, limit: int, stops, conversation: Conversation):
    """A conversation for a sampler that cannot continue its rows (transformers' generate; a scripted test model):
    rounds, each sampling every live row again from its prompt and its conversation so far (`generate(prompts, k,
    limit)`: k completions of each prompt), until no row goes on."""
    out = [list(ids) for ids in conversation.opening]
    live = [r for r in range(len(out)) if len(out[r]) < limit]
    first = not any(out)
    while live:
        outs = generate(prompts, g, limit) if first else \
            generate([prompts[r // g] + out[r] for r in live], 1, limit - min(len(out[r]) for r in live))
        first, going = False, []
        for r, new in zip(live, outs, strict=True):
            new = new[:limit - len(out[r])]
            out[r] += new
            more = conversation.then(r, new) if new and new[-1] in stops else None
            if more:
                out[r] = (out[r] + more)[:limit]  # as the fast path: given tokens past the limit are cut
                going += [r] if len(out[r]) < limit else []
        live = going
    return out
