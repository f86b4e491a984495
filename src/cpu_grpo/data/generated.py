"""Two generated tasks of your-own-task shape (a prompt and columns for the reward, no numeric answer): `countdown`
(TinyZero's: reach a target with each given number once, scored by `countdown_reward`) and `code` (small Python
functions, scored by running them against the row's unit tests in a sandbox: `code_reward`). Seeded, with a
held-out split by a hash of the prompt, like the math levels; each row's answer is one reference solution. The code
task's rows take its templates in turn, so that no template fills the held-out set (drawn at random, two templates
with many parameters made 87% of it; now none is over 16% of 200 held-out rows)."""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Callable

from .example import Example
from .tasks import TaskError, split_of

COUNTDOWN_PROMPT = ("Using the numbers {nums}, create an equation that equals {target}. You can use +, -, * and / and "
                    "each number exactly once. Think it through, then give the equation in <answer> </answer> tags, "
                    "for example <answer> (1 + 2) * 3 </answer>.")
CODE_PROMPT = ("Write a Python function `{signature}` that {what}. Answer with the function in one ```python code "
               "block.")


Drawn = tuple[str, dict, str, str]  # prompt, columns for the reward, reference answer, kind (level or template)


def _countdown(rng: random.Random) -> Drawn | None:
    """(prompt, columns, reference equation, level): 3 or 4 numbers and a target some equation of them reaches."""
    k = rng.choice((3, 4))
    nums = [rng.randint(1, 25) for _ in range(k)]
    items = [(str(n), n) for n in nums]
    while len(items) > 1:  # join two random terms until one is left: an equation using every number once
        (ea, a), (eb, b) = items.pop(rng.randrange(len(items))), items.pop(rng.randrange(len(items)))
        op = rng.choice("+-*/")
        if op == "/" and (b == 0 or a % b):
            op = "+"
        if op == "-" and a < b:
            (ea, a), (eb, b) = (eb, b), (ea, a)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        items.append((f"({ea} {op} {eb})", value))
    equation, target = items[0]
    if not 1 <= target <= 200:
        return None
    columns = {"nums": sorted(nums), "target": target}
    return COUNTDOWN_PROMPT.format(nums=sorted(nums), target=target), columns, equation[1:-1], f"countdown-{k}"


# name, signature, what it does (formatted with the parameters), parameters, reference, an input generator (of the
# parameters too)
CodeTemplate = tuple[str, str, str, Callable, Callable, Callable]
_INTS = lambda r, p: [r.randint(-20, 40) for _ in range(r.randint(0, 7))]  # noqa: E731
_INTS_AND_MULTIPLES = lambda r, p: _INTS(r, p) + [p["k"] * r.randint(-3, 3) for _ in range(r.randint(0, 2))]  # noqa: E731
_INTS_AND_OUTSIDE = lambda r, p: _INTS(r, p) + r.sample(  # noqa: E731
    [r.randint(p["lo"] - 20, p["lo"] - 1), r.randint(p["hi"] + 1, p["hi"] + 20)], r.randint(0, 2))
_WORDS = lambda r, p: " ".join(r.choice(["apple", "sky", "banana", "kiwi", "tree", "a", "river"])  # noqa: E731
                            for _ in range(r.randint(1, 6)))
CODE_TEMPLATES: list[CodeTemplate] = [
    ("add_k", "add_k(xs)", "returns a new list with {k} added to every element of the list of integers xs",
     lambda r: {"k": r.randint(2, 999)}, lambda p, xs: [x + p["k"] for x in xs], _INTS),
    ("sum_multiples", "sum_multiples(xs)", "returns the sum of the elements of xs that are divisible by {k}",
     lambda r: {"k": r.randint(2, 199)}, lambda p, xs: sum(x for x in xs if x % p["k"] == 0), _INTS_AND_MULTIPLES),
    ("count_char", "count_char(s)", "returns how many times the letter '{c}' occurs in the string s",
     lambda r: {"c": r.choice("abeiklnprstwy")}, lambda p, s: s.count(p["c"]), _WORDS),
    ("long_words", "long_words(s)", "returns the number of words in the sentence s that have more than {k} letters",
     lambda r: {"k": r.randint(1, 5)}, lambda p, s: sum(len(w) > p["k"] for w in s.split()), _WORDS),
    ("clamp", "clamp(xs)", "returns xs with every element below {lo} replaced by {lo} and every element above {hi} "
     "replaced by {hi}", lambda r: {"lo": r.randint(-20, 9), "hi": r.randint(10, 40)},
     lambda p, xs: [min(max(x, p["lo"]), p["hi"]) for x in xs], _INTS_AND_OUTSIDE),
    ("running_total", "running_total(xs)", "returns the list of running sums of xs, each multiplied by {k}",
     lambda r: {"k": r.randint(2, 199)}, lambda p, xs: [p["k"] * sum(xs[:i + 1]) for i in range(len(xs))], _INTS),
    ("repeat_chars", "repeat_chars(s)", "returns the string s with every character repeated {k} times",
     lambda r: {"k": r.randint(2, 6)}, lambda p, s: "".join(ch * p["k"] for ch in s), _WORDS),
    ("sequence", "sequence(n)", "returns the n-th term (counting from 0) of the sequence that starts at {a} and in "
     "which every term is {m} times the one before plus {b}",
     lambda r: {"a": r.randint(0, 20), "m": r.randint(2, 4), "b": r.randint(1, 9)},
     lambda p, n: _term(p, n), lambda r, p: r.randint(0, 8)),
    ("second_largest", "second_largest(xs)", "returns the second largest distinct value in xs, or {d} when xs has "
     "fewer than two distinct values", lambda r: {"d": r.choice([None, r.randint(-100, 999)])},
     lambda p, xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else p["d"], _INTS),
    ("shift_letters", "shift_letters(s)", "returns s with every lowercase letter moved {k} places forward in the "
     "alphabet (z wraps around to a) and every other character unchanged", lambda r: {"k": r.randint(1, 25)},
     lambda p, s: "".join(chr((ord(c) - 97 + p["k"]) % 26 + 97) if c.islower() else c for c in s), _WORDS),
]


def _term(p: dict, n: int) -> int:
    value = p["a"]
    for _ in range(n):
        value = value * p["m"] + p["b"]
    return value


def _code(template: CodeTemplate, rng: random.Random) -> Drawn:
    """(prompt, columns, reference function, template): a function to write and 5 assert lines that test it."""
    name, signature, what, params, reference, inputs = template
    p = params(rng)
    cases = _telling_cases(rng, p, reference, inputs)
    tests = "\n".join(f"check({name}({arg!r}), {reference(p, arg)!r})" for arg in cases)
    prompt = CODE_PROMPT.format(signature=signature, what=what.format(**p))
    return prompt, {"tests": tests, "entry_point": name}, f"{name} with {p}", name


def _telling_cases(rng: random.Random, p: dict, reference: Callable, inputs: Callable, n: int = 5) -> list:
    """n inputs whose expected outputs tell a solution from a guess: no output more than twice (a constant passes at
    most two tests) and at most one output equal to its input (returning the input passes at most one), so that
    partial credit pays for the task (cases drawn at random let `clamp` pass with the list unchanged)."""
    cases = []
    for _ in range(200):
        cases = [inputs(rng, p) for _ in range(n)]
        outs = [repr(reference(p, arg)) for arg in cases]
        if max(map(outs.count, outs)) <= 2 and sum(o == repr(arg) for o, arg in zip(outs, cases, strict=True)) <= 1:
            break
    return cases


# each task's kinds, drawn in turn: countdown's one maker, one per code template
GENERATED: dict[str, list[Callable[[random.Random], Drawn | None]]] = {
    "countdown": [_countdown], "code": [functools.partial(_code, t) for t in CODE_TEMPLATES]}


def generate_task(task: str, n: int, seed: int = 0, split: str = "train") -> list[Example]:
    """Up to n distinct rows of a generated task from one split (fewer when the task has fewer: the code task has a
    few thousand); the same arguments give the same list."""
    if split not in ("train", "test"):
        raise TaskError(f"unknown split '{split}': use train or test.")
    rng = random.Random(seed ^ zlib.crc32(f"{task}/{split}".encode()))
    out: list[Example] = []
    seen: set[str] = set()
    kinds = list(GENERATED[task])  # drawn in turn; a kind leaves after 2000 draws in a row gave nothing new
    misses = dict.fromkeys(kinds, 0)
    while len(out) < n and kinds:
        kind = kinds[len(out) % len(kinds)]
        drawn = kind(rng)
        if drawn is None or drawn[0] in seen or split_of(drawn[0]) != split:
            misses[kind] += 1
            if misses[kind] == 2000:
                kinds.remove(kind)
            continue
        misses[kind] = 0
        seen.add(drawn[0])
        prompt, columns, reference, kind = drawn
        level = kind if task == "countdown" else "code"
        out.append(Example(prompt, reference, level, id=f"{task}-{split}-{len(out)}", template=kind,
                           columns=columns, math=False))
    if n and not out:
        raise TaskError(f"task '{task}' gave no {split} rows: a bug in its generator.")
    return out  # as many distinct rows as the task has, up to n (a run cycles through its training rows)
