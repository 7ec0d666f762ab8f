"""The Kiln API's port on a ``network: none`` job's loopback, without pasta: a listening socket made *in* the job's
network namespace by its shim (outside the sandbox), and a bounded forwarder from it to the API.

Standard library only, like the shim that loads it (``kiln.injob.apiport`` in the package, or a plain module from
this file's directory when the shim runs as a script). ``netns.JobNetwork`` opens it when the attempt's network
config carries ``"api"`` (``backends/local/network.py`` puts it there for ``none`` only)::

    "api": {"port": 8080,                  the job's 127.0.0.1:8080, as $KILN_ENDPOINT names it
            "target": ["127.0.0.1", 8080], the API on the machine's loopback, where the forwarder connects
            "connections": 32}             the most connections forwarded at once for this member

Why this way. A socket belongs to the network namespace it was made in, whoever holds it later: a thread of the
shim moves into the job's namespace (``setns``), makes the socket, and moves back; bound to 127.0.0.1:PORT and
listening, it is the job's 127.0.0.1:PORT, while the shim that accepts on it, and the connection it opens to the
API, stay in the machine's namespace. So the job's SDK reaches the same URL as under ``isolated`` (where pasta
forwards the port), and ``none`` needs no process of its own: a pasta costs 15-18 ms of CPU at its start even idle
(the kernel zeroing its buffers), more than everything else the namespace costs together. The forwarder is a
thread of the shim that already supervises the job (no process, nothing to start), and it lives as long as the
member it serves, not as long as the server: a server restarted meanwhile is reached again at the same port, as
pasta reached it. A Unix socket bound into the sandbox would have needed another URL for the SDK, and the server
accepting on the job's socket itself would have tied jobs to the server's lifetime and its HTTP stack's insides.

What the job can do with the port: connect to it, and each connection it makes becomes one connection to the
API's fixed address and nothing else (no address is read from what it sends), with its bytes copied as they are,
both ways, through buffers of ``BUFFER`` bytes: no amplification, and the API still wants the job's token. At
most ``connections`` are forwarded at once; beyond that the forwarder stops accepting and the kernel's backlog
(``BACKLOG``) holds the rest until one ends, so a job that opens thousands of connections holds at most that
many of the API's. The listener is root's, so the job (another uid, no capabilities) cannot bind the port.

A gang's members share one namespace on a machine: each member's shim binds its own listener on the port with
``SO_REUSEPORT`` (the kernel spreads connections over them, and moves those still queued on a listener that
closes to the others: ``tcp_migrate_req``, set in the namespace by ``netns.py``), so the port stays served while
any member runs, whichever made the namespace and in whatever order they end. A member's shim that ends stops
accepting, closes the connections that are idle (no request in flight: what the client sends next goes through
a new connection, to a member still there), and lets the ones in flight finish, for at most ``LINGER_SECONDS``.
"""

from __future__ import annotations

import _thread
import errno
import os
import selectors
import socket
import time

BUFFER = 65536  # per direction per connection: what is read from one side before the other has taken it
BACKLOG = 64  # connections the kernel holds for the job while the forwarder is at its bound
CONNECTIONS = 32  # forwarded at once per member, unless the config says otherwise
LINGER_SECONDS = 2.0  # at close: the longest a request in flight is waited for
QUIET_SECONDS = 0.2  # at close: a connection whose last bytes were an answer, quiet this long, is idle


def listen(sock: socket.socket, port: int) -> None:
    """``sock`` (a TCP socket made in the job's namespace: it stays that namespace's, whoever holds it) listening on
    127.0.0.1:``port`` there, non-blocking. ``SO_REUSEPORT``: each of a gang's members binds one."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(BACKLOG)
    sock.setblocking(False)


class _Link:
    """One forwarded connection: the job's end (``down``) and the API's (``up``)."""

    __slots__ = (
        "connecting",
        "down",
        "down_eof",
        "down_shut",
        "last_down",
        "last_up",
        "to_down",
        "to_up",
        "up",
        "up_eof",
        "up_shut",
    )

    def __init__(self, down: socket.socket, up: socket.socket) -> None:
        self.down, self.up = down, up
        self.to_up = bytearray()  # read from the job, not yet taken by the API
        self.to_down = bytearray()  # read from the API, not yet taken by the job
        self.down_eof = self.up_eof = False  # the side sent its FIN
        self.up_shut = self.down_shut = False  # its FIN was passed on
        self.connecting = True
        self.last_up = self.last_down = time.monotonic()  # when bytes last came from the job / from the API

    def done(self) -> bool:
        return self.down_shut and self.up_shut

    def idle(self, now: float) -> bool:
        """No request in flight: nothing buffered, and the last bytes (if any) were the API's answer, a while ago."""
        return (
            not self.connecting
            and not self.to_up
            and not self.to_down
            and self.last_down >= self.last_up
            and now - self.last_down >= QUIET_SECONDS
        )


class ApiPort:
    """The forwarder of one member: a daemon thread accepting on ``listener`` and relaying each connection to
    ``target``, until :meth:`close`."""

    def __init__(self, listener: socket.socket, target: tuple[str, int], connections: int | None = None) -> None:
        self.listener = listener
        self.target = (str(target[0]), int(target[1]))
        self.connections = max(1, int(connections or CONNECTIONS))
        self.accepted = 0  # connections forwarded so far
        self.refused = 0  # connections whose API end could not be made (the job's end is reset)
        self.most = 0  # the most forwarded at once
        self._links: dict[int, _Link] = {}  # by the fileno of either end
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._linger = LINGER_SECONDS
        self._listening = False
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._listen(True)
        # A bare thread (threading's start waits until it runs: a wait for the scheduler on a loaded machine, in
        # the way of the job's start); this lock is released when it ends.
        self._running = _thread.allocate_lock()
        self._running.acquire()
        self._closed = False
        _thread.start_new_thread(self._run, ())

    def close(self, linger: float = LINGER_SECONDS) -> None:
        """Stop accepting, close what is idle, give what is in flight up to ``linger`` seconds, then close all."""
        if self._closed:
            return
        self._closed = True
        self._linger = linger
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._running.acquire(timeout=linger + 5.0)
        os.close(self._wake_w)

    # -- the thread ---------------------------------------------------------------------------------------------

    def _run(self) -> None:
        deadline = None
        try:
            while True:
                now = time.monotonic()
                if self._stopping:
                    if deadline is None:
                        deadline = now + self._linger
                        self._listen(False)
                        self.listener.close()
                    for each in self._each():
                        if each.idle(now):
                            self._end(each)
                    if not self._links or now >= deadline:
                        break
                    timeout: float | None = min(QUIET_SECONDS / 2, max(0.0, deadline - now))
                else:
                    timeout = None
                for key, events in self._sel.select(timeout):
                    fd = key.fd
                    if fd == self._wake_r:
                        try:
                            os.read(fd, 64)
                        except OSError:
                            pass
                    elif key.data == "listener":
                        self._accept()
                    else:
                        found = self._links.get(fd)
                        if found is not None:
                            self._step(found, fd, events)
        except Exception as exc:  # a bug: said in the shim's log, and the port is closed rather than left unserved
            import traceback

            traceback.print_exception(exc)
        finally:
            for each in self._each():
                self._end(each)
            self.listener.close()
            self._sel.close()
            os.close(self._wake_r)
            self._running.release()

    def _each(self) -> list[_Link]:
        return list({id(x): x for x in self._links.values()}.values())

    def _listen(self, on: bool) -> None:
        if on and not self._listening and not self._stopping:
            self._sel.register(self.listener, selectors.EVENT_READ, "listener")
            self._listening = True
        elif not on and self._listening:
            self._sel.unregister(self.listener)
            self._listening = False

    def _count(self) -> int:
        return len(self._links) // 2

    def _accept(self) -> None:
        while self._count() < self.connections:
            try:
                down, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: accepting again once a connection ends
                if self._links:
                    self._listen(False)
                else:
                    time.sleep(0.05)
                return
            down.setblocking(False)
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setblocking(False)
            code = up.connect_ex(self.target)
            if code not in (0, errno.EINPROGRESS):
                self._reset(down, up)
                continue
            link = _Link(down, up)
            link.connecting = code == errno.EINPROGRESS
            self._links[down.fileno()] = self._links[up.fileno()] = link
            self.accepted += 1
            self.most = max(self.most, self._count())
            self._update(link)
        self._listen(False)  # at the bound: the kernel's backlog holds the rest until a connection ends

    def _reset(self, down: socket.socket, up: socket.socket) -> None:
        """The API could not be reached: the job's end is reset (it sees ECONNRESET, and its SDK tries again)."""
        self.refused += 1
        try:
            down.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        down.close()
        up.close()

    def _step(self, link: _Link, fd: int, events: int) -> None:
        try:
            if link.connecting:
                if fd == link.up.fileno():  # the connection to the API is made, or failed
                    if link.up.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self._drop(link)
                        self._reset(link.down, link.up)
                        return
                    link.connecting = False
                elif events & selectors.EVENT_READ:
                    self._read(link, True)
            elif events & selectors.EVENT_READ:
                self._read(link, fd == link.down.fileno())
            self._flush(link)
        except OSError:
            self._end(link)
            return
        if link.done():
            self._end(link)
        else:
            self._update(link)

    def _read(self, link: _Link, from_down: bool) -> None:
        src = link.down if from_down else link.up
        buf = link.to_up if from_down else link.to_down
        try:
            data = src.recv(BUFFER - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        now = time.monotonic()
        if from_down:
            link.last_up = now
        else:
            link.last_down = now
        if not data:
            if from_down:
                link.down_eof = True
            else:
                link.up_eof = True
            return
        buf += data

    def _flush(self, link: _Link) -> None:
        """Pass on what is buffered each way, and a FIN once its side's bytes are all passed on."""
        if link.connecting:
            return
        for buf, dst in ((link.to_up, link.up), (link.to_down, link.down)):
            if buf:
                try:
                    sent = dst.send(buf)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                del buf[:sent]
        if link.down_eof and not link.to_up and not link.up_shut:
            link.up.shutdown(socket.SHUT_WR)
            link.up_shut = True
        if link.up_eof and not link.to_down and not link.down_shut:
            link.down.shutdown(socket.SHUT_WR)
            link.down_shut = True

    def _update(self, link: _Link) -> None:
        """What each end is waited for: readable while its buffer has room, writable while the other's has bytes."""
        for sock, eof, room, pending in (
            (link.down, link.down_eof, len(link.to_up) < BUFFER, link.to_down),
            (link.up, link.up_eof, len(link.to_down) < BUFFER, link.to_up),
        ):
            if sock is link.up and link.connecting:
                mask = selectors.EVENT_WRITE
            else:
                mask = (0 if eof or not room else selectors.EVENT_READ) | (selectors.EVENT_WRITE if pending else 0)
            key = self._sel.get_map().get(sock.fileno())
            if mask == 0:
                if key is not None:
                    self._sel.unregister(sock)
            elif key is None:
                self._sel.register(sock, mask)
            elif key.events != mask:
                self._sel.modify(sock, mask)

    def _drop(self, link: _Link) -> None:
        for sock in (link.down, link.up):
            fd = sock.fileno()
            if fd >= 0:
                self._links.pop(fd, None)
                if self._sel.get_map().get(fd) is not None:
                    self._sel.unregister(fd)

    def _end(self, link: _Link) -> None:
        self._drop(link)
        link.down.close()
        link.up.close()
        if not self._stopping:
            self._listen(True)  # below the bound again
