"""MLflow's LIKE on SQLite: the pattern as a GLOB matches exactly the strings a case-sensitive LIKE matches."""

from __future__ import annotations

import random
import re
import sqlite3

from sqlalchemy import column, select
from sqlalchemy.dialects import postgresql, sqlite

from kiln.usecases.tracking.run_query import CaseSensitiveLike, like_as_glob


def _like(pattern: str, text: str) -> bool:
    """A case-sensitive LIKE, written out: % any run, _ one character, everything else itself."""
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


def test_the_glob_matches_what_a_case_sensitive_like_does() -> None:
    rnd = random.Random(11)
    alphabet = "aAbB%_*?[]^!-\\"
    conn = sqlite3.connect(":memory:")
    checked = matched = 0
    for _ in range(3000):
        pattern = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5)))
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5)))
        if rnd.random() < 0.3:  # texts built from the pattern, so that many match
            text = "".join(rnd.choice("aA") if ch in "%_" else ch for ch in pattern)
        got = conn.execute("SELECT ? GLOB ?", (text, like_as_glob(pattern))).fetchone()[0] == 1
        assert got == _like(pattern, text), (pattern, text, like_as_glob(pattern))
        checked += 1
        matched += got
    assert checked == 3000 and matched > 500  # both outcomes were exercised


def test_it_compiles_to_glob_on_sqlite_and_like_elsewhere() -> None:
    query = select(column("value")).where(CaseSensitiveLike(column("value"), "Ad_m%"))
    lite = query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
    pg = query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    assert "value GLOB 'Ad?m*'" in str(lite)
    assert "value LIKE 'Ad_m%%'" in str(pg) or "value LIKE 'Ad_m%'" in str(pg)
