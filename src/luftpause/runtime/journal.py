"""The run journal (R8): ``runs.jsonl``, append-only, one JSON record per line.

Theory of operation
-------------------
Each step of a run is recorded under a stable key before the run moves on, in
the manner of durable-execution engines: a record is the *fact* that the step
happened, so replaying the journal rebuilds every run without executing
anything again.

Record types (field ``t``), each keyed by run id and, where it repeats, a
sequence number:

``spawn``     ``{run, spec, parent, created, caller}`` - the run exists (key: run).
``turn``      ``{run, seq, message, usage}`` - the model turn number ``seq`` ended
              in tool calls; ``message`` is the assistant message (tool calls in
              structured form, even when recovered from text) (key: run, seq).
``tools``     ``{run, seq, results, usage}`` - every call of turn ``seq`` has its
              result; ``results`` are the tool messages (key: run, seq). A turn
              with its ``tools`` record is a *complete tool round*.
``approval``  ``{run, key, tool, arguments, allow}`` - the user's decision on
              one call (key: run, key = "<seq>:<index>").
``budget``    ``{run, message}`` - the budget this run owns was exceeded (key: run);
              applies even to a finished run, whose subtree may still be running.
``end``       ``{run, state, result, error, usage, time}`` - the run finished (key: run).

Recovery rule: replay applies each record once per key (a repeated key is
ignored), so replaying twice, or replaying a journal that holds a record twice,
gives the same state: recovery is idempotent. A run without ``end`` resumes
after its last ``tools`` record; if its last ``turn`` has no ``tools`` record,
the turn is not asked again - its calls are executed again (the round was in
progress, so none of its results was recorded). A complete round is never
executed again. Approvals already answered are reused; open ones are asked.

Durability: every append is written, flushed and fsynced before the caller
continues (appends waiting together share one fsync), so a SIGKILL loses at most
the round in progress. A torn last line (the process died mid-write) is ignored
with a warning and cut off, so the next append starts on a clean line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("luftpause.runtime.journal")

JOURNAL_NAME = "runs.jsonl"
RECORD_TYPES = ("spawn", "turn", "tools", "approval", "budget", "end")


class JournalError(Exception):
    """The journal cannot be opened or written; the message names the file."""


def read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """All complete records of the file, and the byte length of its clean prefix.

    A last line without a newline that does not parse (torn write) is dropped
    with a warning; an unparsable line in the middle is skipped with a warning.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    records: list[dict[str, Any]] = []
    offset = 0
    clean = 0
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        last = number == len(lines)
        end = offset + len(raw) + (0 if last else 1)
        if not raw.strip():
            offset = end
            clean = end if not last else clean
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or record.get("t") not in RECORD_TYPES:
                raise ValueError("not a journal record")
        except ValueError:
            if last:
                log.warning(
                    "%s: ignoring a torn last line (%d bytes; the process stopped mid-write)",
                    path,
                    len(raw),
                )
                return records, clean
            log.warning("%s: line %d is not a journal record; skipped", path, number)
            offset = end
            clean = end
            continue
        records.append(record)
        offset = end
        clean = end
    return records, clean


class Journal:
    """Append-only, fsynced writer for ``runs.jsonl`` with group commit."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / JOURNAL_NAME
        self._state_dir = state_dir
        self._fd: int | None = None
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def open(self) -> list[dict[str, Any]]:
        """Read every complete record and open the file for appending."""
        try:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            records, clean = read_records(self.path)
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
        return records

    async def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` durably; returns once it is fsynced."""
        if self._fd is None or self._closed:
            raise JournalError(f"{self.path}: journal is not open")
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
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
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    async def close(self) -> None:
        if self._writer is not None and not self._writer.done():
            await self._writer
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def iter_keys(record: dict[str, Any]) -> Iterator[tuple[str, ...]]:
    """The stable key of a record (one item), used for idempotent replay."""
    kind = record.get("t")
    run = str(record.get("run"))
    if kind in ("spawn", "end", "budget"):
        yield (str(kind), run)
    elif kind in ("turn", "tools"):
        yield (str(kind), run, str(record.get("seq")))
    elif kind == "approval":
        yield ("approval", run, str(record.get("key")))
