"""The runtime's pure core: journal records, run state as data, and ``apply``.

Nothing here does I/O, reads a clock, or knows about asyncio, MCP or HTTP (an
import contract in ``pyproject.toml`` checks it). The live runtime
(``runtime/loop.py``) and recovery (``replay``) change runs only through
:func:`apply`, so the state after a restart is the state before it by
construction.
"""

from luftpause.runtime.core.apply import Problem, ReplayReport, apply, fail_run, replay
from luftpause.runtime.core.records import (
    RECORD_VERSION,
    Approval,
    AssistantMessage,
    Budget,
    End,
    FunctionCall,
    Record,
    RecordError,
    Spawn,
    ToolCall,
    ToolMessage,
    Tools,
    Turn,
    encode,
    parse,
)
from luftpause.runtime.core.state import (
    TERMINAL,
    PendingApproval,
    Run,
    RunSpec,
    RunState,
    RuntimeState,
    Usage,
)

__all__ = [
    "RECORD_VERSION",
    "TERMINAL",
    "Approval",
    "AssistantMessage",
    "Budget",
    "End",
    "FunctionCall",
    "PendingApproval",
    "Problem",
    "Record",
    "RecordError",
    "ReplayReport",
    "Run",
    "RunSpec",
    "RunState",
    "RuntimeState",
    "Spawn",
    "ToolCall",
    "ToolMessage",
    "Tools",
    "Turn",
    "Usage",
    "apply",
    "encode",
    "fail_run",
    "parse",
    "replay",
]
