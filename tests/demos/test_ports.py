"""A demo started on a busy port says so in one line naming --port, before it loads a model."""

import socket

import pytest

from demos.ports import check_port


def test_a_busy_port_names_the_way_out():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stop:
            check_port("127.0.0.1", port)
    message = str(stop.value)
    assert f"port {port} on 127.0.0.1 is in use" in message and "--port" in message
    assert "\n" not in message


def test_a_free_port_passes_and_a_bad_one_is_named():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    check_port("127.0.0.1", port)  # free again
    with pytest.raises(SystemExit, match="--port must be 0..65535, got 70000"):
        check_port("127.0.0.1", 70000)
