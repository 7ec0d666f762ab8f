"""Run-search filters and orderings (kiln.domain.run_search): MLflow's filter syntax plus Kiln's numeric params,
IS [NOT] NULL and '-' for descending."""

from __future__ import annotations

import random

import pytest

from kiln.domain.run_search import (
    MAX_CONDITIONS,
    MAX_FILTER_LENGTH,
    MAX_IN_ITEMS,
    MAX_KEY_LENGTH,
    MAX_ORDER_CLAUSES,
    Condition,
    OrderKey,
    SearchSyntaxError,
    parse_filter,
    parse_order_by,
)


def one(text: str) -> Condition:
    conditions = parse_filter(text)
    assert len(conditions) == 1
    return conditions[0]


@pytest.mark.parametrize("text", [None, "", "   ", "\n\t "])
def test_an_empty_filter_has_no_conditions(text: str | None) -> None:
    assert parse_filter(text) == []


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_metrics_take_every_comparison(op: str) -> None:
    assert one(f"metrics.acc {op} 0.5") == Condition("metric", "acc", op, 0.5, numeric=True)


@pytest.mark.parametrize("op", ["=", "!=", "LIKE", "ILIKE"])
@pytest.mark.parametrize("entity", ["params", "tags"])
def test_params_and_tags_take_string_operators(entity: str, op: str) -> None:
    expected = Condition(entity.rstrip("s"), "opt", op, "adam%", numeric=False)  # type: ignore[arg-type]
    assert one(f"{entity}.opt {op} 'adam%'") == expected


@pytest.mark.parametrize("op", ["IN", "NOT IN"])
def test_in_lists(op: str) -> None:
    assert one(f"tags.team {op} ('a', \"b\" , 'c d')") == Condition("tag", "team", op, ("a", "b", "c d"), numeric=False)
    assert one(f"params.x {op} ('only')").value == ("only",)


@pytest.mark.parametrize("op", ["IS NULL", "IS NOT NULL"])
@pytest.mark.parametrize(("prefix", "entity"), [("params", "param"), ("metrics", "metric"), ("tags", "tag")])
def test_is_null(prefix: str, entity: str, op: str) -> None:
    assert one(f"{prefix}.lr {op}") == Condition(entity, "lr", op, None, numeric=False)  # type: ignore[arg-type]
    assert one(f"{prefix}.lr {op.lower()}").op == op


def test_keywords_and_and_are_case_insensitive() -> None:
    conditions = parse_filter(
        "params.a like 'x' AND params.b Ilike 'y' and tags.c not in ('z') aNd metrics.d Is Not Null"
    )
    assert [c.op for c in conditions] == ["LIKE", "ILIKE", "NOT IN", "IS NOT NULL"]
    assert [c.key for c in conditions] == ["a", "b", "c", "d"]


def test_whitespace_is_optional_around_operators() -> None:
    assert parse_filter("metrics.loss<=-1e-3 and params.lr='0.1'") == [
        Condition("metric", "loss", "<=", -0.001, numeric=True),
        Condition("param", "lr", "=", "0.1", numeric=False),
    ]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("params.lr = 'x'", "lr"),
        ("params.model/layer-1.dropout_rate = 'x'", "model/layer-1.dropout_rate"),
        ("params.`my key` = 'x'", "my key"),
        ("params.\"my key\" = 'x'", "my key"),
        ("params.`a.b = c` = 'x'", "a.b = c"),
        ('params."say \\"hi\\"" = \'x\'', 'say "hi"'),
    ],
)
def test_key_quoting(text: str, key: str) -> None:
    assert one(text).key == key


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("'plain'", "plain"),
        ('"double"', "double"),
        ("'it\\'s'", "it's"),
        ('"say \\"hi\\""', 'say "hi"'),
        ("'back\\\\slash'", "back\\slash"),
        ("'100%\\_done'", "100%\\_done"),
        ("'has \"other\" quotes'", 'has "other" quotes'),
        ("''", ""),
    ],
)
def test_string_values(literal: str, value: str) -> None:
    assert one(f"tags.note = {literal}").value == value


@pytest.mark.parametrize(
    ("literal", "value"),
    [("1", 1.0), ("-2", -2.0), ("+3.5", 3.5), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("2.5E-2", 0.025)],
)
def test_numbers(literal: str, value: float) -> None:
    condition = one(f"metrics.m = {literal}")
    assert condition.value == value
    assert isinstance(condition.value, float)


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_params_compared_with_a_number_compare_numerically(op: str) -> None:
    assert one(f"params.lr {op} 0.01") == Condition("param", "lr", op, 0.01, numeric=True)


def test_params_compared_with_a_string_compare_as_strings() -> None:
    assert one("params.lr = '0.01'") == Condition("param", "lr", "=", "0.01", numeric=False)
    assert one('params.lr != "1"') == Condition("param", "lr", "!=", "1", numeric=False)


@pytest.mark.parametrize("prefix", ["attributes", "attribute", "attr", "run"])
def test_attribute_prefixes(prefix: str) -> None:
    assert one(f"{prefix}.status = 'FINISHED'") == Condition("attribute", "status", "=", "FINISHED", numeric=False)


@pytest.mark.parametrize(("prefix", "entity"), [("param", "param"), ("metric", "metric"), ("tag", "tag")])
def test_singular_prefixes(prefix: str, entity: str) -> None:
    assert one(f"{prefix}.k IS NULL").entity == entity


@pytest.mark.parametrize(
    "name", ["run_id", "run_name", "status", "user_id", "artifact_uri", "experiment_id", "lifecycle_stage"]
)
@pytest.mark.parametrize("op", ["=", "!=", "LIKE", "ILIKE"])
def test_string_attributes(name: str, op: str) -> None:
    assert one(f"attributes.{name} {op} 'v'") == Condition("attribute", name, op, "v", numeric=False)
    assert one(f"attributes.{name} IN ('v', 'w')").value == ("v", "w")


@pytest.mark.parametrize("name", ["start_time", "end_time"])
def test_time_attributes_are_numeric(name: str) -> None:
    assert one(f"attributes.{name} >= 1700000000000") == Condition(
        "attribute", name, ">=", 1700000000000.0, numeric=True
    )


def test_created_is_start_time() -> None:
    assert one("attributes.created < 5") == Condition("attribute", "start_time", "<", 5.0, numeric=True)
    assert parse_order_by(["attributes.created"]) == [OrderKey("attribute", "start_time", descending=False)]


def test_conditions_keep_their_order() -> None:
    conditions = parse_filter("metrics.a > 1 and params.b = 'x' and tags.c != 'y' and attributes.status IN ('RUNNING')")
    assert [(c.entity, c.key) for c in conditions] == [
        ("metric", "a"),
        ("param", "b"),
        ("tag", "c"),
        ("attribute", "status"),
    ]


def test_limits_are_inclusive() -> None:
    assert len(parse_filter(" and ".join([f"metrics.m{i} > 0" for i in range(MAX_CONDITIONS)]))) == MAX_CONDITIONS
    items = ", ".join(f"'{i}'" for i in range(MAX_IN_ITEMS))
    assert len(one(f"tags.t IN ({items})").value) == MAX_IN_ITEMS  # type: ignore[arg-type]
    assert one(f"params.{'k' * MAX_KEY_LENGTH} IS NULL").key == "k" * MAX_KEY_LENGTH
    padded = "metrics.a > 1" + " " * (MAX_FILTER_LENGTH - len("metrics.a > 1"))
    assert len(parse_filter(padded)) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo.a = 'x'", r"unknown identifier prefix 'foo' at position 0"),
        ("Params.a = 'x'", r"unknown identifier prefix 'Params'"),
        ("status = 'x'", r"needs a prefix .*found 'status' at position 0"),
        ("attributes.color = 'red'", r"unknown attribute 'color' at position 0"),
        ("metrics.acc = 'high'", r"metrics.acc =: expected a number, found \"'high'\" at position 14"),
        ("tags.v = 1", r"tags.v =: expected a quoted string, found '1' at position 9"),
        ("metrics.acc LIKE '0.9%'", r"compared with numbers.*instead of LIKE, found 'LIKE' at position 12"),
        ("metrics.acc IN ('1')", r"compared with numbers.*instead of IN"),
        ("attributes.start_time = 'x'", r"expected a number, found \"'x'\""),
        ("attributes.end_time ILIKE 'x'", r"compared with numbers.*instead of ILIKE"),
        ("attributes.status > 'x'", r"compared with strings.*instead of >, found '>'"),
        ("attributes.run_id = 3", r"expected a quoted string, found '3'"),
        ("tags.v < 'x'", r"compared with strings.*instead of <"),
        ("params.p < 'x'", r"< needs a number.*found \"'x'\" at position 11"),
        ("params.p LIKE 3", r"LIKE needs a quoted string.*found '3'"),
        ("attributes.status IS NULL", r"IS NULL applies to params, metrics and tags only"),
        ("tags.v = 'abc", r"unterminated string: no closing ' for the one at position 9"),
        ('tags.v = "abc\\"', r'unterminated string: no closing " for the one at position 9'),
        ("params.`abc = 'x'", r"unterminated string: no closing ` for the one at position 7"),
        ("metrics.a = 1 metrics.b = 2", r"expected AND or the end of the filter, found 'metrics.b' at position 14"),
        ("metrics.a = 1)", r"expected AND or the end of the filter, found '\)' at position 13"),
        ("metrics.a = 1 OR metrics.b = 2", r"OR is not supported.*found 'OR' at position 14"),
        ("metrics.a = 1 or metrics.b = 2", r"OR is not supported"),
        ("metrics.a = 1 and", r"expected an identifier.*found end of input at position 17"),
        ("metrics.a", r"expected an operator.*found end of input at position 9"),
        ("metrics.a == 1", r"expected a number, found '=' at position 11"),
        ("params.a =", r"expected a quoted string or a number, found end of input"),
        ("params.a NOT LIKE 'x'", r"expected IN after NOT, found 'LIKE'"),
        ("params.a IS 'x'", r"expected NULL or NOT NULL after IS, found \"'x'\""),
        ("params.a IN 'x'", r"expected a parenthesised list.*found \"'x'\""),
        ("params.a IN ()", r"expected a quoted string in the IN list, found '\)'"),
        ("params.a IN ('x',)", r"expected a quoted string in the IN list, found '\)'"),
        ("params.a IN ('x', 1)", r"expected a quoted string in the IN list, found '1'"),
        ("params.a IN ('x' 'y')", r"expected ',' or '\)' in the IN list"),
        ("params.a IN ('x'", r"expected ',' or '\)' in the IN list, found end of input"),
        ("metrics.a = 1x", r"malformed number, found '1x' at position 12"),
        ("metrics.a = 1e999", r"number out of range"),
        ("metrics.a = 1 && metrics.b = 2", r"unexpected character, found '&' at position 14"),
        ("metrics. = 1", r"missing key after 'metrics.' at position 0"),
        (f"params.{'k' * (MAX_KEY_LENGTH + 1)} IS NULL", rf"longer than {MAX_KEY_LENGTH} characters"),
        ("metrics.a > 1" + " " * MAX_FILTER_LENGTH, rf"filter is longer than {MAX_FILTER_LENGTH} characters"),
        (
            " and ".join([f"metrics.m{i} > 0" for i in range(MAX_CONDITIONS + 1)]),
            rf"more than {MAX_CONDITIONS} conditions",
        ),
        (
            "tags.t IN (" + ", ".join(f"'{i}'" for i in range(MAX_IN_ITEMS + 1)) + ")",
            rf"more than {MAX_IN_ITEMS} items",
        ),
    ],
)
def test_filter_errors(text: str, message: str) -> None:
    with pytest.raises(SearchSyntaxError, match=message):
        parse_filter(text)


def test_search_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_filter("nonsense")


@pytest.mark.parametrize(
    ("clause", "key"),
    [
        ("metrics.val_acc", OrderKey("metric", "val_acc", descending=False)),
        ("metrics.val_acc ASC", OrderKey("metric", "val_acc", descending=False)),
        ("metrics.val_acc DESC", OrderKey("metric", "val_acc", descending=True)),
        ("metrics.val_acc desc", OrderKey("metric", "val_acc", descending=True)),
        ("metrics.val_acc Asc", OrderKey("metric", "val_acc", descending=False)),
        ("-metrics.val_acc", OrderKey("metric", "val_acc", descending=True)),
        ("  - metrics.val_acc  ", OrderKey("metric", "val_acc", descending=True)),
        ("params.`batch size` DESC", OrderKey("param", "batch size", descending=True)),
        ('tags."owner"', OrderKey("tag", "owner", descending=False)),
        ("attributes.start_time DESC", OrderKey("attribute", "start_time", descending=True)),
        ("attr.end_time", OrderKey("attribute", "end_time", descending=False)),
        ("run.run_name", OrderKey("attribute", "run_name", descending=False)),
        ("attribute.status desc", OrderKey("attribute", "status", descending=True)),
        ("attributes.run_id", OrderKey("attribute", "run_id", descending=False)),
        ("-attributes.created", OrderKey("attribute", "start_time", descending=True)),
    ],
)
def test_order_by_clauses(clause: str, key: OrderKey) -> None:
    assert parse_order_by([clause]) == [key]


def test_order_by_keeps_clause_order() -> None:
    assert parse_order_by(["metrics.a DESC", "params.b", "-attributes.start_time"]) == [
        OrderKey("metric", "a", descending=True),
        OrderKey("param", "b", descending=False),
        OrderKey("attribute", "start_time", descending=True),
    ]


@pytest.mark.parametrize("clauses", [None, []])
def test_no_order_by(clauses: list[str] | None) -> None:
    assert parse_order_by(clauses) == []


@pytest.mark.parametrize(
    ("clauses", "message"),
    [
        (["metrics.a", "bogus.b"], r"order_by\[1\]: unknown identifier prefix 'bogus' at position 0"),
        (["attributes.user_id"], r"order_by\[0\]: unknown attribute 'user_id'"),
        (["start_time"], r"order_by\[0\]: .*needs a prefix.*found 'start_time'"),
        (["metrics.a DESCENDING"], r"expected ASC, DESC or the end of the clause, found 'DESCENDING' at position 10"),
        (["metrics.a DESC ASC"], r"expected ASC, DESC or the end of the clause, found 'ASC'"),
        (["-metrics.a DESC"], r"leading '-' already orders descending.*found 'DESC' at position 11"),
        (["--metrics.a"], r"order_by\[0\]: unexpected character, found '-' at position 1"),
        ([""], r"order_by\[0\]: expected an identifier.*found end of input"),
        (["metrics.`a"], r"unterminated string"),
        (["metrics.a"] * (MAX_ORDER_CLAUSES + 1), rf"more than {MAX_ORDER_CLAUSES} clauses"),
        (["metrics.a" + " " * 500], r"order_by\[0\]: longer than 500 characters"),
    ],
)
def test_order_by_errors(clauses: list[str], message: str) -> None:
    with pytest.raises(SearchSyntaxError, match=message):
        parse_order_by(clauses)


# Round trip: random valid conditions, written out in varied styles, parse back to themselves.

_KEY_CHARS = "abcXYZ019_-./ '\"=`"
_VALUE_CHARS = "abc XYZ 09%_'\"\\()," + "é"


def _random_key(rng: random.Random) -> str:
    return "".join(rng.choice(_KEY_CHARS) for _ in range(rng.randint(1, 12)))


def _random_string(rng: random.Random) -> str:
    return "".join(rng.choice(_VALUE_CHARS) for _ in range(rng.randint(0, 10)))


def _quote(value: str, quote: str) -> str:
    return quote + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


def _write_key(key: str, rng: random.Random) -> str:
    plain = all(char.isalnum() or char in "_-./" for char in key)
    if "`" not in key and (not plain or rng.random() < 0.3):
        return "`" + key + "`"
    if not plain or rng.random() < 0.3:
        return _quote(key, '"')
    return key


def _random_condition(rng: random.Random) -> Condition:
    entity = rng.choice(["param", "metric", "tag", "attribute"])
    if entity == "attribute":
        name = rng.choice(["run_id", "run_name", "status", "user_id", "start_time", "end_time", "lifecycle_stage"])
        if name in ("start_time", "end_time"):
            return Condition("attribute", name, rng.choice(["=", "!=", "<", "<=", ">", ">="]), _number(rng), True)
        return _string_condition("attribute", name, rng)
    key = _random_key(rng)
    if rng.random() < 0.1:
        return Condition(entity, key, rng.choice(["IS NULL", "IS NOT NULL"]), None, False)  # type: ignore[arg-type]
    if entity == "metric" or (entity == "param" and rng.random() < 0.5):
        return Condition(entity, key, rng.choice(["=", "!=", "<", "<=", ">", ">="]), _number(rng), True)  # type: ignore[arg-type]
    return _string_condition(entity, key, rng)  # type: ignore[arg-type]


def _number(rng: random.Random) -> float:
    return rng.choice([float(rng.randint(-1000, 10**13)), rng.uniform(-1e6, 1e6), rng.uniform(-1, 1) * 1e-300])


def _string_condition(entity: str, key: str, rng: random.Random) -> Condition:
    op = rng.choice(["=", "!=", "LIKE", "ILIKE", "IN", "NOT IN"])
    if op in ("IN", "NOT IN"):
        items = tuple(_random_string(rng) for _ in range(rng.randint(1, 4)))
        return Condition(entity, key, op, items, False)  # type: ignore[arg-type]
    return Condition(entity, key, op, _random_string(rng), False)  # type: ignore[arg-type]


def _write(condition: Condition, rng: random.Random) -> str:
    prefixes = {
        "param": ["params", "param"],
        "metric": ["metrics", "metric"],
        "tag": ["tags", "tag"],
        "attribute": ["attributes", "attribute", "attr", "run"],
    }
    ident = f"{rng.choice(prefixes[condition.entity])}.{_write_key(condition.key, rng)}"
    op = rng.choice([condition.op, condition.op.lower(), condition.op.title()])
    value = condition.value
    if value is None:
        written = ""
    elif isinstance(value, float):
        written = repr(value)
    elif isinstance(value, tuple):
        written = "(" + ", ".join(_quote(item, rng.choice("'\"")) for item in value) + ")"
    else:
        written = _quote(value, rng.choice("'\""))
    space = rng.choice(["", " ", "  "]) if op[0] in "=!<>" else " "
    return f"{ident}{space}{op}{space}{written}".rstrip()


def test_random_conditions_parse_back() -> None:
    rng = random.Random(0)
    conditions = [_random_condition(rng) for _ in range(200)]
    written = [_write(condition, rng) for condition in conditions]
    for condition, text in zip(conditions, written, strict=True):
        assert parse_filter(text) == [condition], text
    # Joined with "and" (any case), in batches within the limits on conditions and length.
    start = 0
    while start < len(conditions):
        end = start
        length = 0
        while end < len(conditions) and end - start < MAX_CONDITIONS and length + len(written[end]) + 5 <= 4000:
            length += len(written[end]) + 5
            end += 1
        joiner = rng.choice([" and ", " AND ", " And "])
        assert parse_filter(joiner.join(written[start:end])) == conditions[start:end]
        start = end
    assert start == len(conditions)
