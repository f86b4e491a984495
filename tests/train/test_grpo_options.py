"""The GRPO options TRL users set, each against a hand-computed example: GSPO's sequence-level ratio, the
high-entropy tokens, GDPO's decoupled normalisation, None rewards, min-p, the repetition penalty, async reward
functions, a reward model among the rewards, masked truncated completions (end to end on the tiny model)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from cpu_grpo.data.rewards import RewardError, load_reward
from cpu_grpo.data.scoring import call_reward
from cpu_grpo.engine.logprobs import token_entropies
from cpu_grpo.engine.sampling import penalised, sample_token, seen_words
from cpu_grpo.train.grpo import decoupled_rewards, group_advantages, grpo_loss, high_entropy

NORM = {"num_seqs": 1, "num_tokens": 2, "max_new_tokens": 4}


def _loss(level: str, adv: float, trained=None):
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.6]])  # token log-ratios 0.2 and -0.4
    loss, _ = grpo_loss(logp, old, None, torch.tensor([adv]), torch.ones(1, 2), NORM, 0.2, 0.2, 0.0, "dapo", level,
                        trained)
    loss.backward()
    return loss.item(), logp.grad[0].tolist()


def test_gspo_clips_one_ratio_per_completion():
    # token level: ratios e^0.2 = 1.2214 (clipped to 1.2) and e^-0.4 = 0.6703 (under 0.8: kept, A > 0); mean of -...
    loss, grad = _loss("token", 1.0)
    assert loss == pytest.approx(-(1.2 + math.exp(-0.4)) / 2, abs=1e-6)
    assert grad == pytest.approx([0.0, -math.exp(-0.4) / 2], abs=1e-6)  # the clipped token has no gradient
    # sequence level (GSPO): one ratio exp(mean(0.2, -0.4)) = e^-0.1 = 0.9048, inside [0.8, 1.2]: nothing clipped,
    # and each token's gradient is the ratio's, shared: -A * ratio / 2 tokens / 2 (the dapo mean)
    loss, grad = _loss("sequence", 1.0)
    assert loss == pytest.approx(-math.exp(-0.1), abs=1e-6)
    assert grad == pytest.approx([-math.exp(-0.1) / 2] * 2, abs=1e-6)


def test_gspo_clips_the_whole_completion():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5]])  # every token's ratio e^0.5: the sequence's too, above 1.2
    loss, stats = grpo_loss(logp, old, None, torch.tensor([1.0]), torch.ones(1, 2), NORM, level="sequence")
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and logp.grad.abs().sum() == 0 and stats["clip_frac_sum"] == 2


def test_only_the_high_entropy_tokens_are_trained():
    keep = torch.tensor([[1.0, 0.0]])  # the first token is in the top quantile, the second is not
    loss, grad = _loss("token", -1.0, keep)
    assert grad[1] == 0 and grad[0] != 0
    assert loss == pytest.approx(math.exp(0.2) / 2, abs=1e-6)  # the normaliser still counts both tokens (TRL's)


def test_high_entropy_mask_and_entropies():
    assert high_entropy(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]), torch.ones(1, 5), 0.2).tolist() == \
        [[0, 0, 0, 0, 1]]  # the top fifth: the quantile at 0.8
    assert high_entropy(torch.rand(2, 3), torch.zeros(2, 3), 0.2).sum() == 0  # nothing unpadded: nothing
    head = torch.tensor([[0.0, 0.0], [0.0, 0.0], [10.0, 0.0]])  # 3 words
    hidden = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])  # uniform over 3 words; nearly all on word 2
    ent = token_entropies(hidden, head)
    assert ent[0, 0].item() == pytest.approx(math.log(3), abs=1e-5) and ent[0, 1].item() < 0.01


def test_gdpo_normalises_each_reward_in_its_group():
    # a group of 2: correctness 1/0 and a length reward 10/30, weights 1 and 0.5: each reward becomes +-0.707 in
    # its group before the weights, so the weights rank the completions, not the rewards' scales (the raw weighted
    # sum, 1 + 5 against 0 + 15, would rank the wrong answer first)
    per_fn = torch.tensor([[1.0, 10.0], [0.0, 30.0]])
    z = decoupled_rewards(per_fn, torch.tensor([1.0, 0.5]), 2)
    right = 0.5 / (math.sqrt(0.5) + 1e-4)  # (r - mean) / (std + eps): the unbiased std of 1 and 0 is sqrt(0.5)
    short = 10 / (math.sqrt(200) + 1e-4)  # of 10 and 30, sqrt(200)
    assert z.tolist() == pytest.approx([right - 0.5 * short, -right + 0.5 * short], abs=1e-6)
    adv, _ = group_advantages(z, 2, "batch")
    assert adv[0] > 0 > adv[1]


def test_a_completion_no_reward_scored_is_left_out():
    per_fn = torch.tensor([[1.0, math.nan], [0.0, math.nan], [math.nan, math.nan], [1.0, math.nan]])
    z = decoupled_rewards(per_fn, torch.ones(2), 4)
    assert math.isnan(z[2]) and not torch.isnan(z[[0, 1, 3]]).any()
    adv, _ = group_advantages(z, 4, "batch")
    assert adv[2] == 0 and adv[0] > 0 > adv[1] and adv[0] == adv[3]


def test_min_p_keeps_the_words_near_the_likeliest():
    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0001]])).repeat(4000, 1)
    tok = sample_token(logits, 1.0, 0, 1.0, g, min_p=0.5)  # p >= 0.25: words 0 and 1
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert tok.max() <= 1 and freq[0] == pytest.approx(0.5 / 0.8, abs=0.03)


def test_repetition_penalty_is_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    prompts, logits = [[3, 5, 5], [0]], torch.randn(4, 8)  # 2 prompts, 2 samples each
    seen = seen_words(prompts, 2, 8)
    ids = torch.tensor([[3, 5, 5], [3, 5, 5], [0, 0, 0], [0, 0, 0]])
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
    assert torch.allclose(penalised(logits, seen, 1.3), expected)


def test_async_reward_functions_run():
    async def slow_reward(completions, **kwargs):
        await asyncio.sleep(0.01)
        return [float(len(c)) for c in completions]

    assert call_reward(slow_reward, ["ab", "abc"], {}, ["r1", "r2"]) == [2.0, 3.0]


def test_a_reward_model_scores_prompt_and_completion(tmp_path, tiny_model):
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_model, num_labels=1)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "rm")
    fn = load_reward(str(tmp_path / "rm"))
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    scores = fn([[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5 or so"}]],
                prompts=[chat, chat])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores) and scores[0] != scores[1]
    assert fn.__name__ == "rm"
    with pytest.raises(RewardError, match="is a LlamaForCausalLM: give a sequence classifier with one label"):
        load_reward(tiny_model)


@pytest.mark.slow
def test_truncated_completions_are_left_out(tiny_model, tmp_path, reward_file):
    """The random tiny model never ends a completion: with mask_truncated_completions every one is cut, none is
    trained, and the weights stay as they were."""
    from safetensors.torch import load_file
    from test_train import tiny_cfg

    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=1, save_every=0, mask_truncated_completions=True),
          log=lambda *a: None)
    step = read_jsonl(out / "metrics.jsonl")[0]
    assert step["truncated_frac"] == 1 and step["loss"] == 0 and step["grad_norm"] == 0
    base = load_file(f"{tiny_model}/model.safetensors")
    after = load_file(out / "checkpoints/step-000001/model.safetensors")
    assert all(torch.equal(base[k], after[k]) for k in base)
