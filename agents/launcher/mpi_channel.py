"""Point-to-point messages between the ranks of an mpi4py pilot, without ever blocking.

A :class:`Channel` posts a message (``Isend``, completed later by ``progress``) and polls for
one (``Iprobe``, then a ``Recv`` of what has already arrived). Neither waits for the other
side, so a rank that died or stopped reading cannot hang the one talking to it: it only falls
silent, which the liveness checks of both sides notice. MPI guarantees that messages from one
rank to another on one tag arrive in the order they were sent.

Only :class:`MpiChannel` touches MPI; ``tests`` drive the ranks' logic through an in-memory
channel with the same interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lodestream.agents.launcher.mpi_protocol import TAG, Message, encode

if TYPE_CHECKING:
    from mpi4py import MPI


class Channel(Protocol):
    def post(self, rank: int, message: Message) -> None:
        """Send ``message`` to ``rank`` without waiting for it to be received."""

    def poll(self) -> tuple[int, bytes] | None:
        """One message that has arrived, as (source rank, bytes), or None at once."""

    def progress(self) -> int:
        """Complete the sends that can be; the number still in flight."""


class MpiChannel:
    """A :class:`Channel` on an MPI communicator; one thread of the process uses it."""

    def __init__(self, comm: MPI.Comm) -> None:
        from mpi4py import MPI  # noqa: PLC0415 - importing it initialises MPI: ranks only

        self._mpi = MPI
        self._comm = comm
        self._status = MPI.Status()
        self._sending: list[tuple[MPI.Request, bytes]] = []  # a send's buffer lives until done

    def post(self, rank: int, message: Message) -> None:
        data = encode(message)
        request = self._comm.Isend([data, self._mpi.BYTE], dest=rank, tag=TAG)
        self._sending.append((request, data))

    def poll(self) -> tuple[int, bytes] | None:
        if not self._comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=TAG, status=self._status):
            return None
        source = self._status.Get_source()
        buffer = bytearray(self._status.Get_count(self._mpi.BYTE))
        self._comm.Recv([buffer, self._mpi.BYTE], source=source, tag=TAG)
        return source, bytes(buffer)

    def progress(self) -> int:
        if self._sending:
            self._sending = [(r, d) for r, d in self._sending if not r.Test()]
        return len(self._sending)
