"""Encryption at rest for access-key secrets (the server must know them to check HMAC signatures)."""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from kiln.errors import KilnError

_KEY_ALPHABET = string.ascii_uppercase + string.digits


def new_access_key_id() -> str:
    return "AK" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(18))


def new_secret_key() -> str:
    return secrets.token_urlsafe(30)


def load_or_create_server_key(path: Path) -> bytes:
    """The server's Fernet key: read it, or generate it on first start with mode 0600."""
    if path.exists():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key + b"\n")
    return key


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def seal(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken as exc:
            # Never include the token or any secret in the message.
            raise KilnError("a stored secret cannot be decrypted with this server key") from exc
