"""cpu-grpo: GRPO fine-tuning of small language models, fast on a CPU."""

__version__ = "0.1.0"
