import itertools
import math

import pytest
import torch

from cpu_grpo.engine.logprobs import token_logprobs
from cpu_grpo.train.grpo import group_advantages, grpo_loss, max_variance, sampler_correction

ATOL = 1e-6
LN2 = math.log(2.0)


def close(actual, expected, atol=ATOL):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# ---------------------------------------------------------------------------- max_variance (PODS)

@pytest.mark.parametrize("seed", range(20))
def test_max_variance_is_the_widest_subset(seed):
    """Against every subset: the m rewards it picks have the largest variance there is (ties and equal values
    included: rewards are drawn from a few levels)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 4, (8,), generator=g).float() / 2 + torch.rand(8, generator=g) * (seed % 2)
    for m in (2, 3, 4, 6):
        picked = max_variance(rewards, m)
        best = max(rewards[list(c)].var().item() for c in itertools.combinations(range(8), m))
        assert len(set(picked)) == m and picked == sorted(picked)
        assert rewards[picked].var().item() == pytest.approx(best, abs=1e-6)


def test_max_variance_of_all_is_all():
    assert max_variance(torch.tensor([0.0, 1.0, 0.0, 1.0]), 4) == [0, 1, 2, 3]
    assert max_variance(torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]), 2) in ([0, 1], [0, 4], [1, 2], [1, 3], [2, 4], [3, 4])


# ---------------------------------------------------------------------------- group_advantages

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # (N=8,), B=2 groups of G=4


def test_group_advantages_group_scale():
    adv, stats = group_advantages(REWARDS, 4, "group")
    # group 1: mean 0.25, deviations (.75, -.25, -.25, -.25), squares sum .5625 + 3 * .0625 = .75,
    #   unbiased var .75 / 3 = .25, std .5 -> adv = dev / (.5 + 1e-4) = dev / .5001
    # group 2: all equal, mean 1, std 0 -> adv = 0 / (0 + 1e-4) = 0
    expected = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0, 0, 0, 0]
    close(adv, expected)
    assert adv.shape == (8,)
    assert stats["frac_zero_std"] == 0.5  # 1 of 2 groups has std 0
    close(stats["reward_std"], 0.25)  # mean of the group stds (.5 + 0) / 2


def test_group_advantages_group_scale_unit_std():
    adv, stats = group_advantages(torch.tensor([0.0, 1.0, 2.0]), 3, "group")
    # mean 1, deviations (-1, 0, 1), unbiased var (1 + 0 + 1) / 2 = 1, std 1 -> dev / 1.0001
    close(adv, [-1 / 1.0001, 0.0, 1 / 1.0001])
    assert stats["frac_zero_std"] == 0.0
    close(stats["reward_std"], 1.0)


def test_group_advantages_custom_eps():
    adv, _ = group_advantages(torch.tensor([0.0, 1.0, 2.0]), 3, "group", eps=1.0)
    close(adv, [-0.5, 0.0, 0.5])  # std 1, dev / (1 + 1)


def test_group_advantages_batch_scale():
    adv, stats = group_advantages(REWARDS, 4, "batch")
    # centred by the group mean as above; scaled by the std of all 8 rewards:
    # batch mean 5/8 = .625, deviations .375 (x5), -.625 (x3), squares sum 5 * .140625 + 3 * .390625 = 1.875,
    # unbiased var 1.875 / 7, std sqrt(1.875 / 7) = 0.517549...
    s = math.sqrt(1.875 / 7) + 1e-4
    close(adv, [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0, 0, 0, 0])
    assert stats["frac_zero_std"] == 0.5  # still counted per group


def test_group_advantages_no_scale():
    adv, stats = group_advantages(REWARDS, 4, "none")
    close(adv, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])  # reward - group mean, nothing else
    assert stats["frac_zero_std"] == 0.5


def test_group_advantages_group_size_one():
    adv, stats = group_advantages(torch.tensor([3.0, 5.0]), 1, "group")
    close(adv, [0.0, 0.0])  # each reward is its own group mean; std is defined as 0
    assert stats["frac_zero_std"] == 1.0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_groups_get_exactly_zero_advantages(scale):
    # 0.2 is not exact in binary: the mean of eight 0.2s, or of 1.0 * 0 + 0.2 * 0.75 sums, differs from each
    # value by float noise, which divided by std + eps would come out ~1e-4, not 0, and the group would be trained
    weighted = torch.tensor([0.0] * 8) * 1.0 + torch.tensor([0.75] * 8) * 0.2
    rewards = torch.cat([torch.full((8,), 0.2), weighted, torch.tensor([1.0] + [0.0] * 7)])
    adv, stats = group_advantages(rewards, 8, scale)
    assert (adv[:16] == 0).all()
    assert (adv[16:] != 0).all()
    assert stats["frac_zero_std"] == pytest.approx(2 / 3)


def test_group_advantages_invalid_scale():
    with pytest.raises(ValueError, match="'group', 'batch' or 'none'"):
        group_advantages(REWARDS, 4, "std")


# ---------------------------------------------------------------------------- token_logprobs


def test_token_logprobs_by_hand():
    hidden = torch.tensor([[[1.0], [2.0]]])  # (N=1, T=2, H=1)
    lm_head = torch.tensor([[0.0], [math.log(3.0)]])  # (V=2, H=1)
    targets = torch.tensor([[0, 1]])
    out = token_logprobs(hidden, lm_head, targets)
    # pos 0: logits (0, ln 3) -> p = (1/4, 3/4), target 0: ln(1/4)
    # pos 1: logits (0, 2 ln 3) = (0, ln 9) -> p = (1/10, 9/10), target 1: ln(9/10)
    close(out, [[math.log(0.25), math.log(0.9)]])
    out_t = token_logprobs(hidden, lm_head, targets, temperature=0.5)
    # logits doubled: pos 0 (0, ln 9) -> ln(1/10); pos 1 (0, ln 81) -> ln(81/82)
    close(out_t, [[math.log(0.1), math.log(81 / 82)]])


def reference_logprobs(hidden, lm_head, targets, temperature=1.0):
    logits = (hidden.double() @ lm_head.double().T) / temperature  # (N, T, V)
    return torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)  # (N, T)


@pytest.mark.parametrize("chunk", [1, 4, 6, 100])  # N*T = 6 positions: smaller, not dividing, equal, larger
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_log_softmax(chunk, temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 8, generator=g)  # (N=2, T=3, H=8)
    lm_head = torch.randn(11, 8, generator=g)  # (V=11, H=8)
    targets = torch.randint(0, 11, (2, 3), generator=g)
    out = token_logprobs(hidden, lm_head, targets, temperature=temperature, chunk=chunk)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    # fp32 logits of size ~ |N(0, 8)| ~ 3-10: 1e-5 is ~20 float32 ulps, not a loose tolerance
    close(out, reference_logprobs(hidden, lm_head, targets, temperature), atol=1e-5)


def test_token_logprobs_bf16_input_returns_fp32():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 4, 8, generator=g).bfloat16()
    lm_head = torch.randn(5, 8, generator=g).bfloat16()
    targets = torch.randint(0, 5, (1, 4), generator=g)
    out = token_logprobs(hidden, lm_head, targets, chunk=3)
    assert out.dtype == torch.float32
    assert torch.all(out <= 0)


# ---------------------------------------------------------------------------- grpo_loss: a tiny example
# N=2 sequences, T=3 positions; sequence 1 has one padding position. max_new_tokens (the generation limit) is 4.

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])  # (N, T); 5 real tokens
NORM = {"num_seqs": 2, "num_tokens": 5, "max_new_tokens": 4}
ADV = torch.tensor([2.0, -0.5], dtype=torch.float64)  # (N,)


@pytest.mark.parametrize("loss_type, expected", [
    # ratio 1 everywhere: per_token = -A; masked sum = 3 * (-2) + 2 * 0.5 = -5
    ("dapo", -5 / 5),  # / num_tokens 5 = -1
    ("grpo", (-2 + 0.5) / 2),  # per-sequence means -2 and 0.5, / num_seqs 2 = -0.75
    ("dr_grpo", -5 / (2 * 4)),  # / (num_seqs * max_new_tokens) = -0.625
])
def test_loss_ratio_one(loss_type, expected):
    logp = torch.full((2, 3), -1.3, dtype=torch.float64)
    loss, stats = grpo_loss(logp, logp.clone(), None, ADV, MASK, NORM, loss_type=loss_type)
    close(loss, expected)
    assert stats["clip_frac_sum"] == 0.0
    assert "kl_sum" not in stats  # beta = 0: no KL computed


# ratios: row 0 (A = +2): 1.5, 0.5, 1.1; row 1 (A = -0.5): 0.5, 1.5, and 0.1 at the padding position
RATIO = torch.tensor([[1.5, 0.5, 1.1], [0.5, 1.5, 0.1]], dtype=torch.float64)
# eps_low 0.2, eps_high 0.28: clip range [0.8, 1.28]; per_token = -min(rho * A, clip(rho) * A)
#   row 0, rho 1.5: min(3.0, 1.28 * 2 = 2.56) = 2.56 (clipped)       -> -2.56
#   row 0, rho 0.5: min(1.0, 0.8 * 2 = 1.6) = 1.0 (unclipped)         -> -1.0
#   row 0, rho 1.1: inside the range, 2.2                              -> -2.2
#   row 1, rho 0.5: min(-0.25, 0.8 * -0.5 = -0.4) = -0.4 (clipped)    -> 0.4
#   row 1, rho 1.5: min(-0.75, 1.28 * -0.5 = -0.64) = -0.75 (unclipped) -> 0.75
#   row 1, rho 0.1 (padding): min(-0.05, -0.4) = -0.4 would be clipped, but is masked
# masked sum: -2.56 - 1.0 - 2.2 + 0.4 + 0.75 = -4.61; row sums -5.76 and 1.15


@pytest.mark.parametrize("loss_type, expected", [
    ("dapo", -4.61 / 5),  # -0.922
    ("grpo", (-5.76 / 3 + 1.15 / 2) / 2),  # (-1.92 + 0.575) / 2 = -0.6725
    ("dr_grpo", -4.61 / 8),  # -0.57625
])
def test_loss_clipping(loss_type, expected):
    old = torch.full((2, 3), -2.0, dtype=torch.float64)
    logp = (old + RATIO.log()).requires_grad_()
    loss, stats = grpo_loss(logp, old, None, ADV, MASK, NORM, eps_low=0.2, eps_high=0.28, loss_type=loss_type)
    close(loss, expected)
    assert stats["clip_frac_sum"] == 2.0  # row 0 rho 1.5 and row 1 rho 0.5; the padding one is not counted


def test_clipped_tokens_have_no_gradient():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = RATIO.log().clone().requires_grad_()
    loss, _ = grpo_loss(logp, old, None, ADV, MASK, NORM, eps_low=0.2, eps_high=0.28, loss_type="dapo")
    loss.backward()
    # unclipped: d(-rho * A)/d logp = -rho * A, / num_tokens 5; clipped and padded: 0
    #   row 0: (0, -0.5 * 2 / 5 = -0.2, -1.1 * 2 / 5 = -0.44); row 1: (0, 1.5 * 0.5 / 5 = 0.15, 0)
    close(logp.grad, [[0.0, -0.2, -0.44], [0.0, 0.15, 0.0]])


def test_eps_low_and_high_are_not_swapped():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(2.0), math.log(2.0)]], dtype=torch.float64)  # rho = 2
    mask = torch.ones(1, 2)
    norm = {"num_seqs": 1, "num_tokens": 2, "max_new_tokens": 2}
    up, _ = grpo_loss(logp, old, None, torch.tensor([1.0]), mask, norm, eps_low=0.1, eps_high=0.5)
    close(up, -1.5)  # A = 1, rho 2 clipped to 1 + eps_high = 1.5; two tokens / 2
    down, _ = grpo_loss(-logp, old, None, torch.tensor([-1.0]), mask, norm, eps_low=0.1, eps_high=0.5)
    close(down, 0.9)  # A = -1, rho 0.5 clipped to 1 - eps_low = 0.9: -min(-0.5, -0.9) = 0.9


# ---------------------------------------------------------------------------- KL term

# ref - logp: row 0 (ln 2, -ln 2, 0), row 1 (ln 2, 0, 5 at the padding position)
# k3(d) = exp(d) - d - 1: k3(ln 2) = 2 - ln 2 - 1 = 1 - ln 2 = 0.3069; k3(-ln 2) = 0.5 + ln 2 - 1 = ln 2 - 0.5 = 0.1931;
# k3(0) = 0; the padding k3(5) = e^5 - 6 = 142.4 must not count.
DELTA = torch.tensor([[LN2, -LN2, 0.0], [LN2, 0.0, 5.0]], dtype=torch.float64)
KL_SUM = (1 - LN2) + (LN2 - 0.5) + 0 + (1 - LN2) + 0  # = 1.5 - ln 2 = 0.8069


def test_kl_k3_by_hand():
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    zero_adv = torch.zeros(2, dtype=torch.float64)
    loss, stats = grpo_loss(logp, logp.clone(), logp + DELTA, zero_adv, MASK, NORM, beta=0.1, loss_type="dapo")
    close(stats["kl_sum"], KL_SUM)
    close(loss, 0.1 * KL_SUM / 5)  # A = 0: only beta * k3, token mean over 5 tokens
    # grpo: per-sequence means of k3: row 0 (1 - ln2 + ln2 - 0.5) / 3 = 0.5 / 3, row 1 (1 - ln 2) / 2
    loss, _ = grpo_loss(logp, logp.clone(), logp + DELTA, zero_adv, MASK, NORM, beta=0.1, loss_type="grpo")
    close(loss, 0.1 * (0.5 / 3 + (1 - LN2) / 2) / 2)


def test_kl_adds_to_policy_term():
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    loss, _ = grpo_loss(logp, logp.clone(), logp + DELTA, ADV, MASK, NORM, beta=0.1, loss_type="dr_grpo")
    # policy masked sum -5 (see test_loss_ratio_one) + 0.1 * KL_SUM, / (2 * 4)
    close(loss, (-5 + 0.1 * KL_SUM) / 8)


def test_kl_gradient():
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    ref = logp + DELTA
    logp.requires_grad_()
    loss, _ = grpo_loss(logp, logp.detach(), ref, torch.zeros(2, dtype=torch.float64), MASK, NORM,
                        beta=1.0, loss_type="dapo")
    loss.backward()
    # d k3 / d logp with d = ref - logp: -exp(d) + 1; ln 2 -> -1, -ln 2 -> 0.5, 0 -> 0; / 5 tokens; padding 0
    close(logp.grad, [[-1 / 5, 0.5 / 5, 0.0], [-1 / 5, 0.0, 0.0]])


# ---------------------------------------------------------------------------- gradient with one update per rollout


@pytest.mark.parametrize("loss_type, expected_loss, denom", [
    # A = (1, -1) (centred), lengths 3 and 2; ratio 1: per_token = -A
    ("grpo", -(1 - 1) / 2, [[3 * 2] * 3, [2 * 2] * 3]),  # loss (-1 + 1) / 2 = 0; grad / (len_i * num_seqs)
    ("dapo", -(3 - 2) / 5, [[5] * 3, [5] * 3]),  # loss -(3 - 2) / 5 = -0.2: not 0, longer answer weighs more
    ("dr_grpo", -(3 - 2) / 8, [[8] * 3, [8] * 3]),  # loss -1 / (2 * 4) = -0.125; grad / (num_seqs * max_new_tokens)
])
def test_policy_gradient_one_iteration(loss_type, expected_loss, denom):
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    logp = torch.tensor([[-0.5, -1.5, -2.5], [-0.7, -0.2, -3.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), None, adv, MASK, NORM, loss_type=loss_type)
    close(loss, expected_loss)
    assert stats["clip_frac_sum"] == 0.0
    loss.backward()
    # d/d logp of -rho * A at rho = 1 is -A, times mask, / the normaliser
    expected_grad = -adv[:, None] * MASK / torch.tensor(denom, dtype=torch.float64)
    close(logp.grad, expected_grad)


# ---------------------------------------------------------------------------- micro-batching


def random_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3  # (N=4, T=5)
    old = logp + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64)  # ratios spread over the clip range
    ref = logp + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4, 1])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()  # (N, T)
    norm = {"num_seqs": 4, "num_tokens": int(lengths.sum()), "max_new_tokens": 6}
    return logp, old, ref, adv, mask, norm


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_micro_batches_add_up_to_the_full_batch(loss_type, beta):
    logp, old, ref, adv, mask, norm = random_batch()
    kw = dict(eps_low=0.2, eps_high=0.28, beta=beta, loss_type=loss_type)

    full = logp.clone().requires_grad_()
    loss, stats = grpo_loss(full, old, ref, adv, mask, norm, **kw)
    loss.backward()

    micro = logp.clone().requires_grad_()
    total, clip_sum, kl_sum = 0.0, 0.0, 0.0
    for rows in (slice(0, 2), slice(2, 4)):  # same whole-batch norm for every micro-batch
        part, st = grpo_loss(micro[rows], old[rows], ref[rows], adv[rows], mask[rows], norm, **kw)
        part.backward()
        total += part.item()
        clip_sum += st["clip_frac_sum"]
        kl_sum += st.get("kl_sum", 0.0)

    assert stats["clip_frac_sum"] > 0  # the example exercises clipping
    close(total, loss.item())
    close(micro.grad, full.grad)
    assert clip_sum == stats["clip_frac_sum"]
    if beta > 0:
        close(kl_sum, stats["kl_sum"])


# ---------------------------------------------------------------------------- padding


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_padding_never_leaks(loss_type):
    logp, old, ref, adv, mask, norm = random_batch(1)
    pad = mask == 0
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.1, loss_type=loss_type)

    a = logp.clone().requires_grad_()
    loss_a, stats_a = grpo_loss(a, old, ref, adv, mask, norm, **kw)
    loss_a.backward()

    # other (finite) values at every padded position of logp, old_logp and ref_logp
    g = torch.Generator().manual_seed(2)
    b = torch.where(pad, logp - 5 * torch.rand(4, 5, generator=g, dtype=torch.float64), logp).requires_grad_()
    old_b = torch.where(pad, old + 3.0, old)
    ref_b = torch.where(pad, ref - 4.0, ref)
    loss_b, stats_b = grpo_loss(b, old_b, ref_b, adv, mask, norm, **kw)
    loss_b.backward()

    close(loss_b, loss_a)
    close(b.grad, a.grad)
    assert torch.all(a.grad[pad] == 0) and torch.all(b.grad[pad] == 0)
    assert stats_b == pytest.approx(stats_a, abs=ATOL)


def test_padding_with_non_finite_values_does_not_leak():
    logp, old, ref, adv, mask, norm = random_batch(1)
    pad = mask == 0
    # -inf at the padding of both logp and old_logp: ratio exp(-inf - -inf) = exp(nan) = nan
    logp = torch.where(pad, -math.inf, logp)
    old = torch.where(pad, -math.inf, old)
    loss, _ = grpo_loss(logp, old, ref, adv, mask, norm, beta=0.1, loss_type="dapo")
    assert torch.isfinite(loss)


@pytest.mark.parametrize("temperature, chunk", [(1.0, 4), (0.7, 4), (1.0, 100)])
def test_token_logprobs_gradients_match_log_softmax(temperature, chunk):
    # the backward pass recomputes logits chunk by chunk: its gradients must equal autograd's through log_softmax
    torch.manual_seed(0)
    h = torch.randn(3, 5, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    tg = torch.randint(0, 11, (3, 5))
    g = torch.randn(3, 5)
    ref = torch.log_softmax((h @ w.t()) / temperature, -1).gather(-1, tg[..., None]).squeeze(-1)
    (ref * g).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    (token_logprobs(h, w, tg, temperature, chunk=chunk) * g).sum().backward()
    assert torch.allclose(h.grad, gh, atol=1e-5) and torch.allclose(w.grad, gw, atol=1e-5)


@pytest.mark.parametrize("keep_bytes", [0, 2**30])  # probabilities recomputed in the backward, or kept
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_gradients_match_autograd(keep_bytes, temperature):
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    lm_head = torch.randn(11, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 3), generator=g)
    weights = torch.randn(2, 3, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda h, w: token_logprobs(h, w, targets, temperature, chunk=4, keep_bytes=keep_bytes),
               lambda h, w: reference_logprobs(h, w, targets, temperature)):
        h, w = hidden.clone().requires_grad_(), lm_head.clone().requires_grad_()
        (fn(h, w) * weights).sum().backward()
        grads.append((h.grad, w.grad))
    close(grads[0][0], grads[1][0], atol=1e-6)
    close(grads[0][1], grads[1][1], atol=1e-6)


def test_the_sampler_correction_weighs_tokens_or_completions_as_trl_does():
    """TRL's four modes on one batch: per token the ratio trainer / sampler, per completion its product; truncated
    to the clip or zeroed outside it; a token the sampler did not draw (NaN) weighs 1; no sampler mismatch weighs 1
    and leaves the loss as it was."""
    old = torch.tensor([[-1.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
    sampler = torch.tensor([[-1.0, -3.0, float("nan")], [-0.5, -0.4, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    e2, e01 = math.exp(2), math.exp(-0.1)
    w, st = sampler_correction(old, sampler, mask, "token_truncate", 0.0, 3.0)
    assert torch.allclose(w, torch.tensor([[1.0, 3.0, 1.0], [1.0, e01, 1.0]]))
    assert st["is_far_sum"] == 1 and st["is_clipped_sum"] == 1 and st["is_kl_sum"] == pytest.approx(-2 + 0.1)
    w, _ = sampler_correction(old, sampler, mask, "token_mask", 0.0, 3.0)
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 1.0], [1.0, e01, 1.0]]))
    w, st = sampler_correction(old, sampler, mask, "sequence_mask", 0.0, 3.0)
    assert torch.allclose(w, torch.tensor([[0.0], [e01]])) and st["is_clipped_sum"] == 1  # e^2 > 3: masked
    w, _ = sampler_correction(old, sampler, mask, "sequence_truncate", 0.5, 0.0)
    assert torch.allclose(w, torch.tensor([[e2], [max(e01, 0.5)]]))  # an upper bound of 0 is none
    logp = old.clone().requires_grad_()
    adv, norm = torch.tensor([1.0, -1.0]), {"num_seqs": 2, "num_tokens": 5, "max_new_tokens": 3}
    same, _ = sampler_correction(old, old, mask, "token_mask", 0.0, 3.0)
    assert torch.equal(grpo_loss(logp, old, None, adv, mask, norm, sampler_weight=same)[0],
                       grpo_loss(logp, old, None, adv, mask, norm)[0])
