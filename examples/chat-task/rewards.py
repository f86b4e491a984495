"""A reward of your own, with TRL's signature: it reads the `solution` column of data.jsonl."""


def capital_reward(completions, solution, **kwargs):
    """1.0 where the completion's last line is 'Answer: <the capital>' (chat completions: the last message)."""
    out = []
    for completion, city in zip(completions, solution, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        out.append(float(bool(lines) and lines[-1].lower().rstrip(".") == f"answer: {city.lower()}"))
    return out
