"""The kernel's exceptions: each says whose fault it is and how to recover."""

from __future__ import annotations


class SfbusError(Exception):
    """Base of every error the kernel raises on purpose."""


class BadInput(SfbusError):
    """The user's input (a file, a flag, a path) is wrong; nothing was started: exit code 2."""


class RunDirError(BadInput):
    """A run directory that cannot be used (a bad path, not a run, in use by another run)."""


class TopologyError(BadInput):
    """The user's topology file or ``--set`` value is wrong; nothing was started.

    ``str()`` gives ``file:line:col: key.path: message`` so editors can jump to it.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, key: str | None = None) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.key = key
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.file or "<topology>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class SharedMemoryError(SfbusError):
    """A shared-memory segment could not be created or attached (missing, wrong size, taken)."""


class SlotPoolError(SfbusError):
    """A slot pool was misused by its caller (double release, release by a non-owner)."""


class SlotPoolExhausted(SlotPoolError):
    """Every slot is taken: the caller should wait for a release, or size the pool larger."""


class ActorDeadError(SfbusError):
    """The actor was stopped or failed; calls to it can no longer succeed."""


class FrameError(SfbusError):
    """A frame from the bus could not be decoded: the peer sent bytes we do not understand."""


class RunFailed(SfbusError):
    """The run cannot go on (a process exceeded its restart limit, an actor failed to start)."""
