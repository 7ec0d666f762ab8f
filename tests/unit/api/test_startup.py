"""kiln.api.startup: the one line each start-up failure becomes, for the cases a test run cannot cause for real
(a permission the root user of a test machine always has, settings of the Kubernetes backend)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from pydantic import ValidationError

from kiln.api.startup import EXIT_ERROR, EXIT_USAGE, StartupError, explain, listen_socket
from kiln.errors import KilnError
from kiln.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


def test_a_home_this_user_may_not_write_names_kiln_home(settings):
    error = explain(PermissionError(errno.EACCES, "Permission denied", str(settings.home)), settings)
    assert error.exit_code == EXIT_ERROR
    assert error.message.startswith(f"cannot use KILN_HOME={settings.home}: Permission denied")
    inside = explain(PermissionError(errno.EACCES, "Permission denied", str(settings.home / "kiln.db")), settings)
    assert inside.message.startswith(f"cannot use KILN_HOME={settings.home}: Permission denied: ")


def test_invalid_backend_settings_name_their_own_variables(monkeypatch, settings):
    monkeypatch.setenv("KILN_KUBERNETES_IMAGE_PULL_GRACE", "soon")
    with pytest.raises(ValidationError) as caught:
        Settings(home=settings.home)  # the backend's settings are a branch of the one tree
    error = explain(caught.value, settings)
    assert error.exit_code == EXIT_USAGE
    assert error.message.startswith("invalid settings: KILN_KUBERNETES_IMAGE_PULL_GRACE: ")


def test_a_kiln_error_is_its_message_and_anything_else_points_at_debug(settings):
    assert explain(KilnError("another Kiln server ..."), settings).message == "another Kiln server ..."
    other = explain(RuntimeError("boom\nsecond line"), settings)
    assert other.message == "the server could not start: RuntimeError: boom (kiln server --debug prints the traceback)"


def test_a_port_out_of_range_is_refused_before_binding():
    with pytest.raises(StartupError, match="KILN_PORT=0 is not a port number"):
        listen_socket("127.0.0.1", 0)


def test_connections_accepted_on_the_listening_socket_do_not_wait_for_delayed_acks():
    """asyncio turns Nagle off (TCP_NODELAY) on accepted connections only when the listening socket says it is TCP:
    a socket made with protocol 0 left every response waiting ~40 ms on the client's delayed ACK."""
    import asyncio
    import socket

    from kiln.api.startup import listen_socket
    from tests.kilnserver import free_port

    async def accepted_nodelay() -> int:
        sock = listen_socket("127.0.0.1", free_port())
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0
