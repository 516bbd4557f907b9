"""A guard against reaching other machines, from inside one Python process (an audit hook).

`install("raise")` makes every attempt to resolve or connect to a host that is not this machine fail
at once with OSError naming the host (and the guard); `install("log")` lets it through but prints one
line to stderr with the host and the Python frames that asked, so a step that waits on a network with
no answer shows where it is. Loopback addresses, this machine's own name and Unix sockets pass: vLLM
and parity-ui talk to their own processes that way.

Used by the tests (a tiny model is built with the sockets refused) and by bench/gpu_vlm.py (its build
step refuses, its engine workers log, through a sitecustomize it writes). Audit hooks cannot be
removed: install it in a process of its own.
"""
from __future__ import annotations

import socket
import sys
import traceback

_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "0.0.0.0", "::",
                "::1", "127.0.0.1"}
_installed: list[str] = []


def _is_local(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return True
    h = host.strip("[]").lower()
    if h in _LOCAL_NAMES or h.startswith("127.") or h.startswith("::ffff:127."):
        return True
    try:
        return h == socket.gethostname().lower()  # no getfqdn(): that one asks DNS
    except OSError:
        return False


def _target(event: str, args: tuple) -> tuple[str, object] | None:
    """(host, port) a socket event reaches out to, or None when it stays on this machine."""
    if event == "socket.getaddrinfo":
        host, port = args[0], args[1]
    elif event in ("socket.gethostbyname", "socket.gethostbyname_ex"):
        host, port = args[0], None
    elif event in ("socket.connect", "socket.sendto"):
        address = args[1] if event == "socket.connect" else args[-1]
        if not isinstance(address, tuple) or not address:  # AF_UNIX paths, abstract sockets
            return None
        host, port = address[0], address[1] if len(address) > 1 else None
    else:
        return None
    return None if _is_local(host) else (str(host), port)


def install(mode: str = "raise") -> None:
    """Install the guard in this process ("raise" or "log"); a second call does nothing."""
    if mode not in ("raise", "log"):
        raise ValueError(f"mode {mode!r}: 'raise' or 'log'")
    if _installed:
        return
    _installed.append(mode)

    def hook(event: str, args: tuple) -> None:
        if not event.startswith("socket."):
            return
        hit = _target(event, args)
        if hit is None:
            return
        host, port = hit
        where = "".join(traceback.format_stack(limit=12)[:-1])
        if mode == "raise":
            raise OSError(f"network access refused by the test guard (tests/no_network.py): {event} {host}:{port}; "
                          "this step must work offline (local files only)")
        print(f"[no_network] {event} {host}:{port} from\n{where}", file=sys.stderr, flush=True)

    sys.addaudithook(hook)
