"""The client's state directory, and the credentials file format shared by ``admin.env`` and the client's
``config``. Both live in ``kiln.auth.credfile``, where the server (which writes ``admin.env``) and the settings
(which default the client's ``config`` path) reach them without importing the SDK."""

from __future__ import annotations

from kiln.auth.credfile import client_dir, read_config_file, server_home, write_config_file

__all__ = ["client_dir", "read_config_file", "server_home", "write_config_file"]
