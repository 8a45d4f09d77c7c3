"""Helpers for tests that start real runs with ``python -m sfbus run``."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path


def start_run(topology: str | Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``sfbus run`` in the background, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "sfbus", "run", str(topology), "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(condition, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def segments_of(launcher_pid: int) -> list[str]:
    """Shared-memory segments created by the launcher with this pid."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"sfbus-{launcher_pid}-")]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_listeners() -> list[tuple[str, int, int]]:
    """Every TCP socket of this machine in LISTEN state: (local address, port, socket inode)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # the kernel writes each 32-bit word in host order
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            address = ipaddress.ip_address(struct.pack(f">{len(words)}I", *words))
            found.append((str(address), int(hex_port, 16), int(fields[9])))
    return found


def listening(port: int) -> set[str]:
    """The local addresses of every TCP socket of this machine listening on ``port``."""
    return {address for address, at, _ in tcp_listeners() if at == port}
