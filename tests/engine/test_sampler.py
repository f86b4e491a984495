"""The fast sampler must not change the math: greedy equals generate(), seeded sampling replays, fast
training log-probs equal a plain HF forward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from cpu_grpo.engine import llama, projections
from cpu_grpo.engine.batching import group_logprobs
from cpu_grpo.engine.sampler import Sampler, Sampling
from cpu_grpo.engine.sampling import SAMPLE_BLOCK, sample_token, sample_work

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 12, 13]]


@pytest.fixture(params=["tiny_model", "tiny_qwen"])
def model(request):
    return AutoModelForCausalLM.from_pretrained(request.getfixturevalue(request.param)).eval()


def hf_greedy(model, prompt, n, eos):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos)[0, len(prompt):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


def test_fast_path_is_used(model):
    assert Sampler(model, dtype=torch.float32).fast


def test_greedy_matches_generate_token_for_token(model):
    eos = model.config.eos_token_id
    sampler = Sampler(model, dtype=torch.float32)
    out = sampler.generate(PROMPTS, 2, Sampling(20, (eos,), model.config.pad_token_id, temperature=0))
    assert len(out) == 6
    for i, p in enumerate(PROMPTS):
        ref = hf_greedy(model, p, 20, eos)
        assert out[2 * i] == ref and out[2 * i + 1] == ref  # both rows of a group, left padding included


def test_prefill_in_parts_writes_the_same_cache(model, monkeypatch):
    """A long batch's prompts are prefilled a few at a time into slices of one cache: the tokens are the same."""
    from cpu_grpo.engine import sampler as sampler_mod

    monkeypatch.setattr(sampler_mod, "PREFILL_TOKENS", 1)  # one prompt a call
    eos = model.config.eos_token_id
    out = Sampler(model, dtype=torch.float32).generate(PROMPTS, 1, Sampling(20, (eos,), model.config.pad_token_id,
                                                                            temperature=0))
    assert out == [hf_greedy(model, p, 20, eos) for p in PROMPTS]


def test_greedy_stops_at_eos_and_keeps_it(model):
    sampler = Sampler(model, dtype=torch.float32)
    first = sampler.generate(PROMPTS[:1], 1, Sampling(20, (0,), 0, temperature=0))[0]
    eos = first[3]  # pretend the 4th greedy token is the end of sequence
    out = sampler.generate(PROMPTS[:1], 1, Sampling(20, (eos,), 0, temperature=0))[0]
    assert out == first[:first.index(eos) + 1]


def test_seeded_sampling_replays_and_differs_across_seeds(model):
    sampler = Sampler(model, dtype=torch.float32)
    run = [sampler.generate(PROMPTS, 4, Sampling(12, (0,), 0), torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert run[0] == run[1]
    assert run[0] != run[2]
    assert len({tuple(c) for c in run[0][:4]}) > 1  # a group's samples differ from each other


def test_bf16_copy_follows_the_policy_after_refresh(model):
    sampler = Sampler(model)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert not torch.allclose(sampler.net.lm_head.weight.float(), model.lm_head.weight, atol=1e-2)
    sampler.refresh()
    assert torch.allclose(sampler.net.lm_head.weight.float(), model.lm_head.weight, atol=2e-2)


def test_sample_token_respects_top_k_and_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0001]])).repeat(20000, 1)
    tok = sample_token(logits, 1.0, 0, 1.0, g)
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.015)
    assert sample_token(logits[:1000], 1.0, 2, 1.0, g).max() <= 1  # top-2 keeps tokens 0 and 1
    assert sample_token(logits[:1000], 1.0, 0, 0.6, g).max() <= 1  # 0.5 + 0.3 reaches top_p 0.6
    assert (sample_token(logits[:5], 0.0, 0, 1.0, g) == 0).all()  # temperature 0: greedy


def test_sample_token_across_blocks():
    """The two-level draw: words at both edges of blocks, in a vocabulary that is not a whole number of blocks,
    drawn as often as their tempered probabilities say, with a shared work buffer of more rows."""
    words = torch.tensor([5, SAMPLE_BLOCK - 1, SAMPLE_BLOCK, 2 * SAMPLE_BLOCK - 1, 2 * SAMPLE_BLOCK + 451])
    logits = torch.full((40000, 2 * SAMPLE_BLOCK + 452), -30.0)
    logits[:, words] = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25]))
    g = torch.Generator().manual_seed(0)
    tok = sample_token(logits.bfloat16(), 0.5, 0, 1.0, g, sample_work(50000, logits.shape[1]))
    freq = torch.bincount(tok, minlength=logits.shape[1]).float() / len(tok)
    want = (logits[0] / 0.5).softmax(-1)
    assert freq[words].sum() > 0.999
    assert torch.allclose(freq[words], want[words], atol=0.01)
    again = sample_token(logits.bfloat16(), 0.5, 0, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(tok, again)  # seeded: the same draws with or without a kept buffer


def test_group_logprobs_fast_path_matches_full_forward(model):
    completions = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 9], [12, 13, 14, 15, 16], []]
    fast, mask = group_logprobs(model, PROMPTS, completions, [0, 1, 2], 2, 0, 1.0, autocast=False)
    for i, c in enumerate(completions):
        p = PROMPTS[i // 2]
        logits = model(torch.tensor([p + c])).logits[0, len(p) - 1:-1] if c else None
        if c:
            ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            assert torch.allclose(fast[i, :len(c)], ref, atol=1e-5)
        assert mask[i].sum() == len(c)  # padding never counts


def test_group_logprobs_gradients_match_hf_path(model, monkeypatch):
    completions = [[1, 2, 3], [4, 5], [5, 6, 7, 8], [9, 9, 9], [12, 13], [14]]
    grads = []
    for fast in (True, False):
        monkeypatch.setattr(llama, "supports", lambda m, fast=fast: fast)
        model.zero_grad()
        lp, mask = group_logprobs(model, PROMPTS, completions, [0, 1, 2], 2, 0, 1.0, autocast=False)
        (lp * mask).sum().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_bf16_logprobs_close_to_fp32(model):
    completions = [[1, 2, 3, 4, 5, 6]] * 2
    lp32, _ = group_logprobs(model, PROMPTS[:1], completions, [0], 2, 0, 1.0, autocast=False)
    lp16, _ = group_logprobs(model, PROMPTS[:1], completions, [0], 2, 0, 1.0, autocast=True)
    assert (lp32 - lp16).abs().max() < 0.1  # stated tolerance for bf16 autocast on a random tiny model


def test_tied_embeddings_reach_the_rollout_copy(tiny_model):
    """SmolLM2 ties lm_head to the embeddings; the copy is built from the config and must get both."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = base.config
    cfg.tie_word_embeddings = True
    model = type(base)(cfg).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    eos = cfg.eos_token_id
    out = Sampler(model, dtype=torch.float32).generate(PROMPTS[:1], 1, Sampling(12, (eos,), cfg.pad_token_id, 0))
    assert out[0] == hf_greedy(model, PROMPTS[0], 12, eos)


def test_parts_of_a_group_add_up_to_the_whole_group(model):
    """Micro-batches smaller than a group give the same log-probs and gradient, whether each part runs the prompt
    again or the group's prompt runs once for all its parts (SharedPrompts)."""
    from cpu_grpo.engine.batching import SharedPrompts, micro_batches

    completions = [[1, 2, 3], [4, 5], [5, 6, 7, 8], [9], [12, 13], [14], [3, 3, 3, 3, 3], [7, 8]]  # 2 groups of 4
    weights = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    results = []
    for rows, share in ((8, False), (4, False), (3, False), (3, True), (1, True)):
        model.zero_grad()
        parts = list(micro_batches([0, 1], 4, rows, [len(c) for c in completions]))
        assert sorted(i * 4 + j for p, samples in parts for i in p for j in samples) == list(range(8))
        shared = SharedPrompts(model, PROMPTS, 0, autocast=False) if share else None
        assert SharedPrompts.fit(model, rows, 4) == (rows < 4)
        logps = {}
        for part, samples in parts:
            lp, mask = group_logprobs(model, PROMPTS, completions, list(part), 4, 0, 1.0, autocast=False,
                                      samples=samples, prefix=shared.prefix(part) if shared else None)
            idx = [i * 4 + j for i in part for j in samples]
            (lp * mask * weights[idx, :lp.shape[1]]).sum().backward()
            for k, r in enumerate(idx):
                logps[r] = lp[k, :len(completions[r])].detach()
        if shared:
            shared.close()
        layer = model.model.layers[0]
        results.append((logps, [p.grad.clone() for p in (layer.mlp.up_proj.weight, layer.self_attn.k_proj.weight,
                                                         model.model.embed_tokens.weight)]))
    for logps, grads in results[1:]:
        assert all(torch.allclose(logps[r], results[0][0][r], atol=1e-5) for r in range(8))
        # fp32 sums in another order: differences of ~1e-6 of the gradient's largest entry (the embeddings' reaches
        # 28 in this model: 1.9e-5 seen on an AMD EPYC); a prompt's gradient missing or counted twice is O(1)
        assert all(torch.allclose(g, g0, atol=1e-5 * max(1.0, float(g0.abs().max())))
                   for g, g0 in zip(grads, results[0][1], strict=True))
    assert results[-1][1][2][11].abs().sum() > 0  # token 11 is in a prompt only: the kept pass's backward ran


def test_released_copy_comes_back_with_the_policy_weights(model):
    sampler = Sampler(model, dtype=torch.float32)
    before = sampler.generate(PROMPTS, 2, Sampling(8, (0,), 0, temperature=0))
    sampler.release()
    assert all(p.numel() == 0 for p in sampler.net.parameters())
    assert sampler.generate(PROMPTS, 2, Sampling(8, (0,), 0, temperature=0)) == before  # refreshed on demand


def _lora(path, dtype):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_lora_is_sampled_unmerged_from_the_policy_itself(tiny_qwen):
    """LoRA on a base already in the sampling dtype: no copy; greedy equals generate() on the peft model, before
    and after the adapters change."""
    model = _lora(tiny_qwen, torch.float32)
    sampler = Sampler(model, dtype=torch.float32)
    assert sampler.unmerged and sampler.net is model.get_base_model()
    eos = model.config.eos_token_id
    for _ in range(2):
        sampler.release()  # nothing to free: the next generate() must still see the policy
        out = sampler.generate(PROMPTS, 2, Sampling(12, (eos,), model.config.pad_token_id, temperature=0))
        for i, p in enumerate(PROMPTS):
            assert out[2 * i] == out[2 * i + 1] == hf_greedy(model, p, 12, eos)
        with torch.no_grad():
            for name, w in model.named_parameters():
                if "lora_B" in name:
                    w.add_(0.3 * torch.randn_like(w))
        sampler.refresh()


def test_lora_copy_shares_the_frozen_base_and_merges_the_adapters(tiny_qwen):
    """A copy of a LoRA policy (copy=True, or an architecture without the fast path) shares the weights without
    an adapter (embeddings, output layer, norms) with the policy and merges the adapted ones."""
    model = _lora(tiny_qwen, torch.bfloat16)
    assert Sampler(model, dtype=torch.bfloat16).unmerged
    sampler = Sampler(model, dtype=torch.bfloat16, copy=True)
    net, inner = sampler.net, model.get_base_model()
    assert not sampler.unmerged
    assert _shares(net.model.embed_tokens.weight, inner.model.embed_tokens.weight)
    assert _shares(net.lm_head.weight, inner.lm_head.weight)
    assert _shares(net.model.norm.weight, inner.model.norm.weight)
    q_copy, q_base = net.model.layers[0].self_attn.q_proj.weight, inner.model.layers[0].self_attn.q_proj
    assert not _shares(q_copy, q_base.base_layer.weight)
    assert torch.equal(q_copy, (q_base.base_layer.weight + q_base.get_delta_weight("default")).bfloat16())
    with torch.no_grad():
        q_base.lora_B["default"].weight.add_(0.5)
    sampler.release()
    sampler.refresh()
    q_copy = net.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q_copy, (q_base.base_layer.weight + q_base.get_delta_weight("default")).bfloat16())
    assert _shares(net.model.embed_tokens.weight, inner.model.embed_tokens.weight)


def test_full_fine_tuning_copy_shares_nothing(model):
    sampler = Sampler(model, dtype=torch.bfloat16)
    theirs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert not any(p.untyped_storage().data_ptr() in theirs for p in sampler.net.parameters())


def test_packed_projection_equals_linear():
    """A weight packed for oneDNN (projections.pack) gives F.linear's result bit for bit, at any number of rows; where
    oneDNN does not run, pack says so (None) and sampling keeps F.linear."""
    w, b = torch.randn(96, 40).bfloat16(), torch.randn(96).bfloat16()
    packed = projections.pack(w)
    if packed is None:
        pytest.skip("no oneDNN bf16 linear on this build or machine")
    for rows in (1, 7, 64):
        x = torch.randn(rows, 40).bfloat16()
        assert torch.equal(projections.Proj(w, b, packed=packed)(x), torch.nn.functional.linear(x, w, b))
    assert projections.pack(w.float()) is None  # fp32 sampling keeps F.linear


def test_sampler_release_drops_packed_weights_and_samples_again(model):
    sampler = Sampler(model)
    prompts = [PROMPTS[0]]
    before = sampler.generate(prompts, 2, Sampling(5, (), 0), torch.Generator().manual_seed(3))
    sampler.release()
    assert sampler.projs is None and sampler.head is None
    assert sampler.generate(prompts, 2, Sampling(5, (), 0), torch.Generator().manual_seed(3)) == before


def test_a_role_the_chat_template_refuses_is_one_sentence(tiny_model):
    """A chat template that raises on a role (as Gemma's and Mistral's do) gave jinja2's TemplateError, in eval
    and train alike."""
    from transformers import AutoTokenizer

    from cpu_grpo.engine.prompts import encode_prompts
    from cpu_grpo.errors import UserError

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                         "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
                         "{{ m['content'] }}{% endfor %}")
    assert encode_prompts(tok, [[{"role": "user", "content": "hi"}]])
    with pytest.raises(UserError, match=r"the model's chat template refuses a prompt with the roles system, user "
                                        r"\(Conversation roles must alternate user/assistant\): give the prompts"):
        encode_prompts(tok, [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]])


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place_and_in_a_log_lines(monkeypatch, capsys):
    from cpu_grpo.engine import progress

    monkeypatch.setattr(progress, "BAR_EVERY", 0.0)
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)
    tick = progress.ProgressLines(print, "  eval batch 1/1", bar=True)
    for done in (5, 10):
        tick(done, 20)
    tick.end()
    out = capsys.readouterr().out
    assert out.startswith("\r  eval batch 1/1: [#####...............] 5/20 ") and out.count("\r") == 2
    assert "[##########..........] 10/20 " in out and out.endswith("\n") and out.count("\n") == 1
    lines = []
    tick = progress.ProgressLines(lines.append, "  eval batch 1/1")  # not a terminal: one line a tick
    tick(5, 20)
    tick.end()
    assert len(lines) == 1 and lines[0].startswith("  eval batch 1/1: token 5 of at most 20, ")


def test_a_conversation_goes_on_in_each_rows_cache_as_sampling_it_again_would(model):
    """Rows given tokens when a turn ends (a tool's result) write on from their own KV cache, beside the rows still
    writing: greedy, the same tokens and the same turns as sampling each turn again from the prompt and the
    conversation so far (in_rounds); a row's opening is fed before it writes."""
    import dataclasses

    from cpu_grpo.engine.conversation import Conversation, in_rounds

    eos = model.config.eos_token_id
    sampler = Sampler(model, dtype=torch.float32)
    plain = Sampling(30, (eos,), model.config.pad_token_id, temperature=0)
    written = [t for out in sampler.generate(PROMPTS, 1, plain) for t in out[1:]]
    stops = sorted(set(written), key=written.count)[-3:]  # words the model writes often: turns end there
    sampling = dataclasses.replace(plain, stops=(eos, *stops))

    def run(generate):
        turns = []

        def then(r, turn):
            turns.append((r, turn))
            return [17 + r, 18, 19] if sum(t[0] == r for t in turns) <= 2 else None

        opening = [[], [21, 22], [], [], [23], []]
        return generate(Conversation(opening, then)), sorted(turns)

    def once(prompts, k, limit):
        return sampler.generate(prompts, k, dataclasses.replace(sampling, max_new_tokens=limit))

    fast, fast_turns = run(lambda c: sampler.generate(PROMPTS, 2, sampling, conversation=c))
    again, again_turns = run(lambda c: in_rounds(once, PROMPTS, 2, 30, sampling.stops, c))
    assert fast == again and fast_turns == again_turns
    assert len(fast_turns) > 6 and fast[1][:2] == [21, 22] and fast[4][0] == 23  # rows went on; openings first


def test_an_int8_projection_is_within_int8_rounding_of_bf16():
    """Weights per output channel and each row of x in int8 (oneDNN's u8 x s8 matmul): within ~1% of exact."""
    from cpu_grpo.engine.projections import Proj, quantize

    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=gen).bfloat16(), torch.randn(96, generator=gen)
    x = torch.randn(5, 64, generator=gen).bfloat16() * torch.tensor([[0.01], [1], [10], [100], [1]]).bfloat16()
    q = quantize(w)
    if q is None:
        pytest.skip("oneDNN's int8 matmul is not on offer here")
    exact = x.float() @ w.float().t() + b
    y = Proj(w, b, int8=q)(x).float()
    assert y.dtype == torch.float32 and y.shape == exact.shape
    assert ((y - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.02  # each row: its own scale


def test_an_int8_sampler_quantizes_a_frozen_base_once(tiny_qwen):
    """LoRA on a bf16 base sampled in int8: the base's int8 weights are made once, not at every refresh."""
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"), autocast_adapter_dtype=True)
    sampler = Sampler(model, int8=True)
    if not sampler.quantized or next(iter(sampler.quantized.values())) is None:
        pytest.skip("oneDNN's int8 matmul is not on offer here")
    made = dict(sampler.quantized)
    sampler.refresh()
    assert sampler.quantized == made and sampler.projs[0].qkv.int8 is made[id(sampler.fused[0][0])]
    eos = model.config.eos_token_id
    out = sampler.generate(PROMPTS, 2, Sampling(8, (eos,), model.config.pad_token_id, temperature=0))
    assert len(out) == 6 and all(out)


def test_the_samplers_logprobs_are_the_trainers_at_the_temperature(model):
    """With `logprobs`, each sampled token's log-prob under the sampler (fp32 here) equals the training pass's
    log-prob of the same completion at the same temperature."""
    import dataclasses

    eos = model.config.eos_token_id
    sampling = Sampling(12, (eos,), model.config.pad_token_id, temperature=0.7, logprobs=True)
    comps, lps = Sampler(model, dtype=torch.float32).generate(PROMPTS, 2, sampling, torch.Generator().manual_seed(0))
    assert [len(c) for c in comps] == [len(x) for x in lps]
    trained, mask = group_logprobs(model, PROMPTS, comps, [0, 1, 2], 2, model.config.pad_token_id, 0.7, False)
    for i, row in enumerate(lps):
        assert torch.allclose(torch.tensor(row), trained[i, :len(row)].detach(), atol=1e-4)
    plain = Sampler(model, dtype=torch.float32).generate(PROMPTS, 2, dataclasses.replace(sampling, logprobs=False),
                                                        torch.Generator().manual_seed(0))
    assert plain == comps  # keeping them changes nothing sampled
