"""The session's leftover check sees what it must (its positive control)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import SHM, _descendants, _left_files


def test_the_leftover_check_sees_a_child_process_and_a_segment() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    segment = SHM / f"sfbus-{os.getpid()}-leftovertest-x"
    try:
        segment.write_bytes(b"x")
        assert child.pid in _descendants(os.getpid())
        assert str(segment) in _left_files()
    finally:
        child.kill()
        child.wait()
        segment.unlink()
    assert child.pid not in _descendants(os.getpid())
    assert str(segment) not in _left_files()
