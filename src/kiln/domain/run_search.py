"""Run-search filters and orderings, as MLflow clients send them to Kiln's tracking API.

A filter (the ``filter`` of ``runs/search``, the ``filter_string`` of ``mlflow.search_runs``) follows MLflow's filter
syntax: conditions joined with ``AND`` (there is no ``OR``); an empty filter has no conditions. A condition is an
identifier, an operator and a value:

* the identifier is ``params.<key>``, ``metrics.<key>``, ``tags.<key>`` or ``attributes.<name>`` (``param.``,
  ``metric.``, ``tag.``, ``attribute.``, ``attr.`` and ``run.`` are accepted too). A key is written plain
  (letters, digits, ``_ - . /``) or quoted with backticks or double quotes (``params.`my key```, ``metrics."val acc"``).
  Attributes are ``run_id``, ``run_name``, ``status``, ``start_time``, ``end_time``, ``user_id``, ``artifact_uri``,
  ``experiment_id``, ``lifecycle_stage`` and ``created`` (another name for ``start_time``);
* the operator is ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``LIKE``, ``ILIKE``, ``IN``, ``NOT IN``, ``IS NULL`` or
  ``IS NOT NULL`` (keywords in any case);
* the value is a quoted string (single or double quotes; a backslash before a quote or a backslash escapes it, any
  other backslash is kept as written), a number, or for ``IN``/``NOT IN`` a parenthesised list of quoted strings.

Metrics compare with numbers (``= != < <= > >=``); params and tags with strings (``= != LIKE ILIKE IN NOT IN``);
string attributes likewise, and ``start_time``/``end_time`` with numbers (milliseconds since the epoch).

Kiln adds two things to the filter syntax: ``params.<key>`` compared with a number (``params.lr < 0.01``) compares the
param's value read as a number, and ``IS NULL``/``IS NOT NULL`` on a param, metric or tag asks whether a run has it.

An ordering is a list of clauses ``<identifier> [ASC|DESC]``, ascending by default; the attributes that order runs are
``start_time`` (or ``created``), ``end_time``, ``run_name``, ``status`` and ``run_id``. Kiln also reads a leading
``-`` as descending (``-metrics.val_acc``).

The result is a small typed tree (Condition, OrderKey) that the storage layer turns into a query; anything outside
the grammar, or over its limits, raises SearchSyntaxError (a ValueError) naming the offending token and its position.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_CLAUSE_LENGTH",
    "MAX_CONDITIONS",
    "MAX_FILTER_LENGTH",
    "MAX_IN_ITEMS",
    "MAX_KEY_LENGTH",
    "MAX_ORDER_CLAUSES",
    "Condition",
    "Entity",
    "OrderKey",
    "SearchSyntaxError",
    "parse_filter",
    "parse_order_by",
]

MAX_FILTER_LENGTH = 4000
MAX_CONDITIONS = 50
MAX_IN_ITEMS = 500
MAX_KEY_LENGTH = 250
MAX_ORDER_CLAUSES = 10
MAX_CLAUSE_LENGTH = 500

Entity = Literal["param", "metric", "tag", "attribute"]

_PREFIXES: dict[str, Entity] = {
    "params": "param",
    "param": "param",
    "metrics": "metric",
    "metric": "metric",
    "tags": "tag",
    "tag": "tag",
    "attributes": "attribute",
    "attribute": "attribute",
    "attr": "attribute",
    "run": "attribute",
}
_ATTRIBUTE_ALIASES = {"created": "start_time"}
_STRING_ATTRIBUTES = frozenset(
    {"run_id", "run_name", "status", "user_id", "artifact_uri", "experiment_id", "lifecycle_stage"}
)
_TIME_ATTRIBUTES = frozenset({"start_time", "end_time"})
_FILTER_ATTRIBUTES = _STRING_ATTRIBUTES | _TIME_ATTRIBUTES
_ORDER_ATTRIBUTES = frozenset({"start_time", "end_time", "run_name", "status", "run_id"})

_COMPARISONS = frozenset({"=", "!=", "<", "<=", ">", ">="})
_STRING_OPS = frozenset({"=", "!=", "LIKE", "ILIKE"})
_LIST_OPS = frozenset({"IN", "NOT IN"})
_NULL_OPS = frozenset({"IS NULL", "IS NOT NULL"})

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-./]+")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_OPERATOR = re.compile(r"<=|>=|!=|=|<|>")
_NUMBER_FOLLOWER = re.compile(r"[A-Za-z0-9_.]")

_TokenKind = Literal["ident", "word", "string", "number", "op", "lparen", "rparen", "comma", "end"]


class SearchSyntaxError(ValueError):
    """A run-search filter or ordering that is not in the grammar or is over a limit; the message says where."""


@dataclass(frozen=True)
class Condition:
    """One ``<identifier> <op> <value>`` of a filter. ``key`` is the param, metric or tag key, or the attribute's
    name (``created`` already read as ``start_time``); ``op`` is upper-case (``"NOT IN"``, ``"IS NULL"``); ``value``
    is a float when ``numeric``, a tuple of strings for ``IN``/``NOT IN``, None for ``IS [NOT] NULL``, else a str."""

    entity: Entity
    key: str
    op: str
    value: str | float | tuple[str, ...] | None
    numeric: bool


@dataclass(frozen=True)
class OrderKey:
    """One clause of an ordering."""

    entity: Entity
    key: str
    descending: bool


@dataclass(frozen=True)
class _Token:
    kind: _TokenKind
    text: str  # the source text, as written
    pos: int  # offset of its first character in the whole filter or clause
    value: str | float | tuple[Entity, str] | None = None

    def describe(self) -> str:
        return "end of input" if self.kind == "end" else repr(self.text)


def _fail(message: str, token: _Token) -> SearchSyntaxError:
    return SearchSyntaxError(f"{message}, found {token.describe()} at position {token.pos}")


def _read_quoted(text: str, start: int, base: int) -> tuple[str, int]:
    """The text between the quote at ``start`` and its closing quote, and the offset after the closing quote."""
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and text[i + 1] in (quote, "\\"):
            out.append(text[i + 1])
            i += 2
        elif char == quote:
            return "".join(out), i + 1
        else:
            out.append(char)
            i += 1
    raise SearchSyntaxError(f"unterminated string: no closing {quote} for the one at position {base + start}")


def _tokenize(text: str, base: int = 0) -> list[_Token]:
    """Tokens of ``text``, ending with an ``end`` token; ``base`` is added to every position."""
    tokens: list[_Token] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            tokens.append(_Token("end", "", base + i))
            return tokens
        char = text[i]
        start = i
        if word := _WORD.match(text, i):
            i = word.end()
            if i < len(text) and text[i] == ".":
                identifier, i = _read_identifier(text, start, i + 1, base)
                tokens.append(identifier)
            else:
                tokens.append(_Token("word", word.group(), base + start, word.group().upper()))
        elif char in "'\"":
            value, i = _read_quoted(text, i, base)
            tokens.append(_Token("string", text[start:i], base + start, value))
        elif number := _NUMBER.match(text, i):
            i = number.end()
            if i < len(text) and _NUMBER_FOLLOWER.match(text, i):
                bad = _Token("word", text[start : i + 1], base + start)
                raise _fail("malformed number", bad)
            parsed = float(number.group())
            if not math.isfinite(parsed):
                raise _fail("number out of range", _Token("number", number.group(), base + start))
            tokens.append(_Token("number", number.group(), base + start, parsed))
        elif op := _OPERATOR.match(text, i):
            i = op.end()
            tokens.append(_Token("op", op.group(), base + start, op.group()))
        elif char in "(),":
            i += 1
            kind: _TokenKind = "lparen" if char == "(" else "rparen" if char == ")" else "comma"
            tokens.append(_Token(kind, char, base + start))
        else:
            raise _fail("unexpected character", _Token("word", char, base + start))


def _read_identifier(text: str, start: int, key_start: int, base: int) -> tuple[_Token, int]:
    """The identifier whose prefix begins at ``start`` and whose key begins at ``key_start`` (after the dot), and the
    offset after it."""
    prefix = text[start : key_start - 1]
    entity = _PREFIXES.get(prefix)
    if entity is None:
        raise SearchSyntaxError(
            f"unknown identifier prefix {prefix!r} at position {base + start}: "
            "use params., metrics., tags. or attributes."
        )
    if key_start < len(text) and text[key_start] in '`"':
        key, end = _read_quoted(text, key_start, base)
    elif plain := _PLAIN_KEY.match(text, key_start):
        key, end = plain.group(), plain.end()
    else:
        key, end = "", key_start
    if not key:
        raise SearchSyntaxError(f"missing key after {prefix + '.'!r} at position {base + start}")
    if len(key) > MAX_KEY_LENGTH:
        raise SearchSyntaxError(f"key at position {base + start} is longer than {MAX_KEY_LENGTH} characters")
    return _Token("ident", text[start:end], base + start, (entity, key)), end


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.value in words

    def identifier(self, expected: str) -> tuple[Entity, str, _Token]:
        token = self.take()
        if token.kind != "ident":
            if token.kind == "word":
                raise _fail(
                    f"{expected}: an identifier needs a prefix such as params., metrics., tags. or attributes.", token
                )
            raise _fail(expected, token)
        assert isinstance(token.value, tuple)
        entity, key = token.value
        return entity, key, token


def _attribute_name(key: str, token: _Token, allowed: frozenset[str]) -> str:
    name = _ATTRIBUTE_ALIASES.get(key, key)
    if name not in allowed:
        names = ", ".join(sorted(allowed | {alias for alias, to in _ATTRIBUTE_ALIASES.items() if to in allowed}))
        raise SearchSyntaxError(f"unknown attribute {key!r} at position {token.pos}: use one of {names}")
    return name


def _operator(parser: _Parser) -> tuple[str, _Token]:
    token = parser.take()
    if token.kind == "op":
        return token.text, token
    if token.kind == "word" and token.value in ("LIKE", "ILIKE", "IN"):
        return str(token.value), token
    if token.kind == "word" and token.value == "NOT":
        follow = parser.take()
        if follow.kind == "word" and follow.value == "IN":
            return "NOT IN", token
        raise _fail("expected IN after NOT", follow)
    if token.kind == "word" and token.value == "IS":
        follow = parser.take()
        if follow.kind == "word" and follow.value == "NOT":
            follow = parser.take()
            if follow.kind == "word" and follow.value == "NULL":
                return "IS NOT NULL", token
        elif follow.kind == "word" and follow.value == "NULL":
            return "IS NULL", token
        raise _fail("expected NULL or NOT NULL after IS", follow)
    raise _fail("expected an operator (=, !=, <, <=, >, >=, LIKE, ILIKE, IN, NOT IN, IS NULL, IS NOT NULL)", token)


def _string_list(parser: _Parser) -> tuple[str, ...]:
    opening = parser.take()
    if opening.kind != "lparen":
        raise _fail("expected a parenthesised list of quoted strings after IN", opening)
    items: list[str] = []
    while True:
        item = parser.take()
        if item.kind != "string":
            raise _fail("expected a quoted string in the IN list", item)
        assert isinstance(item.value, str)
        items.append(item.value)
        if len(items) > MAX_IN_ITEMS:
            raise SearchSyntaxError(f"IN list at position {opening.pos} has more than {MAX_IN_ITEMS} items")
        separator = parser.take()
        if separator.kind == "rparen":
            return tuple(items)
        if separator.kind != "comma":
            raise _fail("expected ',' or ')' in the IN list", separator)


def _condition(parser: _Parser) -> Condition:
    entity, key, ident = parser.identifier("expected an identifier such as params.<key> or metrics.<key>")
    if entity == "attribute":
        key = _attribute_name(key, ident, _FILTER_ATTRIBUTES)
    op, op_token = _operator(parser)
    where = f"{ident.text} {op}"
    numeric_only = entity == "metric" or (entity == "attribute" and key in _TIME_ATTRIBUTES)
    string_only = entity == "tag" or (entity == "attribute" and not numeric_only)

    if op in _NULL_OPS:
        if entity == "attribute":
            raise _fail(f"{op} applies to params, metrics and tags only, not to attributes", op_token)
        return Condition(entity, key, op, None, numeric=False)
    if numeric_only and op not in _COMPARISONS:
        raise _fail(f"{ident.text} is compared with numbers: use =, !=, <, <=, >, >= instead of {op}", op_token)
    if string_only and op not in _STRING_OPS | _LIST_OPS:
        raise _fail(
            f"{ident.text} is compared with strings: use =, !=, LIKE, ILIKE, IN, NOT IN instead of {op}", op_token
        )
    if op in _LIST_OPS:
        return Condition(entity, key, op, _string_list(parser), numeric=False)

    value = parser.take()
    if value.kind == "number" and not string_only:
        assert isinstance(value.value, float)
        if op not in _COMPARISONS:
            raise _fail(f"{where}: {op} needs a quoted string; numbers take =, !=, <, <=, >, >=", value)
        return Condition(entity, key, op, value.value, numeric=True)
    if value.kind == "string" and not numeric_only:
        assert isinstance(value.value, str)
        if op not in _STRING_OPS:
            raise _fail(f"{where}: {op} needs a number; strings take =, !=, LIKE, ILIKE, IN, NOT IN", value)
        return Condition(entity, key, op, value.value, numeric=False)
    kind = "a number" if numeric_only else "a quoted string" if string_only else "a quoted string or a number"
    raise _fail(f"{where}: expected {kind}", value)


def parse_filter(text: str | None) -> list[Condition]:
    """The conditions of a run-search filter, in order; None or a blank filter has none."""
    if text is None or not text.strip():
        return []
    if len(text) > MAX_FILTER_LENGTH:
        raise SearchSyntaxError(f"filter is longer than {MAX_FILTER_LENGTH} characters ({len(text)})")
    parser = _Parser(_tokenize(text))
    conditions = [_condition(parser)]
    while True:
        token = parser.take()
        if token.kind == "end":
            return conditions
        if token.kind == "word" and token.value == "OR":
            raise _fail("OR is not supported: conditions can only be joined with AND", token)
        if not (token.kind == "word" and token.value == "AND"):
            raise _fail("expected AND or the end of the filter", token)
        if len(conditions) >= MAX_CONDITIONS:
            raise SearchSyntaxError(f"filter has more than {MAX_CONDITIONS} conditions")
        conditions.append(_condition(parser))


def _order_key(clause: str) -> OrderKey:
    if len(clause) > MAX_CLAUSE_LENGTH:
        raise SearchSyntaxError(f"longer than {MAX_CLAUSE_LENGTH} characters ({len(clause)})")
    stripped = clause.lstrip()
    offset = len(clause) - len(stripped)
    minus = stripped.startswith("-")
    if minus:
        offset += 1
    parser = _Parser(_tokenize(clause[offset:], base=offset))
    entity, key, ident = parser.identifier("expected an identifier such as metrics.<key> or attributes.start_time")
    if entity == "attribute":
        key = _attribute_name(key, ident, _ORDER_ATTRIBUTES)
    descending = minus
    if parser.at_word("ASC", "DESC"):
        direction = parser.take()
        if minus:
            raise _fail("a leading '-' already orders descending; drop it or the ASC/DESC", direction)
        descending = direction.value == "DESC"
    trailing = parser.take()
    if trailing.kind != "end":
        raise _fail("expected ASC, DESC or the end of the clause", trailing)
    return OrderKey(entity, key, descending)


def parse_order_by(clauses: list[str] | None) -> list[OrderKey]:
    """The keys of a run-search ordering, most significant first; None or an empty list has none."""
    if not clauses:
        return []
    if len(clauses) > MAX_ORDER_CLAUSES:
        raise SearchSyntaxError(f"order_by has more than {MAX_ORDER_CLAUSES} clauses ({len(clauses)})")
    keys: list[OrderKey] = []
    for index, clause in enumerate(clauses):
        try:
            keys.append(_order_key(clause))
        except SearchSyntaxError as error:
            raise SearchSyntaxError(f"order_by[{index}]: {error}") from None
    return keys
