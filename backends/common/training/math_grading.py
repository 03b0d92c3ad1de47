"""Answer extraction and comparison for the rule-based math rewards (``rewards``).

Modelled on miles' ``miles/rollout/rm_hub/math_utils.py`` (``last_boxed_only_string``,
``extract_answer``, ``mathd_normalize_answer``, ``grade_answer_verl``) and
``math_dapo_utils.py`` (``normalize_final_answer``, ``is_correct_minerva``), written
anew and smaller: the last ``\\boxed{...}`` (braces balanced) or the last
``Answer: ...`` line is the answer; a normalisation strips what does not change a
value (spaces, ``$``, ``\\text{}``, ``\\left``/``\\right``, thousands commas, a trailing
full stop, ``dfrac``/``tfrac``); then two answers agree when their normal forms are
equal, or when both read as exact rational numbers of equal value (``7`` and ``7.0``,
``0.5``, ``1/2`` and ``\\frac{1}{2}``). What miles adds on top, sympy's symbolic
equality of LaTeX expressions (via pylatexenc), is not here: ``x^2+1`` and ``1+x^2``
differ.
"""

from __future__ import annotations

import re
from fractions import Fraction

BOXED = "\\boxed"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(\d+)\}$")
_SLASH = re.compile(r"^(-?\d+)/(\d+)$")
_NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces balanced; None if there is none
    or it is not closed (``last_boxed_only_string`` + ``remove_boxed`` in miles)."""
    start = text.rfind(BOXED + "{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(BOXED), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOXED) + 1 : i]
    return None


def last_answer_line(text: str) -> str | None:
    """What follows the last ``Answer:`` on its line (dapo's minerva pattern)."""
    found = _ANSWER_LINE.findall(text)
    return found[-1] if found else None


def normalize(answer: str) -> str:
    """A normal form that keeps the value: see the module's docstring."""
    text = answer.strip()
    text = re.sub(r"^\\text\{(.*)\}$", r"\1", text)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("dfrac", "frac")):
        text = text.replace(old, new)
    text = text.replace("tfrac", "frac").replace("\\$", "").replace("$", "")
    text = text.replace("\n", "").replace(" ", "").rstrip(".")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return text


def as_number(text: str) -> Fraction | None:
    """The exact value of an integer, a decimal or a fraction; None for anything else."""
    if _NUMBER.match(text):
        return Fraction(text)
    for pattern in (_FRAC, _SLASH):
        match = pattern.match(text)
        if match is None:
            continue
        *sign, top, bottom = match.groups()
        if int(bottom) == 0:
            return None
        value = Fraction(int(top), int(bottom))
        return -value if sign and sign[0] == "-" else value
    return None


def same_answer(given: str, truth: str) -> bool:
    """True when the two answers are equal in normal form or as numbers."""
    a, b = normalize(given), normalize(truth)
    if not a or not b:
        return False
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    return x is not None and x == y


def label_answer(label: object) -> str | None:
    """The ground truth as text; a boxed label is unboxed (miles does the same)."""
    if label is None or label == "":
        return None
    text = str(label)
    return last_boxed(text) if BOXED in text else text
