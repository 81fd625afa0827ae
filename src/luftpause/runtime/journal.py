"""The run journal's file (R8): ``runs.jsonl``, append-only, one record per line.

This module does file I/O only: it reads the lines back (with their numbers)
and appends encoded records durably. What a record is, and what it means, lives
in the pure core (``runtime/core/records.py`` and ``runtime/core/apply.py``).

Durability: every append is written, flushed and fsynced before the caller
continues (appends waiting together share one fsync), so a SIGKILL loses at most
the round in progress. A torn last line (the process died mid-write: no
newline at the end) is dropped with a warning and cut off, so the next append
starts on a clean line. Any other line is handed to replay as it is; replay
fails the run an unreadable line belongs to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("luftpause.runtime.journal")

JOURNAL_NAME = "runs.jsonl"


class JournalError(Exception):
    """The journal cannot be opened or written; the message names the file."""


def read_lines(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """Every complete non-blank line with its 1-based number, and the byte length of
    the file's clean prefix (everything but a torn last line).

    The last line counts as torn when it has no newline and is not a whole JSON
    value: the process stopped in the middle of writing it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    lines: list[tuple[int, bytes]] = []
    pieces = data.split(b"\n")
    offset = 0
    for number, raw in enumerate(pieces, start=1):
        last = number == len(pieces)
        if last and raw.strip():
            try:
                json.loads(raw)
            except ValueError:
                log.warning(
                    "%s: ignoring a torn last line %d (%d bytes; the process stopped mid-write)",
                    path,
                    number,
                    len(raw),
                )
                return lines, offset
        if raw.strip():
            lines.append((number, raw))
        offset += len(raw) + (0 if last else 1)
    return lines, offset


class Journal:
    """Append-only, fsynced writer for ``runs.jsonl`` with group commit."""

    def __init__(
        self,
        state_dir: Path,
        name: str = JOURNAL_NAME,
        *,
        on_sync: Callable[[float], None] | None = None,
    ) -> None:
        self.path = state_dir / name
        self.on_sync = on_sync  # called with each write+fsync's duration in seconds
        self._state_dir = state_dir
        self._fd: int | None = None
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def open(self) -> list[tuple[int, bytes]]:
        """Read every complete line (numbered) and open the file for appending."""
        try:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            lines, clean = read_lines(self.path)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot open the journal: {exc.strerror}") from None
        size = os.fstat(fd).st_size
        if size > clean:
            # Cut the torn tail so the next record starts on its own line.
            os.ftruncate(fd, clean)
            os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_END)
        if clean > 0:
            os.lseek(fd, clean - 1, os.SEEK_SET)
            last = os.read(fd, 1)
            os.lseek(fd, 0, os.SEEK_END)
            if last != b"\n":
                os.write(fd, b"\n")
        self._fd = fd
        return lines

    async def append(self, line: bytes) -> None:
        """Write one encoded record (ending in a newline) durably; returns once fsynced."""
        if self._fd is None or self._closed:
            raise JournalError(f"{self.path}: journal is not open")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((line, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop(), name="journal-writer")
        await asyncio.shield(future)

    async def _write_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(line for line, _ in batch)
            try:
                await asyncio.to_thread(self._write_sync, data)
            except OSError as exc:
                error = JournalError(f"{self.path}: cannot write the journal: {exc.strerror}")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    def _write_sync(self, data: bytes) -> None:
        assert self._fd is not None
        started = time.perf_counter()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        if self.on_sync is not None:
            self.on_sync(time.perf_counter() - started)

    async def close(self) -> None:
        if self._writer is not None and not self._writer.done():
            await self._writer
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
