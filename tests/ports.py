"""Free TCP ports for the servers the tests start, never the same one twice in a test session.

A port is "free" when the kernel hands it out for a throwaway socket; picking two before either server binds can
return the same number twice (seen: two replicas on one port, the second failing to bind while its readiness
check was answered by the first). The ports already handed out are remembered and skipped.
"""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that this test run has not handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
