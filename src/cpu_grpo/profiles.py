"""The named settings (`--profile`): plain dicts of config fields, applied before a --config file and the command line.
This module must not import torch."""

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# the 0.5B Qwen with LoRA, asked for the \boxed{} answers it was trained on, scored with DAPO's overlong shaping
_QWEN_LORA = dict(model="qwen2.5-coder-0.5b", use_lora=True, learning_rate=1e-4, instruction=BOXED_INSTRUCTION,
                  rewards=["correctness", "correct_format", "overlong"], reward_weights=[1.0, 0.2, 0.5],
                  max_new_tokens=256, eval_max_new_tokens=256)

# the intermediate stages: 8 prompts a step, problem types drawn by how often they fail, the hardest groups kept
_HARD = dict(prompts_per_step=8, prioritized_sampling=True, dynamic_sampling_keep="hardest")

PROFILES: dict[str, dict] = {
    # a few minutes on 2 cores: a smoke run that shows every part working, not a result
    "quick": dict(steps=8, prompts_per_step=4, num_generations=4, max_new_tokens=96, eval_size=40,
                  eval_max_new_tokens=160, save_every=4),
    # the demo: trained and evaluated on basic problems, <= 30 minutes on 2 cores; its format reward weighs as much as
    # the answer, so that the `#### N` it asks for is kept (at 0.2, six of eight runs dropped it: results/demo-format)
    "demo": dict(reward_weights=[1.0, 1.0]),
    # the curriculum on the 0.5B Qwen with LoRA and the \boxed{} instruction it was trained on (SmolLM2-135M learns
    # nothing multi-step): intermediate at 2e-4, then at 1e-4, then with basic replayed; advanced at 320 tokens (where
    # every answer the base model gets right fits) with intermediate replayed; EWC at lambda 0.1; DAPO's overlong
    # shaping and dynamic sampling; every level evaluated before and after, <= 2 h on 2 cores (docs/findings.md)
    "default": dict(**_QWEN_LORA,
                    stages=["basic:2", dict(name="intermediate", steps=4, learning_rate=2e-4, **_HARD),
                            dict(name="intermediate-1e-4", task="intermediate", steps=3, **_HARD),
                            dict(name="replay", task="basic+intermediate", steps=3, **_HARD),
                            dict(name="advanced", task="intermediate+advanced", steps=7, max_new_tokens=320,
                                 prompts_per_step=8)],
                    steps=19, prompts_per_step=4, fisher_samples=16, dynamic_sampling=2, eval_size=200,
                    eval_every_stage=False, ewc_lambda=0.1),
    # the default profile's model on GSM8K's train file, evaluated on its first 500 test problems (the same at every
    # seed) at 256 tokens, where the base model finishes 45% of its answers (results/LOG.md, 2026-11-25)
    "gsm8k": dict(**_QWEN_LORA, task="gsm8k", steps=24, prompts_per_step=4, dynamic_sampling=2, eval_size=500),
}
