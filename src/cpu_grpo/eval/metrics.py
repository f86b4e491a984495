"""Per-completion metrics: correctness under several extractors, and what the written work looks like.

Pure functions on strings (no torch). Correctness:
- strict: the number after the last "#### " (`answers.extract_answer(text, "strict")`);
- flexible: the last number, lm-eval-harness's flexible regex (`answers.extract_answer(text, "flexible")`);
- math-verify: the `math-verify` package parses gold and completion and compares them symbolically;
- lm-eval-harness gsm8k (strict-match, flexible-extract): its regexes, filters and exact-match rules,
  so the numbers can be set beside published ones (the prompt still differs: theirs is 5-shot).

The work (the seed system's qualitative metrics, made precise):
- a *computation* is an arithmetic expression of at least two numbers joined by + - * / x × ÷ ·
  (parentheses, "$", thousands commas and "%" allowed, all on one line), then "=", then a result: a
  number, fraction or mixed number ("16 - 3 = 13", "$2 x 9 = $18", "(3 + 4) * 2 = 14", "3 / 2 = 1 1/2").
  LaTeX is read as written work: "\\times", "\\cdot", "\\div" as operators, "\\frac{225}{9} = 25" as
  "225/9 = 25" (before 2026-11-26 a \\frac division was not counted: reasoning_quality fell when a model
  moved from "225 / 9 = 25" to "\\frac{225}{9} = 25").
  A GSM8K annotation "<<16-3=13>>" is one, and "16 - 3 = <<16-3=13>>13" counts once. A chain
  "3 * 4 = 12 + 2 = 14" is two computations. But when an operator follows the number after "=" and that
  number is not the value before it, the right side is an expression being rewritten and only the last
  link counts: "4 * 60 / 5 = 4 * 12 = 48" is one computation (so is the slip "3 * 4 = 13 + 2 = 15"), as
  is "6 * 2 = 12/2 = 6". Not computations: words between the numbers ("3 apples + 4 apples"), algebra
  and implicit products (an expression that continues a variable, a parenthesis or another number:
  "2x + 3 = 7", "27(1/3) = 9"), powers, "40 = 40";
- calc_steps: the number of computations;
- reasoning_quality: at least two computations (two explicit steps of work);
- consistent: the final answer (the `auto` extractor, the one `correct` uses) equals, as a number, the
  result written in the last computation; None when there is no computation (the work says nothing);
- calc_correct_frac: the fraction of computations whose written result is the value of the expression
  (exactly when that value is a whole number or the result a fraction "3/4", else to within less than
  half a unit of the last written decimal: "10 / 3 = 3.33" is right, "7 / 2 = 3" is not); None when
  there is no computation.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import threading
from fractions import Fraction
from typing import NamedTuple

from ..data.answers import LATEX_FRAC, answers_match, extract_answer, parse_number
from ..errors import UserError


class MetricError(UserError):
    """A metric that cannot run as asked (a missing optional package); the message says what to do."""


def extract_strict(text: str) -> str | None:
    """The number after the last "#### ", or None.

    >>> extract_strict("3 + 4 = 7\\n#### 7"), extract_strict("so 7")
    ('7', None)
    """
    return extract_answer(text, "strict")


def extract_flexible(text: str) -> str | None:
    """The last number in the text (lm-eval-harness's flexible-extract regex), or None.

    >>> extract_flexible("3 + 4 = 7 apples, so $7.")
    '$7'
    """
    return extract_answer(text, "flexible")


# ---------------------------------------------------------------------------- math-verify


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise MetricError("math-verify is not installed: run `pip install math-verify` (or the package's "
                          "[eval] extra) to score with it.") from None
    return math_verify


def math_verify_available() -> bool:
    try:
        _math_verify()
    except MetricError:
        return False
    return True


def math_verify_correct(completion: str, gold: str) -> bool:
    """Whether math-verify finds the gold answer in the completion.

    `verify(gold, pred)` is not symmetric (the gold side may be a set of acceptable forms), so gold comes
    first. A gold that is a full GSM8K solution is reduced to its "#### N" answer first. Its timeouts use
    SIGALRM, which works only in the main thread: elsewhere (a web app's worker) they are off.
    """
    mv = _math_verify()
    if parse_number(gold) is None and (short := extract_answer(gold, "auto")) is not None:
        gold = short
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = mv.parse(gold, parsing_timeout=timeout)
    pred_parsed = mv.parse(completion, parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


# ---------------------------------------------------------------------------- lm-evaluation-harness gsm8k
# lm_eval/tasks/gsm8k/gsm8k.yaml (version 3.0, EleutherAI/lm-evaluation-harness at 47f16bf):
#   generation stops at "Question:", "</s>", "<|im_end|>";
#   strict-match:     regex "#### (\-?[0-9\.\,]+)", group_select 0 (the FIRST match), take_first;
#   flexible-extract: regex "(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select -1 (the LAST match), take_first;
#   no match -> "[invalid]"; RegexFilter takes the first non-empty group of a tuple and strips it
#   (lm_eval/filters/extraction.py);
#   metric exact_match with ignore_case true, ignore_punctuation false and regexes_to_ignore
#   [",", "\$", "(?s).*#### ", "\.$"], removed in that order from prediction and reference alike
#   (lm_eval/api/metrics.py exact_match_hf_evaluate); the reference is the dataset's full answer.
_LM_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_LM_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_LM_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")
_LM_STOPS = ("Question:", "</s>", "<|im_end|>")


def lm_eval_normalize(s: str) -> str:
    """lm-eval's exact-match normalisation for gsm8k.

    >>> lm_eval_normalize("$1,234."), lm_eval_normalize("She makes 9 * 2 = 18.\\n#### 18")
    ('1234', '18')
    """
    for pattern in _LM_IGNORE:
        s = re.sub(pattern, "", s)
    return s.lower()


def _lm_eval_cut(text: str) -> str:
    for stop in _LM_STOPS:
        text = text.split(stop, 1)[0]
    return text


def lm_eval_extract(completion: str, mode: str) -> str:
    """The string lm-eval's gsm8k filter keeps: mode "strict" (strict-match) or "flexible" (flexible-extract).

    >>> lm_eval_extract("#### 5 no wait #### 6", "strict"), lm_eval_extract("2 + 3 = 5 apples.", "flexible")
    ('5', '5')
    >>> lm_eval_extract("five", "strict")
    '[invalid]'
    """
    if mode not in ("strict", "flexible"):
        raise MetricError(f"unknown lm-eval filter {mode!r}: use 'strict' or 'flexible'")
    text = _lm_eval_cut(completion)
    if mode == "strict":
        found = _LM_STRICT.findall(text)
        return found[0].strip() if found else "[invalid]"
    found = _LM_FLEXIBLE.findall(text)
    if not found:
        return "[invalid]"
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else "[invalid]"


def _lm_eval_match(completion: str, gold: str, mode: str) -> bool:
    return lm_eval_normalize(lm_eval_extract(completion, mode)) == lm_eval_normalize(gold)


def lm_eval_strict_match(completion: str, gold: str) -> bool:
    """lm-eval gsm8k "strict-match": the first "#### N" equals the gold after normalisation.

    `gold` is the dataset's answer, either the full solution ("... #### 18") or just the number.

    >>> lm_eval_strict_match("#### 1,234.", "... #### 1234"), lm_eval_strict_match("#### $18", "18")
    (True, False)
    """
    return _lm_eval_match(completion, gold, "strict")


def lm_eval_flexible_extract(completion: str, gold: str) -> bool:
    """lm-eval gsm8k "flexible-extract": the last number-like string equals the gold after normalisation.

    >>> lm_eval_flexible_extract("She makes $1,234.", "1234"), lm_eval_flexible_extract("18 or 19", "18")
    (True, False)
    """
    return _lm_eval_match(completion, gold, "flexible")


# ---------------------------------------------------------------------------- the work
_NUMBER = r"\$?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)%?"  # "1,234.5", "$18", ".5", "20%"
_OPERAND = r"(?:\([ \t]*)*" + _NUMBER + r"(?:[ \t]*\))*"  # spaces only after "(": one way to match
_OPERATOR = r"[-+*/×÷xX·]"
_EXPR = r"(?:(?<![\w)])-)?" + _OPERAND + r"(?:[ \t]*" + _OPERATOR + r"[ \t]*" + _OPERAND + r")+"
# the result: a number, a fraction "3/4" or a mixed number "3 1/2", complete (no digit, "/" or ",123" after
# it) and not followed by "=" ("6 * 2 = 12/2 = 6": the chain goes on from "12/2")
_RESULT = r"-?(?:\d+[ \t]+\d+/\d+|" + _NUMBER + r"(?:/\d+)?)"
_RESULT_END = r"(?!\.?\d|/|,\d|[ \t]*=)"
_CONTINUES = re.compile(r"[ \t]*" + _OPERATOR + r"[ \t]*[\d(.$]")  # "= 4 * 12 ...": an expression follows
_COMPUTATION = re.compile(r"(?<![\w.,$])(" + _EXPR + r")[ \t]*=[ \t]*(" + _RESULT + r")" + _RESULT_END)
# text before an expression that makes it the tail of a longer one: an operator, a parenthesis, a digit
# ("$350 000 + ..."), or a standalone x ("2x + 3 = 7", "27(1/3) = 9", "¾ x 3/3 = 9/12")
_FRAGMENT_END = re.compile(r"(?:[-+*/×÷·^()\d]|(?<![A-Za-z])[xX])[ \t]*$")
_ANNOTATION = re.compile(r"<<([^<>]*)>>")
_PLAIN = {"\\times": "×", "\\cdot": "·", "\\div": "÷", "\\(": " ", "\\)": " ", "\\[": " ", "\\]": " ",
          "\u2013": "-", "\u2212": "-"}  # LaTeX operators and delimiters; en dash and minus sign as "-"
_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class Computation(NamedTuple):
    expr: str  # as written: "$2 x 9"
    result: str  # as written: "$18"
    value: Fraction | None  # the expression's exact value; None if it cannot be evaluated


def _evaluate(expr: str) -> Fraction | None:
    """Exact value of a written expression; None if unbalanced or dividing by zero."""
    text = expr.replace("$", "").replace(",", "").replace(" ", "").replace("\t", "")
    for written, op in (("×", "*"), ("x", "*"), ("X", "*"), ("·", "*"), ("÷", "/")):
        text = text.replace(written, op)
    text = re.sub(r"([\d.]+)%", r"(\1/100)", re.sub(r"(?<![\d.])0+(\d)", r"\1", text))  # "05" is no Python literal
    while text.count("(") > text.count(")") and text.startswith("("):  # "(3 + 4) * 2" seen as "(3 + 4"
        text = text[1:]
    while text.count(")") > text.count("(") and text.endswith(")"):
        text = text[:-1]

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
            return _AST_OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(node.value) if type(node.value) is int else Fraction(repr(node.value))
        raise ValueError(expr)

    try:
        return walk(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _plain_fraction(m: re.Match) -> str:
    """A LaTeX fraction as written work: "\\frac{225}{9}" as "225/9", "\\frac{9 + 3}{4}" as "(9 + 3)/4"."""
    return "/".join(x.strip() if re.fullmatch(_NUMBER, x.strip()) else f"({x.strip()})" for x in m.groups())


def computations(text: str) -> list[Computation]:
    """Every computation written in `text`, in order (see the module docstring for the definition).

    >>> [(c.expr, c.result) for c in computations("16 - 3 = <<16-3=13>>13 eggs; 13 x $2 = $26.")]
    [('16-3', '13'), ('13 x $2', '$26')]
    """
    for written, plain in _PLAIN.items():
        text = text.replace(written, plain)
    text = LATEX_FRAC.sub(_plain_fraction, text)
    text = _ANNOTATION.sub(r" | \1 | ", text)
    out, pos = [], 0
    while (m := _COMPUTATION.search(text, pos)) is not None:
        if _FRAGMENT_END.search(text[max(0, m.start() - 40):m.start()]):
            pos = m.start() + 1
            continue
        c = Computation(m.group(1).strip(), m.group(2), _evaluate(m.group(1)))
        if not (_CONTINUES.match(text, m.end()) and not calc_is_right(c)):  # see "A chain" in the module doc
            out.append(c)
        pos = m.start(2)  # a chain "3 * 4 = 12 + 2 = 14" goes on from the result
    return out


def _result_values(result: str) -> list[Fraction]:
    """The written result as a number; "50%" may mean 50 or 0.5, so both are offered."""
    text = result.replace("$", "").replace(",", "").removesuffix("%")
    parts = (p.partition("/") for p in text.lstrip("-").split())  # "3 1/2" -> 3 + 1/2
    values = [(-1 if text.startswith("-") else 1) * sum(Fraction(n) / Fraction(d or 1) for n, _, d in parts)]
    return values + [values[0] / 100] if result.endswith("%") else values


def calc_is_right(c: Computation) -> bool:
    """Whether the written result is the expression's value (rounding to the written decimals allowed).

    >>> calc_is_right(computations("10 / 3 = 3.33")[0]), calc_is_right(computations("3 * 4 = 13")[0])
    (True, False)
    """
    if c.value is None:
        return False
    decimals = len(c.result.split(".")[1].rstrip("%")) if "." in c.result else 0
    rounded = c.value.denominator != 1 and "/" not in c.result  # a written fraction must be exact
    for r in _result_values(c.result):
        if r == c.value or (rounded and abs(r - c.value) < Fraction(1, 2 * 10**decimals)):
            return True
    return False


def calc_steps(text: str) -> int:
    """The number of computations in the text.

    >>> calc_steps("3 + 4 = 7, then 7 * 2 = 14.\\n#### 14"), calc_steps("The answer is 14.")
    (2, 0)
    """
    return len(computations(text))


def reasoning_quality(text: str) -> bool:
    """At least two computations: the completion shows two explicit steps of work."""
    return calc_steps(text) >= 2


def consistent(text: str) -> bool | None:
    """Whether the final answer equals the result of the last computation; None without a computation.

    >>> consistent("3 + 4 = 7\\n#### 7"), consistent("3 + 4 = 7\\n#### 8"), consistent("#### 7")
    (True, False, None)
    """
    return _consistent(text, computations(text))


def _consistent(text: str, found: list[Computation]) -> bool | None:
    if not found:
        return None
    pred = extract_answer(text, "auto")
    value = parse_number(pred) if pred is not None else None
    return value is not None and math.isclose(value, float(_result_values(found[-1].result)[0]), rel_tol=1e-9)


def calc_correct_frac(text: str) -> float | None:
    """The fraction of computations that are arithmetically right; None without a computation."""
    return _right_fraction(computations(text))


def _right_fraction(found: list[Computation]) -> float | None:
    return sum(calc_is_right(c) for c in found) / len(found) if found else None


def score_completion(text: str, gold: str, solution: str = "", use_math_verify: bool = True) -> dict:
    """Every per-completion metric, as the keys of an evaluation record.

    `gold` is the canonical answer ("18"); `solution`, the dataset's full answer, is lm-eval's reference
    when given. `correct_math_verify` is None when math-verify is off or not installed.
    """
    pred = extract_answer(text, "auto")
    strict = answers_match(extract_strict(text), gold)
    mv = math_verify_correct(text, gold) if use_math_verify and math_verify_available() else None
    reference = solution if "####" in solution else gold
    return {
        "pred": pred, "correct": answers_match(pred, gold), "strict_correct": strict, "correct_strict": strict,
        "correct_flexible": answers_match(extract_flexible(text), gold), "correct_math_verify": mv,
        "lm_eval_strict": lm_eval_strict_match(text, reference),
        "lm_eval_flexible": lm_eval_flexible_extract(text, reference), **work(text),
    }


def work(text: str) -> dict:
    """The written work's metrics, as the keys of an evaluation record (see the module docstring)."""
    found = computations(text)  # parsed once for the four keys
    return {"calc_steps": len(found), "reasoning_quality": len(found) >= 2, "consistent": _consistent(text, found),
            "calc_correct_frac": _right_fraction(found)}


def with_work(records: list[dict]) -> list[dict]:
    """Evaluation records with their work read again from each completion: a file written before a fix of the
    metric (a run's reused eval_before.jsonl, an older `cpu-grpo eval --output`) counts on today's definition."""
    return [{**r, **work(r["completion"])} if "completion" in r else r for r in records]
