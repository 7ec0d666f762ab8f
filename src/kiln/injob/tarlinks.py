"""Whether a code bundle's links stay inside the directory it unpacks into, resolved the way the kernel will.

A link's target checked on its own text can look inside and still leave: ``p -> q/..`` is the bundle's root
until ``q -> .`` exists, then ``q/..`` is the root's parent. Python's ``data`` filter checks each link against
the tree as extracted so far, so the order of the members decides (``p`` before ``q`` passes). Here every link
is resolved against all of the bundle's links at once (the tree as it will be once unpacked, whatever the order),
following links through each component as the kernel does, ``..`` included.

Standard library only: the server checks uploads with it (``storage/archive.py``) and the shim checks the bundle
again before extracting it (``shimprep.py``, loaded as a plain module when the shim runs as a script).
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable

MAX_HOPS = 40  # the kernel's own limit on links followed in one lookup (ELOOP)


def escaping_link(members: Iterable[tarfile.TarInfo]) -> str | None:
    """Why the bundle of ``members`` is refused (naming the member), or None when every link, resolved through
    the others, stays inside it."""
    links: dict[str, str] = {}
    hard: list[tarfile.TarInfo] = []
    for member in members:
        name = posixpath.normpath(member.name).lstrip("/")
        if member.issym():
            links[name] = member.linkname
        elif member.islnk():
            hard.append(member)
        else:
            links.pop(name, None)  # a later member of the same name replaces the link
    for name, target in sorted(links.items()):
        if target.startswith("/") or _resolve([*name.split("/")[:-1], *target.split("/")], links) is None:
            return f"symlink leaves the bundle: {name!r} -> {target!r} (resolved through the bundle's other links)"
    for member in hard:
        # link(2) follows every component of the target but its last: a hard link to a symlink is that symlink.
        parts = member.linkname.split("/")
        if member.linkname.startswith("/") or _resolve(parts[:-1], links) is None:
            return f"hard link leaves the bundle: {member.name!r} -> {member.linkname!r}"
    return None


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """The components of the path ``parts`` (relative to the bundle's root) names once ``links`` are followed,
    or None when it leaves the root (or loops)."""
    out: list[str] = []
    queue = list(parts)
    hops = 0
    while queue:
        part = queue.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is None:
            continue
        hops += 1
        if hops > MAX_HOPS or target.startswith("/"):
            return None
        out.pop()
        queue[:0] = target.split("/")
    return out
