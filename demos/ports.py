"""Before a demo loads its models: is its port free? (No gradio here, so `make test` checks it.)"""

from __future__ import annotations

import errno
import socket


def check_port(host: str, port: int) -> None:
    """SystemExit with one line where `host:port` cannot be bound (another demo on it, say),
    naming `--port` as the way out, instead of gradio's traceback after the models loaded."""
    if not 0 <= port <= 65535:
        raise SystemExit(f"--port must be 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise SystemExit(f"port {port} on {host} is in use (another demo?): pass "
                                 f"--port {port + 1}, or stop what listens there") from None
            raise SystemExit(f"cannot listen on {host}:{port} ({err.strerror}): pass another "
                             f"--host or --port") from None
