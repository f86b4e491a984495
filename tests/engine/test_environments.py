"""Environments (issue 69, TRL's environment_factory): one instance a rollout, reset with its row, its methods the
rollout's tools, its get_reward the reward `environment`; several routed by the rows' `environment` column; an
environment written for TRL runs unchanged; a non-math game trains and evaluates on the tiny model."""

from __future__ import annotations

import json

import pytest

from cpu_grpo import config
from cpu_grpo.data import example
from cpu_grpo.data.environments import EnvError, load_environments, methods
from cpu_grpo.engine.agent import sample_with_tools
from cpu_grpo.engine.conversation import in_rounds
from tests.engine.test_agent import scripted, tool_model, tool_tok

GAME = '''
class GuessWord:
    """A word game: the secret comes from the row; `guess` says which letters are right."""

    def reset(self, secret: str, **kwargs) -> str:
        self.secret, self.solved = secret, False
        return f" The word has {len(secret)} letters."

    def guess(self, word: str) -> str:
        """Guess the secret word.

        Args:
            word: The guess.
        """
        self.solved = word == self.secret
        return "".join(a if a == b else "_" for a, b in zip(word, self.secret))

    def get_reward(self) -> float:
        return float(self.solved)
'''


class IncrementEnv:
    """TRL's own example environment (its demo of environment_factory), as a TRL user writes it: a reset that
    takes no row, one tool, no reward."""

    def __init__(self):
        self._counter = 0

    def reset(self) -> None:
        self._counter = 0

    def increment(self, a: int) -> int:
        """
        Increment the integer by a specified value

        Args:
            a: The value to increment by

        Returns:
            The incremented integer.
        """
        self._counter += a
        return self._counter


def game_file(where) -> str:
    path = where / "games.py"
    path.write_text(GAME)
    return str(path)


def rows(n: int, **columns) -> list[example.Example]:
    return [example.Example("Guess the word.", "", "game", id=f"r{i}", math=False,
                          columns={k: v[i % len(v)] for k, v in columns.items()}) for i in range(n)]


def test_each_rollout_gets_its_own_environment_reset_with_its_row(tmp_path):
    envs = load_environments([f"{game_file(tmp_path)}:GuessWord"])
    started = envs.start(rows(2, secret=["cat", "doge"]), [[{"role": "user", "content": "Guess the word."}]] * 2, 2)
    assert len({id(e) for e in started.envs}) == 4  # one instance a rollout
    assert [e.secret for e in started.envs] == ["cat", "cat", "doge", "doge"]
    assert started.chats[0][-1]["content"] == "Guess the word. The word has 3 letters."
    assert started.chats[2][-1]["content"] == "Guess the word. The word has 4 letters."
    assert [[m.__name__ for m in t] for t in started.tools] == [["guess"]] * 4
    again = envs.start(rows(1, secret=["owl"]), [[{"role": "user", "content": "?"}]], 2)
    assert again.envs == started.envs[:2] and again.envs[0].secret == "owl"  # made once, reset for each episode


def test_an_environment_written_for_trl_runs_unchanged():
    """TRL's IncrementEnv: reset() takes no row (it gets none), its method is a tool with a schema."""
    from cpu_grpo.data import environments, tools

    with environments.given({"IncrementEnv": IncrementEnv}):
        envs = load_environments(["IncrementEnv"])
    started = envs.start(rows(1), [[{"role": "user", "content": "Increment by two."}]], 2)
    assert started.chats[0][-1]["content"] == "Increment by two."  # reset returned None: the prompt as it was
    (increment,) = started.tools[0]
    assert tools.schemas([increment])[0]["function"]["name"] == "increment"
    call = {"type": "function", "function": {"name": "increment", "arguments": {"a": 2}}}
    assert tools.call(started.tools[0], call) == ("increment", "2", False)
    assert tools.call(started.tools[1], call) == ("increment", "2", False)  # the other rollout's counter


def test_several_environments_are_routed_by_the_environment_column(tmp_path):
    from cpu_grpo.data import environments

    spec = f"{game_file(tmp_path)}:GuessWord"
    with environments.given({"IncrementEnv": IncrementEnv}):
        envs = load_environments([f"word={spec}", "count=IncrementEnv"])
    chats = [[{"role": "user", "content": "?"}]] * 2
    started = envs.start(rows(2, environment=["count", "word"], secret=["cat"]), chats, 1)
    assert [type(e).__name__ for e in started.envs] == ["IncrementEnv", "GuessWord"]
    assert [[m.__name__ for m in t] for t in started.tools] == [["increment"], ["guess"]]
    with pytest.raises(EnvError, match="row r0 has environment 'maze', which is not one of the environments given"):
        envs.start(rows(1, environment=["maze"]), chats[:1], 1)
    with pytest.raises(EnvError, match="with several environments, name each as name=file.py:Class"):
        load_environments([spec, spec])


def test_bad_environments_are_refused_in_one_sentence(tmp_path):
    from cpu_grpo.data import environments

    class NoReset:
        def act(self, x: int) -> int:
            """Act.

            Args:
                x: A number.
            """
            return x

    class Untyped:
        def reset(self, **kwargs):
            raise KeyError("secret")

        def act(self, x):
            return x

    with environments.given({"NoReset": NoReset, "Untyped": Untyped}):
        with pytest.raises(EnvError, match="environment NoReset: it has no reset method"):
            load_environments(["NoReset"])
        with pytest.raises(EnvError, match="environment Untyped: tool act: .*type hint"):
            load_environments(["Untyped"])
    envs = load_environments([f"{game_file(tmp_path)}:GuessWord"])
    with pytest.raises(EnvError, match=r"reset raised TypeError .* on row r0: fix reset or that row"):
        envs.start(rows(1), [[{"role": "user", "content": "?"}]], 1)  # the row has no secret
    assert methods(envs.pools[""][0])[0].__name__ == "guess"


def test_observations_that_differ_within_a_group_start_each_completion_masked(tiny_model):
    """Two rollouts of one problem whose resets say different things: the group's prompt is what they share, the
    rest of each row's prompt opens its completion, not the model's (mask 0), and each row is sampled from its own."""
    tok = tool_tok(tiny_model)
    eos = tok.eos_token_id
    asked = []

    def once(prompts, k, limit):
        asked.append([tok.decode(p) for p in prompts])
        return [tok("#### 1", add_special_tokens=False)["input_ids"] + [eos] for _ in prompts for _ in range(k)]

    def generate(prompts, k, conversation):
        return in_rounds(once, prompts, k, 100, (eos,), conversation)

    chats = [[{"role": "user", "content": f"Play. Board {b}"}] for b in ("A", "B")]
    prompts, turns = sample_with_tools(tok, generate, chats, 2, [[], []], 100, 2, (eos,))
    assert len(prompts) == 1 and tok.decode(prompts[0]).rstrip().endswith("Play. Board")
    assert len(asked) == 1 and [p.split("Board")[-1].strip()[0] for p in asked[0]] == ["A", "B"]
    for t, b in zip(turns, "AB", strict=True):
        opening = tok.decode([i for i, m in zip(t.ids, t.model_mask, strict=True) if not m])
        assert opening.strip().startswith(b) and tok.decode(prompts[0] + t.ids).count("Board") == 1


def test_the_environment_reward_is_added_with_weight_one():
    cfg = config.build(None, None, {"environment": "games.py:GuessWord"})
    assert (cfg.rewards, cfg.reward_weights) == (["environment"], [1.0])
    cfg = config.build(None, None, {"environment": "games.py:GuessWord", "rewards": "exact_match,format",
                                    "reward_weights": "1.0,0.1"})
    assert (cfg.rewards, cfg.reward_weights) == (["exact_match", "format", "environment"], [1.0, 0.1, 1.0])


@pytest.mark.slow
def test_a_word_game_trains_and_evaluates_in_its_environment(tiny_model, tmp_path, monkeypatch):
    """A scripted model guesses "cat" with the game's tool, then stops: rows whose secret is cat are won (reward 1
    from get_reward), the others lost; the run logs the environment's reward and one call a sample, and its
    held-out records keep each exchange and are judged by the game."""
    from cpu_grpo.engine.sampler import Sampler
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    model = tool_model(tiny_model, tmp_path)
    call = '<tool_call>{"name": "guess", "arguments": {"word": "cat"}}</tool_call>'
    monkeypatch.setattr(Sampler, "generate", scripted(tool_tok(model), call, "done"))
    data = tmp_path / "game.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Guess the word ({i})."}],
                                        "secret": ["cat", "dog"][i % 2]}) + "\n" for i in range(20)))
    out = tmp_path / "run"
    cfg = config.build(None, None, dict(model=model, task=str(data), output_dir=str(out), steps=2,
                                        prompts_per_step=2, num_generations=2, max_new_tokens=120, eval_size=4,
                                        environment=[f"{game_file(tmp_path)}:GuessWord"], bf16=False))
    train(cfg, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m["tool_calls"] == 1.0 and m["tool_failures"] == 0.0 for m in metrics)
    assert [m["reward/environment_reward"] for m in metrics] == [m["reward"] for m in metrics]
    after = read_jsonl(out / "eval_after.jsonl")
    secrets = {json.loads(line)["prompt"][0]["content"]: json.loads(line)["secret"]
               for line in data.read_text().splitlines()}
    assert [r["correct"] for r in after] == [secrets[r["question"]] == "cat" for r in after]
    assert all(r["transcript"][1]["content"] in ("cat", "___") for r in after)
