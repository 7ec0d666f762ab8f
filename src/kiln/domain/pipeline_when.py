"""A pipeline step's ``when``: a small expression language over upstream steps' metrics and params, parsed into a
tree and evaluated without ``eval``.

    when: "steps.train.metrics.val_acc >= 0.95 and steps.prep.params.rows > 1000"

- references: ``steps.STEP.metrics.KEY`` (the metric's last value) and ``steps.STEP.params.KEY`` (a param, as text;
  compared as a number when both sides read as numbers, as MLflow's search does);
- literals: numbers, strings in single or double quotes, ``true``/``false``;
- comparisons ``== != < <= > >=`` (text is only equal or not); ``and``, ``or``, ``not``; parentheses; a reference
  alone is true when it has a value.

A reference that has no value (the metric was never logged) makes its comparison false, and the evaluation says
which reference it was. A step may only refer to steps upstream of it (checked where the pipeline is validated).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any

MAX_WHEN = 1000  # characters
MAX_DEPTH = 32  # nested parentheses and `not`s

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<ref>steps\.[A-Za-z0-9][A-Za-z0-9_-]*\.(?:metrics|params)\.[A-Za-z0-9_][A-Za-z0-9_.:/-]*)
    |(?P<number>-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))
    |(?P<string>'[^'\\]*'|"[^"\\]*")
    |(?P<op>==|!=|<=|>=|<|>)
    |(?P<paren>[()])
    |(?P<word>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)
_WORDS = {"and", "or", "not", "true", "false"}


class WhenError(ValueError):
    """The expression is not valid: the message says where."""


@dataclass(frozen=True)
class Ref:
    step: str
    kind: str  # "metrics" | "params"
    key: str

    def __str__(self) -> str:
        return f"steps.{self.step}.{self.kind}.{self.key}"


@dataclass(frozen=True)
class Compare:
    op: str
    left: Any  # Ref | float | str | bool
    right: Any


@dataclass(frozen=True)
class Logic:
    op: str  # "and" | "or" | "not"
    parts: tuple[Any, ...]


@dataclass(frozen=True)
class When:
    """A parsed ``when``: its tree and the references it reads."""

    text: str
    tree: Any
    refs: tuple[Ref, ...]

    def evaluate(self, values: dict[Ref, float | str | None]) -> tuple[bool, str]:
        """(the result, why: the first reference without a value, if one decided it)."""
        missing: list[Ref] = []
        result = _evaluate(self.tree, values, missing)
        return result, (f"{missing[0]} has no value" if missing and not result else "")


def parse_when(text: str) -> When:
    """Parse ``text``; WhenError naming the position and what was expected."""
    if len(text) > MAX_WHEN:
        raise WhenError(f"at most {MAX_WHEN} characters")
    tokens = _tokens(text)
    if not tokens:
        raise WhenError("empty expression")
    parser = _Parser(tokens, text)
    tree = parser.expression(0)
    if parser.at < len(tokens):
        raise WhenError(f"unexpected {tokens[parser.at][1]!r} at character {tokens[parser.at][2] + 1}")
    _check_conditions(tree)
    return When(text, tree, tuple(dict.fromkeys(_refs(tree))))


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None or match.lastgroup is None:
            start = len(text) - len(text[at:].lstrip())
            raise WhenError(f"cannot read {text[start : start + 20]!r} at character {start + 1}")
        kind = match.lastgroup
        value = match.group(kind)
        start = match.start(kind)
        if kind == "word" and value not in _WORDS:
            hint = " (a reference is steps.STEP.metrics.KEY or steps.STEP.params.KEY)" if "." in value else ""
            raise WhenError(f"unknown word {value!r} at character {start + 1}{hint}")
        out.append((kind, value, start))
        at = match.end()
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, int]], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.at = 0

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _expected(self, what: str) -> WhenError:
        token = self._peek()
        where = f"{token[1]!r} at character {token[2] + 1}" if token else "the end"
        return WhenError(f"expected {what}, found {where}")

    def expression(self, depth: int) -> Any:
        parts = [self._conjunction(depth)]
        while (token := self._peek()) and token[1] == "or":
            self.at += 1
            parts.append(self._conjunction(depth))
        return parts[0] if len(parts) == 1 else Logic("or", tuple(parts))

    def _conjunction(self, depth: int) -> Any:
        parts = [self._negation(depth)]
        while (token := self._peek()) and token[1] == "and":
            self.at += 1
            parts.append(self._negation(depth))
        return parts[0] if len(parts) == 1 else Logic("and", tuple(parts))

    def _negation(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WhenError(f"nested more than {MAX_DEPTH} deep")
        token = self._peek()
        if token and token[1] == "not":
            self.at += 1
            return Logic("not", (self._negation(depth + 1),))
        return self._comparison(depth)

    def _comparison(self, depth: int) -> Any:
        left = self._value(depth)
        token = self._peek()
        if token is None or token[0] != "op":
            return left
        self.at += 1
        right = self._value(depth)
        if isinstance(left, Logic | Compare) or isinstance(right, Logic | Compare):
            raise WhenError(f"{token[1]} compares values; put parentheses around each comparison")
        if (isinstance(left, bool) or isinstance(right, bool)) and token[1] not in ("==", "!="):
            raise WhenError(f"true/false compare with == or != only, not {token[1]}")
        return Compare(token[1], left, right)

    def _value(self, depth: int) -> Any:
        token = self._peek()
        if token is None:
            raise self._expected("a value")
        kind, value, _ = token
        self.at += 1
        if kind == "ref":
            step, what, key = value.split(".", 3)[1:]
            return Ref(step, what, key)
        if kind == "number":
            return float(value)
        if kind == "string":
            return value[1:-1]
        if kind == "word" and value in ("true", "false"):
            return value == "true"
        if kind == "paren" and value == "(":
            inner = self.expression(depth + 1)
            closing = self._peek()
            if closing is None or closing[1] != ")":
                raise self._expected("')'")
            self.at += 1
            return inner
        self.at -= 1
        raise self._expected("a value (a number, a 'string', true/false, steps.STEP.metrics.KEY or '(')")


def _check_conditions(tree: Any) -> None:
    """Every operand of and/or/not, and the whole, is a condition: a comparison, true/false, or a reference (true
    when it has a value); a bare number or string is not."""
    if isinstance(tree, Logic):
        for part in tree.parts:
            _check_conditions(part)
    elif not isinstance(tree, Compare | bool | Ref):
        raise WhenError(f"{tree!r} is a value, not a condition: compare it (==, !=, <, <=, >, >=)")


def _refs(tree: Any) -> list[Ref]:
    if isinstance(tree, Ref):
        return [tree]
    if isinstance(tree, Compare):
        return _refs(tree.left) + _refs(tree.right)
    if isinstance(tree, Logic):
        return [ref for part in tree.parts for ref in _refs(part)]
    return []


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_ORDER = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _evaluate(tree: Any, values: dict[Ref, float | str | None], missing: list[Ref]) -> bool:
    if isinstance(tree, bool):
        return tree
    if isinstance(tree, Logic):
        if tree.op == "not":
            return not _evaluate(tree.parts[0], values, missing)
        results = (_evaluate(part, values, missing) for part in tree.parts)
        return all(results) if tree.op == "and" else any(results)
    if isinstance(tree, Compare):
        sides = []
        for side in (tree.left, tree.right):
            if isinstance(side, Ref):
                value = values.get(side)
                if value is None:
                    missing.append(side)
                    return False
                sides.append(value)
            else:
                sides.append(side)
        left, right = sides
        a, b = _number(left), _number(right)
        if a is not None and b is not None:
            return _ORDER[tree.op](a, b)
        if tree.op in ("==", "!="):
            return (_text(left) == _text(right)) == (tree.op == "==")
        return False  # text orders nothing here: only equal or not
    if isinstance(tree, Ref):  # a bare reference: it has a value
        if values.get(tree) is None:
            missing.append(tree)
            return False
        return True
    raise TypeError(f"not a condition: {tree!r}")  # parse_when refuses it
