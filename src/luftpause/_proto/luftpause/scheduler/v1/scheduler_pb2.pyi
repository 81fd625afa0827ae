from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_CLASS_UNSPECIFIED: _ClassVar[ServiceClass]
    SERVICE_CLASS_BATCH: _ClassVar[ServiceClass]
    SERVICE_CLASS_INTERACTIVE: _ClassVar[ServiceClass]

class EndpointKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENDPOINT_KIND_UNSPECIFIED: _ClassVar[EndpointKind]
    ENDPOINT_KIND_GENERATIVE: _ClassVar[EndpointKind]
    ENDPOINT_KIND_SINGLE_PASS: _ClassVar[EndpointKind]

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_IDLE: _ClassVar[RunPhase]
    RUN_PHASE_GENERATING: _ClassVar[RunPhase]
    RUN_PHASE_PAUSED_ON_TOOL: _ClassVar[RunPhase]

class RejectCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_CODE_UNSPECIFIED: _ClassVar[RejectCode]
    REJECT_CODE_UNKNOWN_MODEL: _ClassVar[RejectCode]
    REJECT_CODE_INVALID_REQUEST: _ClassVar[RejectCode]
    REJECT_CODE_OVER_QUOTA: _ClassVar[RejectCode]
SERVICE_CLASS_UNSPECIFIED: ServiceClass
SERVICE_CLASS_BATCH: ServiceClass
SERVICE_CLASS_INTERACTIVE: ServiceClass
ENDPOINT_KIND_UNSPECIFIED: EndpointKind
ENDPOINT_KIND_GENERATIVE: EndpointKind
ENDPOINT_KIND_SINGLE_PASS: EndpointKind
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_IDLE: RunPhase
RUN_PHASE_GENERATING: RunPhase
RUN_PHASE_PAUSED_ON_TOOL: RunPhase
REJECT_CODE_UNSPECIFIED: RejectCode
REJECT_CODE_UNKNOWN_MODEL: RejectCode
REJECT_CODE_INVALID_REQUEST: RejectCode
REJECT_CODE_OVER_QUOTA: RejectCode

class AdmitRequest(_message.Message):
    __slots__ = ("turn_id", "run_id", "model", "service_class", "caller", "kind", "dataplane_id", "traceparent", "echoed_tool_call_ids")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    ECHOED_TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    kind: EndpointKind
    dataplane_id: str
    traceparent: str
    echoed_tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., kind: _Optional[_Union[EndpointKind, str]] = ..., dataplane_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., echoed_tool_call_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("admitted", "rejected")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    admitted: Admitted
    rejected: Rejected
    def __init__(self, admitted: _Optional[_Union[Admitted, _Mapping]] = ..., rejected: _Optional[_Union[Rejected, _Mapping]] = ...) -> None: ...

class Admitted(_message.Message):
    __slots__ = ("replica", "url", "held_s", "run_id", "retain_s")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    HELD_S_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RETAIN_S_FIELD_NUMBER: _ClassVar[int]
    replica: str
    url: str
    held_s: float
    run_id: str
    retain_s: float
    def __init__(self, replica: _Optional[str] = ..., url: _Optional[str] = ..., held_s: _Optional[float] = ..., run_id: _Optional[str] = ..., retain_s: _Optional[float] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("code", "message", "retry_after_s", "limit")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    code: RejectCode
    message: str
    retry_after_s: float
    limit: str
    def __init__(self, code: _Optional[_Union[RejectCode, str]] = ..., message: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., limit: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class TurnStarted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TurnFinished(_message.Message):
    __slots__ = ("usage", "finish_reason", "paused_on_tool", "tool_call_ids", "tool_names")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PAUSED_ON_TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    usage: Usage
    finish_reason: str
    paused_on_tool: bool
    tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, usage: _Optional[_Union[Usage, _Mapping]] = ..., finish_reason: _Optional[str] = ..., paused_on_tool: _Optional[bool] = ..., tool_call_ids: _Optional[_Iterable[str]] = ..., tool_names: _Optional[_Iterable[str]] = ...) -> None: ...

class TurnFailed(_message.Message):
    __slots__ = ("reason", "replica_unreachable")
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    replica_unreachable: bool
    def __init__(self, reason: _Optional[str] = ..., replica_unreachable: _Optional[bool] = ...) -> None: ...

class TurnEvent(_message.Message):
    __slots__ = ("turn_id", "run_id", "started", "first_token", "finished", "failed", "dataplane_id")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    started: TurnStarted
    first_token: FirstToken
    finished: TurnFinished
    failed: TurnFailed
    dataplane_id: str
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., started: _Optional[_Union[TurnStarted, _Mapping]] = ..., first_token: _Optional[_Union[FirstToken, _Mapping]] = ..., finished: _Optional[_Union[TurnFinished, _Mapping]] = ..., failed: _Optional[_Union[TurnFailed, _Mapping]] = ..., dataplane_id: _Optional[str] = ...) -> None: ...

class ReportBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TurnEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[TurnEvent, _Mapping]]] = ...) -> None: ...

class ReportSummary(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class RunEndedRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RunEndedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunSnapshot(_message.Message):
    __slots__ = ("run_id", "last_replica", "phase", "service_class", "caller")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REPLICA_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    last_replica: str
    phase: RunPhase
    service_class: ServiceClass
    caller: str
    def __init__(self, run_id: _Optional[str] = ..., last_replica: _Optional[str] = ..., phase: _Optional[_Union[RunPhase, str]] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ...) -> None: ...

class TurnSnapshot(_message.Message):
    __slots__ = ("turn_id", "run_id", "replica", "model", "service_class", "caller", "started")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    started: bool
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., replica: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., started: _Optional[bool] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ("dataplane_id", "runs", "in_flight")
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    dataplane_id: str
    runs: _containers.RepeatedCompositeFieldContainer[RunSnapshot]
    in_flight: _containers.RepeatedCompositeFieldContainer[TurnSnapshot]
    def __init__(self, dataplane_id: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[RunSnapshot, _Mapping]]] = ..., in_flight: _Optional[_Iterable[_Union[TurnSnapshot, _Mapping]]] = ...) -> None: ...

class ResyncResponse(_message.Message):
    __slots__ = ("runs", "turns", "link_port")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    LINK_PORT_FIELD_NUMBER: _ClassVar[int]
    runs: int
    turns: int
    link_port: int
    def __init__(self, runs: _Optional[int] = ..., turns: _Optional[int] = ..., link_port: _Optional[int] = ...) -> None: ...

class LinkHello(_message.Message):
    __slots__ = ("dataplane_id", "authorization")
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    dataplane_id: str
    authorization: str
    def __init__(self, dataplane_id: _Optional[str] = ..., authorization: _Optional[str] = ...) -> None: ...

class LinkWelcome(_message.Message):
    __slots__ = ("refused", "message")
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    refused: bool
    message: str
    def __init__(self, refused: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class LinkUp(_message.Message):
    __slots__ = ("events", "abandoned", "admit")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TurnEvent]
    abandoned: _containers.RepeatedScalarFieldContainer[str]
    admit: _containers.RepeatedCompositeFieldContainer[AdmitRequest]
    def __init__(self, events: _Optional[_Iterable[_Union[TurnEvent, _Mapping]]] = ..., abandoned: _Optional[_Iterable[str]] = ..., admit: _Optional[_Iterable[_Union[AdmitRequest, _Mapping]]] = ...) -> None: ...

class AdmitAnswer(_message.Message):
    __slots__ = ("turn_id", "response")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    response: AdmitResponse
    def __init__(self, turn_id: _Optional[str] = ..., response: _Optional[_Union[AdmitResponse, _Mapping]] = ...) -> None: ...

class LinkDown(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[AdmitAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[AdmitAnswer, _Mapping]]] = ...) -> None: ...
