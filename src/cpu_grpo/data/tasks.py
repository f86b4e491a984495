"""Math word problems (rows of data/example.py): a seeded generator at three levels, and loaders for GSM8K-style
data; the grammar of a task spec (levels and parts joined with '+').

Each generated solution's ``<<expr=value>>`` annotations are recomputed with exact fractions and the
last one checked against an answer computed separately, so a gold answer is never wrong. Train and
test never overlap: a question's split is a fixed function of its text (crc32 % 5 == 0 -> "test").

>>> generate("basic", 3, seed=1) == generate("basic", 3, seed=1)
True
>>> canonical_number(Fraction(1, 3)), canonical_number(18.0)
('0.3333', '18')
"""

import ast
import itertools
import operator
import random
import re
import zlib
from fractions import Fraction

from ..errors import UserError
from .example import Example

LEVELS = ("basic", "intermediate", "advanced")
SPLITS = ("train", "test")
TEST_MOD = 5  # crc32(question) % TEST_MOD == 0 puts a question in the held-out test split
SHIPPED = ("gsm8k", "gsm8k-train")  # the datasets inside the package (loaders.DATASETS)
UNKNOWN = ("unknown task '{}': use one of basic, intermediate, advanced, mix, countdown, code, gsm8k, gsm8k-train, "
           "rg:NAME (a reasoning-gym task), "
           "levels joined by '+' (basic+intermediate, advanced+gsm8k), a data file (.jsonl, .json, .csv, .parquet), a "
           "dataset saved with save_to_disk, or hf:NAME.")


def parts_of(spec: str) -> list[str]:
    """The tasks a spec joins with '+' in equal shares (levels, reasoning-gym tasks, and the shipped GSM8K once:
    "intermediate+advanced+gsm8k"), else [spec]. A stage's task is held out as each of its parts ("mix" is one
    set, a third of each level)."""
    parts = spec.split("+")
    joined = (len(parts) > 1 and all(p in LEVELS or p in SHIPPED or p.startswith("rg:") for p in parts)
              and len(set(parts)) == len(parts)
              and sum(p in SHIPPED for p in parts) <= 1)  # gsm8k and gsm8k-train are the same problems
    return parts if joined else [spec]


def levels_of(spec: str) -> list[str]:
    """The levels a generated task draws from ("mix": all three; "basic+intermediate": those two), else []."""
    parts = list(LEVELS) if spec == "mix" else parts_of(spec)
    return parts if all(p in LEVELS for p in parts) else []


class TaskError(UserError):
    """A problem the user caused (bad level, path, data line); the message says what to do."""


def canonical_number(x: float | int | Fraction) -> str:
    """Exact decimal text rounded to at most 4 decimals: 18.0 -> "18", 3.5 -> "3.5", 1/3 -> "0.3333"."""
    f = x if isinstance(x, Fraction) else Fraction(repr(x)) if isinstance(x, float) else Fraction(x)
    if f.denominator == 1:
        return str(f.numerator)
    q = round(f * 10000)  # half to even
    whole, frac = divmod(abs(q), 10000)
    return ("-" if q < 0 else "") + str(whole) + (f".{frac:04d}".rstrip("0") if frac else "")


# ---------------------------------------------------------------------------- generator
_FEMALE = ("Aisha Beatriz Chloe Dana Elif Fatima Grace Hana Ingrid Jasmine Keiko Lucia Maya Nadia "
           "Olivia Priya Rosa Sofia Tamara Uma Valentina Wen Yara Zoe").split()
_MALE = ("Ahmed Bruno Carlos Diego Emeka Felix Hiro Ivan Jamal Kofi Liam Mateo Noah Omar Pavel Quinn "
         "Rahul Santiago Tariq Ethan Viktor Wei Xavier Yusuf").split()
_ITEMS = ("apples, oranges, pencils, stickers, marbles, cookies, books, cupcakes, toy cars, seashells, "
          "baseball cards, balloons, candles, notebooks, erasers, muffins, bananas, crayons, beads, stamps, "
          "comic books, roses, tomatoes, eggs, buttons, postcards, puzzles, socks, keychains, lemons, pens, "
          "plates, bracelets, lollipops").split(", ")
_PRICES = tuple("1 1.50 2 2.25 2.50 3 3.75 4 4.50 5 6 7.50 8 12".split())  # as written in questions
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_n = canonical_number


def _ev(expr: str) -> Fraction:
    """Evaluate a calculator annotation (numbers, + - * /, parentheses) exactly."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(node.value) if type(node.value) is int else Fraction(repr(node.value))
        raise ValueError(f"unsupported calculator expression: {expr}")

    return walk(ast.parse(expr, mode="eval").body)


def _fill(expr: str, env: dict[str, Fraction], values: list[Fraction]) -> str:
    """Put numbers into an expression: names from env, "#k" is the value of step k."""
    return re.sub(r"#(\d)|([a-z]\w*)", lambda g: _n(values[int(g[1]) - 1] if g[1] else env[g[2]]), expr)


def split_of(question: str) -> str:
    """"test" for a fifth of all questions, by a hash of the text (the same on every machine), else "train"."""
    return "test" if zlib.crc32(question.encode()) % TEST_MOD == 0 else "train"


def _context(r: random.Random) -> dict[str, str]:
    """A person with pronouns, a second person and two different items for one problem."""
    female = r.random() < 0.5
    name = r.choice(_FEMALE if female else _MALE)
    he, him, his = ("she", "her", "her") if female else ("he", "him", "his")
    item, item2 = r.sample(_ITEMS, 2)
    return dict(name=name, name2=r.choice([n for n in _FEMALE + _MALE if n != name]), he=he,
                He=he.capitalize(), him=him, his=his, item=item, item2=item2)


# A template is (numbers, question, steps, answer). numbers: name -> choices (a range or tuple) or an
# expression of earlier names; a draw with a number <= 0 is rejected. question and steps are formatted
# with _context and the numbers. A step is one solution line with its calculator expression in brackets,
# "#k" being the value of step k: "Left: [t-#1] {item}" -> "Left: 240 - 60 = <<240-60=180>>180 apples."
# answer: an expression computed apart from the steps; it must equal the last step's value.
Template = tuple[dict[str, range | tuple | str], str, list[str], str]
_STEP = re.compile(r"\[([^\]]+)\]")  # the calculator expression in a step


def _build(question: str, steps: list[str], env: dict[str, Fraction],
           answer: Fraction) -> tuple[str, str] | None:
    """(solution, answer text) after checking every step; None when the numbers are not nice."""
    lines: list[str] = []
    values: list[Fraction] = []
    for step in steps:
        m = _STEP.search(step)
        expr = _fill(m[1], env, values)
        v = _ev(expr)
        if v < 0 or (v * 10000).denominator != 1:  # negative, or more than 4 decimals
            return None
        values.append(v)
        s, pretty = _n(v), re.sub(r"(?<=[\d)])([-+*/])", r" \1 ", expr)
        lines.append(f"{step[:m.start()]}{pretty} = <<{expr}={s}>>{s}{step[m.end():]}.")
    if values[-1] != answer:
        raise RuntimeError(f"generator bug: steps give {_n(values[-1])}, not {_n(answer)}: {question}")
    if (answer * 100).denominator != 1:  # final answers have at most 2 decimals
        return None
    return "\n".join([*lines, f"#### {_n(answer)}"]), _n(answer)


# basic numbers stay small (sums up to 120, products up to 120): one operation a first-grader checks by hand,
# where a 135M model scores above zero and can learn; 3-digit operands left it flat at ~5% (docs/findings.md)
_ADD = dict(a=range(2, 61), b=range(2, 61))
_SUB = dict(b=range(1, 41), d=range(1, 51), a="b+d")
_MUL = dict(a=range(2, 11), b=range(2, 13))
_DIV = dict(b=range(2, 11), q=range(2, 13), a="b*q")

_BASIC: tuple[Template, ...] = (  # one operation
    (_ADD, "{name} has {a} {item}. {name2} gives {him} {b} more. How many {item} does {name} have now?",
     ["{name} has [a+b] {item}"], "b+a"),
    (_ADD, "{name} collected {a} {item} on Saturday and {b} on Sunday. How many {item} did {he} collect?",
     ["{He} collected [a+b] {item}"], "b+a"),
    (_ADD, "{name} spent ${a} on {item} and ${b} on a jacket. How much money did {he} spend in all?",
     ["{He} spent [a+b] dollars"], "b+a"),
    (_SUB, "{name} had {a} {item} and gave {b} of them to {name2}. How many {item} does {name} have left?",
     ["{name} has [a-b] {item} left"], "d"),
    (_SUB, "{name} has ${a} in {his} savings and spends ${b} on {item}. How many dollars are left?",
     ["{He} has [a-b] dollars left"], "d"),
    (_SUB, "{name} has {a} {item} and {name2} has {b}. How many more {item} does {name} have than {name2}?",
     ["{name} has [a-b] more {item}"], "d"),
    (_MUL, "{name} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {he} buy?",
     ["{He} buys [a*b] {item}"], "b*a"),
    (_MUL, "Every day for {a} days, {name} makes {b} {item}. How many {item} does {he} make in total?",
     ["{He} makes [a*b] {item}"], "b*a"),
    (_MUL, "A pack of {item} costs ${b}. How many dollars do {a} packs cost?",
     ["The packs cost [a*b] dollars"], "b*a"),
    (_DIV, "{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
     ["Each friend gets [a/b] {item}"], "q"),
    (_DIV, "There are {a} {item} packed in bags of {b}. How many bags are there?",
     ["There are [a/b] bags"], "q"),
    (_DIV, "{name} paid ${a} for {b} tickets to the fair. How many dollars did one ticket cost?",
     ["One ticket cost [a/b] dollars"], "q"),
)

_INTERMEDIATE: tuple[Template, ...] = (  # two or three steps
    (dict(k=range(2, 10), p=range(2, 11), bill=(20, 50, 100)),
     "{name} buys {k} packs of {item} at ${p} each and pays with a ${bill} bill. How much change does "
     "{he} get?",
     ["The {item} cost [k*p] dollars", "{He} gets [bill-#1] dollars in change"], "bill-p*k"),
    (dict(a=range(5, 201), b=range(2, 101), g=range(1, 150)),
     "{name} has {a} {item}. {He} gets {b} more from {name2}, then gives away {g}. How many {item} does "
     "{name} have now?", ["{He} has [a+b] {item}", "Then [#1-g] {item} are left"], "a-g+b"),
    (dict(k=range(2, 16), m=range(3, 25), e=range(1, 21)),
     "{name} has {k} boxes with {m} {item} in each box, plus {e} loose {item}. How many {item} does {he} "
     "have altogether?", ["The boxes hold [k*m] {item}", "Altogether [#1+e] {item}"], "m*k+e"),
    (dict(a=range(2, 13), b=range(2, 13), p=_PRICES, p2=_PRICES),
     "{name} buys {a} {item} for ${p} each and {b} {item2} for ${p2} each. How many dollars does {he} spend?",
     ["The {item} cost [a*p] dollars", "The {item2} cost [b*p2] dollars", "In total [#1+#2] dollars"],
     "b*p2+a*p"),
    (dict(k=range(2, 10), each=range(2, 31), a=range(1, 100), b="k*each-a"),
     "{name} has {a} {item} and buys {b} more. {He} shares all of them equally among {k} friends. How many "
     "{item} does each friend get?", ["{He} has [a+b] {item}", "Each friend gets [#1/k] {item}"], "each"),
    (dict(w=range(8, 31), h=range(2, 10), d=range(2, 7)),
     "{name} earns ${w} an hour selling {item}. {He} works {h} hours a day for {d} days. How much does {he} "
     "earn?", ["Each day {he} earns [w*h] dollars", "In {d} days {he} earns [#1*d] dollars"], "d*h*w"),
    (dict(a=range(2, 13), m=range(3, 21), b=range(2, 13), k=range(3, 21)),
     "{name} has {a} bags with {m} {item} each. {name2} has {b} bags with {k} {item} each. How many more "
     "{item} does {name} have?", ["{name} has [a*m] {item}", "{name2} has [b*k] {item}",
                                  "The difference is [#1-#2] {item}"], "a*m-b*k"),
    (dict(a=range(3, 61), k=range(2, 7)),
     "{name} has {a} {item}. {name2} has {k} times as many {item} as {name}. How many {item} do they have "
     "together?", ["{name2} has [k*a] {item}", "Together they have [a+#1] {item}"], "a*(k+1)"),
    (dict(w=range(5, 41), weeks=range(2, 21), s=range(10, 201), cost="s+w*weeks"),
     "{name} wants a bike that costs ${cost}. {He} has saved ${s} and saves ${w} each week from selling "
     "{item}. How many weeks until {he} can buy the bike?",
     ["{He} still needs [cost-s] dollars", "That takes [#1/w] weeks"], "weeks"),
    (dict(p=range(5, 41), d=range(2, 11), extra=range(1, 201), total="p*d+extra"),
     "A book about {item} has {total} pages. {name} reads {p} pages a day for {d} days. How many pages are "
     "left to read?", ["{He} reads [p*d] pages", "Left to read: [total-#1] pages"], "extra"),
)

_ADVANCED: tuple[Template, ...] = (  # four or more steps with percentages, fractions or rates
    (dict(p=(10, 20, 25, 40, 50, 60, 75), k=(2, 3, 4, 5), x=range(1, 16), t="20*k*x", w=range(1, 40)),
     "A shop has {t} {item}. It sells {p}% of them on Monday and 1/{k} of the remaining {item} on Tuesday. "
     "On Wednesday {name} buys {w} more. How many {item} does the shop have left?",
     ["On Monday the shop sells [t*p/100] {item}", "After Monday it has [t-#1] {item}",
      "On Tuesday it sells [#2/k] {item}", "After Tuesday it has [#2-#3] {item}",
      "After {name} buys {w}, it has [#4-w] {item} left"], "t*(1-p/100)*(1-1/k)-w"),
    (dict(v1=range(30, 91, 5), h=range(2, 6), v2=range(20, 81, 4), m=(12, 15, 24, 30, 36, 45, 48, 90, 105)),
     "{name} drives at {v1} miles per hour for {h} hours, then at {v2} miles per hour for {m} minutes. "
     "How many miles does {he} drive in total?",
     ["First {he} drives [v1*h] miles", "{m} minutes is [m/60] hours", "Then {he} drives [v2*#2] miles",
      "In total [#1+#3] miles"], "v1*h+v2*m/60"),
    (dict(k=range(2, 13), p=_PRICES, d=(5, 10, 15, 20, 25, 40, 50), fee=range(2, 16)),
     "{name} orders {k} {item} at ${p} each. The store takes {d}% off the total, then adds a ${fee} delivery "
     "fee. How many dollars does {he} pay?",
     ["The {item} cost [k*p] dollars", "The discount is [#1*d/100] dollars", "Discounted: [#1-#2] dollars",
      "With delivery [#3+fee] dollars"], "k*p*(100-d)/100+fee"),
    (dict(a=(3, 4, 5), p=(10, 20, 25, 30, 40, 50), x=range(300, 1500, 20), s="a*x"),
     "{name} earns ${s} a month. {He} spends 1/{a} of it on rent and {p}% of the rest on food, and saves "
     "half of what is left. How many dollars does {he} save?",
     ["Rent is [s/a] dollars", "After rent [s-#1] dollars are left", "Food costs [#2*p/100] dollars",
      "After food [#2-#3] dollars are left", "{He} saves [#4/2] dollars"], "s*(a-1)/a*(100-p)/200"),
    (dict(m=(2, 3, 4, 5, 6, 10, 12, 15, 20, 30), h=range(2, 9), b=range(10, 70, 10), p=(10, 20, 30, 40)),
     "A machine packs {b} {item} every {m} minutes. It runs for {h} hours, and {p}% of what it packs is "
     "damaged. How many undamaged {item} does it pack?",
     ["{h} hours is [h*60] minutes", "It packs [#1/m] times", "That is [#2*b] {item}",
      "Damaged: [#3*p/100] {item}", "Undamaged: [#3-#4] {item}"], "h*60/m*b*(100-p)/100"),
    (dict(k=range(3, 8), others="k-1", m=range(8, 36), t=(10, 15, 18, 20, 25)),
     "{name} and {others} friends each order a meal that costs ${m}. They add a {t}% tip and split the "
     "total equally. How many dollars does each person pay?",
     ["The meals cost [k*m] dollars", "The tip is [#1*t/100] dollars", "The total is [#1+#2] dollars",
      "Each person pays [#3/k] dollars"], "m*(100+t)/100"),
    (dict(g=(2, 3, 4, 5), f=range(1, 5), boys_part="g-f", u=range(20, 201, 20), total="g*u",
          p=(10, 20, 25, 50), k=(2, 4, 5)),
     "{name}'s school has {total} students, and {f}/{g} of them are girls. {p}% of the girls and 1/{k} of "
     "the boys collect {item}. How many students collect {item}?",
     ["There are [total*f/g] girls", "There are [total-#1] boys", "Girls who collect: [#1*p/100]",
      "Boys who collect: [#2/k]", "In total [#3+#4] students"], "f*u*p/100+boys_part*u/k"),
    (dict(use=("4", "5", "5.5", "6", "6.5", "7", "7.5", "8", "9", "10"), d=range(20, 301, 10),
          price=("1.20", "1.25", "1.40", "1.50", "1.60", "1.75", "1.80", "2")),
     "{name}'s car uses {use} liters of fuel per 100 km, and fuel costs ${price} per liter. How many dollars "
     "of fuel does a round trip to a town {d} km away cost?",
     ["The round trip is [d*2] km", "That is [#1/100] hundreds of km", "The car uses [#2*use] liters",
      "The fuel costs [#3*price] dollars"], "2*d*use*price/100"),
    (dict(p=range(20, 401, 10), up=(10, 20, 25, 50), down=(10, 20, 25, 40), k=range(2, 7)),
     "A box of {item} costs ${p}. The price goes up by {up}%, and later the new price drops by {down}%. "
     "How many dollars does {name} pay for {k} boxes at the final price?",
     ["The increase is [p*up/100] dollars", "The new price is [p+#1] dollars",
      "The drop is [#2*down/100] dollars", "Now it costs [#2-#3] dollars", "{k} boxes cost [#4*k] dollars"],
     "p*k*(100+up)*(100-down)/10000"),
    (dict(s1=(2, 4, 5, 8), s2=(10, 20, 25), p1=range(2, 21), p2=range(4, 61), j=range(1, 5), need="s1*s2*j"),
     "A pack of {s1} {item} costs ${p1}, and a pack of {s2} {item} costs ${p2}. {name} needs {need} {item}. "
     "How many dollars does {he} save by buying only the cheaper packs?",
     ["In {s1}-packs one costs [p1/s1] dollars", "In {s2}-packs one costs [p2/s2] dollars",
      "Each one saves [#1-#2] dollars", "On {need} that is [#3*need] dollars"], "need*(p1/s1-p2/s2)"),
)
_TEMPLATES = {"basic": _BASIC, "intermediate": _INTERMEDIATE, "advanced": _ADVANCED}


def _draw(r: random.Random, template: Template) -> tuple[str, str, str] | None:
    """One candidate (question, solution, answer), or None when its numbers are not nice."""
    numbers, question, steps, answer = template
    env: dict[str, Fraction] = {}
    fields = _context(r)
    for key, spec in numbers.items():
        raw = _n(_ev(_fill(spec, env, []))) if isinstance(spec, str) else r.choice(spec)
        env[key], fields[key] = Fraction(raw), str(raw)
        if env[key] <= 0:
            return None
    question = question.format(**fields)
    built = _build(question, [s.format(**fields) for s in steps], env, _ev(_fill(answer, env, [])))
    return None if built is None else (question, *built)


def template_name(template: Template) -> str:
    """A problem type's short name: its question up to its fifth word that is not a blank, blanks as '_'
    ('_ wants a bike that costs ...')."""
    words = re.sub(r"\$?\{[^}]*\}", "_", template[1]).split()
    ends = [i for i, w in enumerate(words) if w.strip(".,?'s") not in ("_", "")]
    return " ".join(words[:ends[min(4, len(ends) - 1)] + 1]).rstrip(".,") + " ..."


def in_equal_shares(parts: list[str], n: int, load) -> list[Example]:
    """n problems, `load(part, k)` giving each part's share, interleaved: the first of each share, then the second
    of each, ... (the earlier parts take the remainder: 5 of two parts are a1, b1, a2, b2, a3)."""
    shares = [load(part, n // len(parts) + (i < n % len(parts))) for i, part in enumerate(parts)]
    return [ex for group in itertools.zip_longest(*shares) for ex in group if ex is not None]


def generate(level: str, n: int, seed: int = 0, split: str = "train") -> list[Example]:
    """n distinct problems of one level, or of several in equal shares, interleaved ("mix": basic, intermediate,
    advanced, basic, ...; "basic+intermediate"), from one split; the same arguments give the same list."""
    if not isinstance(n, int) or n < 0:
        raise TaskError(f"n must be a non-negative integer, got {n!r}: ask for 0 or more problems.")
    if split not in SPLITS:
        raise TaskError(f"unknown split '{split}': use train or test.")
    if len(levels := levels_of(level)) > 1:
        return in_equal_shares(levels, n, lambda level, k: generate(level, k, seed, split))
    if level not in LEVELS:
        raise TaskError(UNKNOWN.format(level))
    rng = random.Random(seed ^ zlib.crc32(f"{level}/{split}".encode()))
    out: list[Example] = []
    seen: set[str] = set()
    max_draws = 100 * n + 1000
    for _ in range(max_draws):
        if len(out) == n:
            break
        template = rng.choice(_TEMPLATES[level])
        drawn = _draw(rng, template)
        if drawn is None or drawn[0] in seen or split_of(drawn[0]) != split:
            continue
        seen.add(drawn[0])
        question, solution, answer = drawn
        out.append(Example(question, answer, level, solution, f"{level}-{split}-{len(out)}", template_name(template)))
    if len(out) < n:
        raise TaskError(f"found only {len(out)} distinct {split} problems of level '{level}' in {max_draws} "
                        f"draws: ask for fewer than {n}.")
    return out
