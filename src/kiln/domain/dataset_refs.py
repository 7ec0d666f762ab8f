"""Dataset names and references, one parser for the server, the SDK and the CLI.

A reference is ``NAME`` (the latest version), ``NAME@latest`` (the same) or ``NAME@VERSION`` (a number from 1 to
``limits.MAX_DATASET_VERSION``). A name is lowercase letters, digits and ``. _ -``, at most 100 characters,
starting with a letter or digit, without ``..`` or anything percent-encoded. Errors are ``DatasetRefError`` (a
ValueError, so a pydantic validator reports it on its field); the server turns them into ``BadRequest`` with the
same message, and so does the SDK, which refuses what the server refuses before it sends anything.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kiln.domain import limits

NAME = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{limits.MAX_DATASET_NAME_LENGTH - 1}}}")
PERCENT_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")
LATEST = "latest"
REF_FORMAT = "NAME, NAME@VERSION or NAME@latest"


class DatasetRefError(ValueError):
    """Not a dataset name, version or reference; the message quotes it and says what is allowed."""


class DatasetRef(NamedTuple):
    name: str
    version: int | None  # None: the latest ready version


def check_name(name: str) -> str:
    """``name`` when it is a valid dataset name, else DatasetRefError naming the rule it breaks."""
    if PERCENT_ENCODED.search(name) or "%" in name:
        raise DatasetRefError(f"dataset name {name!r}: percent-encoded characters are not allowed")
    if "/" in name or "\\" in name or "\x00" in name:
        raise DatasetRefError(f"dataset name {name!r}: '/', '\\' and NUL are not allowed")
    if ".." in name:
        raise DatasetRefError(f"dataset name {name!r}: '..' is not allowed")
    if not NAME.fullmatch(name):
        raise DatasetRefError(
            f"dataset name {name!r}: use lowercase letters, digits and . _ - (at most "
            f"{limits.MAX_DATASET_NAME_LENGTH}, starting with a letter or digit)"
        )
    return name


def _version_number(text: str) -> int | None:
    """None for ``latest``, else the number (from 1 to the maximum); DatasetRefError saying so otherwise."""
    if text == LATEST:
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= limits.MAX_DATASET_VERSION:
        raise DatasetRefError(f"a number from 1 to {limits.MAX_DATASET_VERSION}, or '{LATEST}'")
    return int(text)


def parse_version(text: str) -> int | None:
    """A version as a URL or a flag writes it: ``latest`` → None, ``3`` → 3."""
    try:
        return _version_number(text)
    except DatasetRefError as exc:
        raise DatasetRefError(f"version {text!r}: {exc}") from None


def parse_ref(ref: str) -> DatasetRef:
    """``NAME``, ``NAME@latest`` → (name, None); ``NAME@VERSION`` → (name, version)."""
    name, at, version = ref.partition("@")
    check_name(name)
    if not at:
        return DatasetRef(name, None)
    try:
        return DatasetRef(name, _version_number(version))
    except DatasetRefError as exc:
        raise DatasetRefError(f"dataset reference {ref!r}: the version after @ is {exc}") from None
