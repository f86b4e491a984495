"""cpu-grpo: GRPO fine-tuning of small language models, fast on a CPU.

`from cpu_grpo import GRPOConfig, GRPOTrainer` is TRL's API (docs/python-api.md); imported on first use, so that
`cpu-grpo --help` stays fast.
"""

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer"]


def __getattr__(name: str):
    if name == "GRPOConfig":
        from .grpo_config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from .grpo_trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'cpu_grpo' has no attribute {name!r}")
