"""Multi-turn rollouts with tools (issue 69's first pieces): the tool results' tokens as the chat template writes
them, conversations that call tools and answer, and an update that trains only the tokens the model wrote."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from cpu_grpo import config
from cpu_grpo.data import example
from cpu_grpo.data.tools import calculator
from cpu_grpo.engine.agent import Turns, sample_with_tools, tool_suffix_ids
from cpu_grpo.engine.conversation import in_rounds
from cpu_grpo.train import runstate, update
from cpu_grpo.train.rollout import Rollout

# Hermes-style tools, as Qwen2.5's template writes them (shortened): schemas in a system turn, calls in <tool_call>,
# results in a user turn's <tool_response>
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_tok(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_tool_results_are_tokenized_as_the_template_writes_them(tiny_model):
    tok = tool_tok(tiny_model)
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "calculator", "content": "42"}])
    expected = "\n<|im_start|>user\n<tool_response>42</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(suffix) == expected


def test_a_conversation_calls_a_tool_reads_its_result_and_answers(tiny_model):
    """A scripted model: the first turn calls the calculator (or a tool that is not there), the second answers.
    Each row's completion is its turns' tokens, the model's marked 1, the tool results and headers 0."""
    tok = tool_tok(tiny_model)
    eos = tok.eos_token_id
    scripted = {0: ['<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
                    '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>'],
                1: ["#### 42", "#### 0"]}
    asked = []

    def once(prompts, k, limit):  # round 0: the group's 2 first turns; round 1: each conversation's next turn
        asked.append((len(prompts), k))
        return [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in scripted[len(asked) - 1]]

    def generate(prompts, k, conversation):
        return in_rounds(once, prompts, k, 200, (eos,), conversation)

    chats = [[{"role": "user", "content": "What is 6 * 7?"}]]
    prompts, rows = sample_with_tools(tok, generate, chats * 2, 2, [[calculator]] * 2, 200, 3, (eos,))
    assert asked == [(1, 2), (2, 1)]  # the answers call nothing: two rounds
    assert "Tools: calculator" in tok.decode(prompts[0])
    right, wrong = rows
    assert [m["role"] for m in right.messages] == ["assistant", "tool", "assistant"]
    assert right.messages[1]["content"] == "42" and right.calls == 1 and right.failed == 0
    assert wrong.messages[1]["content"] == "{'error': 'Tool abacus not found. The tools are: calculator.'}"
    assert wrong.failed == 1
    text = tok.decode(right.ids)
    assert text.startswith('<tool_call>{"name": "calculator"') and text.endswith("#### 42<|im_end|>")
    written = tok.decode([t for t, m in zip(right.ids, right.model_mask, strict=True) if m])
    not_written = tok.decode([t for t, m in zip(right.ids, right.model_mask, strict=True) if not m])
    assert "<tool_response>42</tool_response>" in not_written and "42</tool_response>" not in written
    assert written.endswith("#### 42<|im_end|>")


def test_the_update_trains_only_the_tokens_the_model_wrote(tiny_model, tmp_path):
    """The same rollout with every token marked the model's trains as without a mask; with none marked, nothing."""
    g = 2
    batch = [example.Example("question 0", "1", "basic", id="q0")]
    rollout = Rollout(batch, [[5, 6, 7]], [[8, 9, 10, 11], [12, 13]], ["", ""], [False, False])
    adv = torch.tensor([1.0, -1.0])
    cfg = config.build(None, None, dict(model=tiny_model, learning_rate=1e-30, max_grad_norm=0, num_generations=g,
                                        prompts_per_step=1, max_new_tokens=8, bf16=False, eval_size=0))

    def loss(mask):
        torch.manual_seed(0)
        r, _, _ = runstate.build_run(cfg, tmp_path / str(mask), None, lambda *a: None)
        turns = None if mask is None else [Turns(c, m) for c, m in zip(rollout.completions, mask, strict=True)]
        given = Rollout(*[getattr(rollout, f) for f in ("batch", "prompts", "completions", "texts", "truncated")],
                        turns=turns)
        learner = update.Learner.of(r)
        return update.backward(learner, update.prepare(learner, None, given, adv, cfg.max_new_tokens)).sums["loss"]

    plain = loss(None)
    assert plain != 0 and loss([[1, 1, 1, 1], [1, 1]]) == plain
    assert loss([[0, 0, 0, 0], [0, 0]]) == 0.0
    assert loss([[1, 0, 0, 1], [1, 1]]) != plain


def tool_model(tiny_model: str, where) -> str:
    """The tiny model with a chat template that shows tools (a copy: the session's model stays as it is)."""
    import shutil

    path = where / "tiny-tools"
    shutil.copytree(tiny_model, path)
    tok = tool_tok(tiny_model)
    tok.save_pretrained(path)
    return str(path)


def scripted(tok, call: str, answer: str):
    """A sampler's generate that makes a tool call as a conversation's first turn and answers after a result."""
    def once(prompts, k, limit):
        said = [answer if tok.decode(p).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n") else call
                for p in prompts]
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in said for _ in range(k)]

    def generate(self, prompts, k, sampling, generator=None, conversation=None):
        if conversation is None:
            return once(prompts, k, sampling.max_new_tokens)
        return in_rounds(once, prompts, k, sampling.max_new_tokens, sampling.stops, conversation)

    return generate


@pytest.mark.slow
def test_a_run_with_tools_trains_and_evaluates_with_them(tiny_model, tmp_path, monkeypatch):
    """A scripted model calls the calculator in its first turn and answers after the result: the run logs one call
    a sample, none failed; the held-out records keep each exchange."""
    from cpu_grpo.engine.sampler import Sampler
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    model = tool_model(tiny_model, tmp_path)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    monkeypatch.setattr(Sampler, "generate", scripted(tool_tok(model), call, "#### 4"))
    out = tmp_path / "run"
    cfg = config.build(None, None, dict(model=model, output_dir=str(out), steps=2, prompts_per_step=2,
                                        num_generations=2, max_new_tokens=120, eval_size=3, tools=["calculator"],
                                        rewards=["correctness"], reward_weights=[1.0], bf16=False))
    train(cfg, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [(m["tool_calls"], m["tool_failures"]) for m in metrics] == [(1.0, 0.0), (1.0, 0.0)]
    groups = read_jsonl(out / "groups.jsonl")  # the app's inspector shows each exchange turn by turn
    assert all(len(g["transcripts"]) == 2 and all(t[0]["tool_calls"][0]["function"]["name"] == "calculator"
                                                  for t in g["transcripts"]) for g in groups)
    after = read_jsonl(out / "eval_after.jsonl")
    assert all(r["tool_calls"] == 1 and [m["role"] for m in r["transcript"]] == ["assistant", "tool", "assistant"]
               and r["transcript"][1]["content"] == "4" for r in after)
    assert "| after | 3 | 1.00 | 0 of 3 | 0 (0 right) |" in (out / "report.md").read_text()
    from cpu_grpo.cli import main  # its checkpoint is evaluated with the tools it was trained with

    (ckpt,) = (out / "checkpoints").glob("step-000002")
    assert main(["eval", "--model", str(ckpt), "--task", "basic", "--n", "2", "--output",
                 str(tmp_path / "e.jsonl")]) == 0
    assert [r["tool_calls"] for r in read_jsonl(tmp_path / "e.jsonl")] == [1, 1]


def test_a_model_whose_template_ignores_tools_is_refused(tiny_model, tmp_path):
    from cpu_grpo.data.tools import ToolError
    from cpu_grpo.train.runstate import offered_tools

    with pytest.raises(ToolError, match="does not show tools to the model: use a model whose template takes tools"):
        offered_tools(["calculator"], tiny_model, AutoTokenizer.from_pretrained(tiny_model))
