"""One row of any task (`Example`): its prompt, its reference answer, where it came from, its split, and the
columns a reward function reads by name."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Example:
    """One problem. Math problems (the generated levels, GSM8K-format rows) have a numeric answer, are asked with
    the run's instruction appended and get the math metrics; a row of your own (`math=False`) is asked as its
    prompt says, and its columns reach the reward functions by name."""

    question: str  # the prompt's text (chat prompts: their messages' contents, one per line)
    answer: str  # math: the canonical number ("18", "3.5", "-4"); a row of your own: its `answer` column, or ""
    difficulty: str  # "basic" | "intermediate" | "advanced" | "gsm8k" | the row's level column | the task's name
    solution: str = ""  # GSM8K style: "16 - 3 = <<16-3=13>>13" lines, then "#### 13"
    id: str = ""  # "basic-train-17", "test.jsonl:42"
    template: str = ""  # the generator's problem type (template_name), "" for problems from files
    messages: tuple = ()  # a chat prompt (TRL's conversational format); empty: `question` is the user turn
    columns: dict = field(default_factory=dict, compare=False, hash=False)  # the row's other columns
    math: bool = True  # numeric answer, math metrics, the instruction appended
    split: str = ""  # "train": a run on its task trains on it (or on its twin); "test": held out; "": not known

    def chat(self, instruction: str = "", system: str = "") -> list[dict]:
        """The prompt as chat messages: a system turn when given (and the prompt has none), then the row's own
        messages, or the question as the user turn (with `instruction` appended for math problems)."""
        turns = list(self.messages) or [{"role": "user", "content": f"{self.question}\n{instruction}".strip()
                                         if instruction and self.math else self.question}]
        has_system = any(t.get("role") == "system" for t in turns)
        return ([{"role": "system", "content": system}] if system and not has_system else []) + turns
