"""llmbench.procs.free_port: a rank's rendezvous port or an engine's, out of the way of
outgoing connections."""

import contextlib
import socket

from llmbench import procs


def test_a_free_port_is_below_the_ephemeral_range_and_free(tmp_path, monkeypatch):
    """Outgoing connections take ports from the kernel's ephemeral range: a port picked
    below it cannot be handed to a client between its pick and the rank's listen."""
    rng = tmp_path / "ip_local_port_range"
    rng.write_text("40000\t60999\n")
    monkeypatch.setattr(procs, "EPHEMERAL_RANGE", rng)
    for _ in range(20):
        port = procs.free_port()
        assert 40000 - procs._PORT_SPAN <= port < 40000
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_where_no_port_below_the_range_binds_the_os_picks(tmp_path, monkeypatch):
    rng = tmp_path / "ip_local_port_range"
    rng.write_text("1024 60999\n")  # nothing below it to pick from
    monkeypatch.setattr(procs, "EPHEMERAL_RANGE", rng)
    assert 1024 <= procs.free_port() <= 65535
    monkeypatch.setattr(procs, "EPHEMERAL_RANGE", tmp_path / "absent")  # unreadable: the kernel's default
    assert procs._ephemeral_low() == 32768
