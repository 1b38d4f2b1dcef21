from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcceptanceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCEPTANCE_MODE_UNSPECIFIED: _ClassVar[AcceptanceMode]
    ACCEPTANCE_MODE_GREEDY: _ClassVar[AcceptanceMode]
    ACCEPTANCE_MODE_SAMPLING: _ClassVar[AcceptanceMode]
    ACCEPTANCE_MODE_SEMANTIC: _ClassVar[AcceptanceMode]

class UploadProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPLOAD_PROTOCOL_UNSPECIFIED: _ClassVar[UploadProtocol]
    UPLOAD_PROTOCOL_TOKENS_ONLY: _ClassVar[UploadProtocol]
    UPLOAD_PROTOCOL_FULL_HIDDEN: _ClassVar[UploadProtocol]
    UPLOAD_PROTOCOL_SELECTIVE_HIDDEN: _ClassVar[UploadProtocol]

class HiddenEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HIDDEN_ENCODING_UNSPECIFIED: _ClassVar[HiddenEncoding]
    HIDDEN_ENCODING_FP16: _ClassVar[HiddenEncoding]
    HIDDEN_ENCODING_INT8: _ClassVar[HiddenEncoding]

class SloClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SLO_CLASS_UNSPECIFIED: _ClassVar[SloClass]
    SLO_CLASS_INTERACTIVE: _ClassVar[SloClass]
    SLO_CLASS_STANDARD: _ClassVar[SloClass]
    SLO_CLASS_BATCH: _ClassVar[SloClass]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT: _ClassVar[FinishReason]
ACCEPTANCE_MODE_UNSPECIFIED: AcceptanceMode
ACCEPTANCE_MODE_GREEDY: AcceptanceMode
ACCEPTANCE_MODE_SAMPLING: AcceptanceMode
ACCEPTANCE_MODE_SEMANTIC: AcceptanceMode
UPLOAD_PROTOCOL_UNSPECIFIED: UploadProtocol
UPLOAD_PROTOCOL_TOKENS_ONLY: UploadProtocol
UPLOAD_PROTOCOL_FULL_HIDDEN: UploadProtocol
UPLOAD_PROTOCOL_SELECTIVE_HIDDEN: UploadProtocol
HIDDEN_ENCODING_UNSPECIFIED: HiddenEncoding
HIDDEN_ENCODING_FP16: HiddenEncoding
HIDDEN_ENCODING_INT8: HiddenEncoding
SLO_CLASS_UNSPECIFIED: SloClass
SLO_CLASS_INTERACTIVE: SloClass
SLO_CLASS_STANDARD: SloClass
SLO_CLASS_BATCH: SloClass
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CONTEXT: FinishReason

class TokenizerFingerprint(_message.Message):
    __slots__ = ("vocab_size", "token_hash", "bos_token", "eos_token", "model_name")
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_HASH_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    vocab_size: int
    token_hash: bytes
    bos_token: int
    eos_token: int
    model_name: str
    def __init__(self, vocab_size: _Optional[int] = ..., token_hash: _Optional[bytes] = ..., bos_token: _Optional[int] = ..., eos_token: _Optional[int] = ..., model_name: _Optional[str] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("acceptance_modes", "upload_protocols", "hidden_encodings", "max_block", "max_context", "max_sessions", "assigns_budgets", "max_draft_top_k", "prefix_cache", "max_message_bytes", "exact_numerics", "invariant_batch", "slo_classes", "scheduling_policy", "semantic_head", "semantic_threshold", "sampler_features", "max_top_logprobs", "decode_step_ms", "round_streams")
    class SloClassesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ACCEPTANCE_MODES_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_PROTOCOLS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNS_BUDGETS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOP_K_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXACT_NUMERICS_FIELD_NUMBER: _ClassVar[int]
    INVARIANT_BATCH_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_POLICY_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_HEAD_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FEATURES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    ROUND_STREAMS_FIELD_NUMBER: _ClassVar[int]
    acceptance_modes: _containers.RepeatedScalarFieldContainer[AcceptanceMode]
    upload_protocols: _containers.RepeatedScalarFieldContainer[UploadProtocol]
    hidden_encodings: _containers.RepeatedScalarFieldContainer[HiddenEncoding]
    max_block: int
    max_context: int
    max_sessions: int
    assigns_budgets: bool
    max_draft_top_k: int
    prefix_cache: bool
    max_message_bytes: int
    exact_numerics: bool
    invariant_batch: int
    slo_classes: _containers.ScalarMap[str, float]
    scheduling_policy: str
    semantic_head: str
    semantic_threshold: float
    sampler_features: _containers.RepeatedScalarFieldContainer[str]
    max_top_logprobs: int
    decode_step_ms: float
    round_streams: bool
    def __init__(self, acceptance_modes: _Optional[_Iterable[_Union[AcceptanceMode, str]]] = ..., upload_protocols: _Optional[_Iterable[_Union[UploadProtocol, str]]] = ..., hidden_encodings: _Optional[_Iterable[_Union[HiddenEncoding, str]]] = ..., max_block: _Optional[int] = ..., max_context: _Optional[int] = ..., max_sessions: _Optional[int] = ..., assigns_budgets: _Optional[bool] = ..., max_draft_top_k: _Optional[int] = ..., prefix_cache: _Optional[bool] = ..., max_message_bytes: _Optional[int] = ..., exact_numerics: _Optional[bool] = ..., invariant_batch: _Optional[int] = ..., slo_classes: _Optional[_Mapping[str, float]] = ..., scheduling_policy: _Optional[str] = ..., semantic_head: _Optional[str] = ..., semantic_threshold: _Optional[float] = ..., sampler_features: _Optional[_Iterable[str]] = ..., max_top_logprobs: _Optional[int] = ..., decode_step_ms: _Optional[float] = ..., round_streams: _Optional[bool] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("protocol_version", "draft_tokenizer", "draft_model", "draft_hidden_size", "client_version")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    draft_tokenizer: TokenizerFingerprint
    draft_model: str
    draft_hidden_size: int
    client_version: str
    def __init__(self, protocol_version: _Optional[int] = ..., draft_tokenizer: _Optional[_Union[TokenizerFingerprint, _Mapping]] = ..., draft_model: _Optional[str] = ..., draft_hidden_size: _Optional[int] = ..., client_version: _Optional[str] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("protocol_version", "target_tokenizer", "target_model", "target_hidden_size", "capabilities", "server_version", "chat_template", "recommended_sampling")
    class RecommendedSamplingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    target_tokenizer: TokenizerFingerprint
    target_model: str
    target_hidden_size: int
    capabilities: Capabilities
    server_version: str
    chat_template: str
    recommended_sampling: _containers.ScalarMap[str, float]
    def __init__(self, protocol_version: _Optional[int] = ..., target_tokenizer: _Optional[_Union[TokenizerFingerprint, _Mapping]] = ..., target_model: _Optional[str] = ..., target_hidden_size: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., server_version: _Optional[str] = ..., chat_template: _Optional[str] = ..., recommended_sampling: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("payload", "reply_bytes", "client_send_time")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEND_TIME_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    reply_bytes: int
    client_send_time: float
    def __init__(self, payload: _Optional[bytes] = ..., reply_bytes: _Optional[int] = ..., client_send_time: _Optional[float] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("payload", "client_send_time", "server_time")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEND_TIME_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    client_send_time: float
    server_time: float
    def __init__(self, payload: _Optional[bytes] = ..., client_send_time: _Optional[float] = ..., server_time: _Optional[float] = ...) -> None: ...

class LinkState(_message.Message):
    __slots__ = ("rtt_ms", "rtt_jitter_ms", "uplink_mbps", "downlink_mbps", "loss_rate", "samples")
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    RTT_JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    UPLINK_MBPS_FIELD_NUMBER: _ClassVar[int]
    DOWNLINK_MBPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_RATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    rtt_ms: float
    rtt_jitter_ms: float
    uplink_mbps: float
    downlink_mbps: float
    loss_rate: float
    samples: int
    def __init__(self, rtt_ms: _Optional[float] = ..., rtt_jitter_ms: _Optional[float] = ..., uplink_mbps: _Optional[float] = ..., downlink_mbps: _Optional[float] = ..., loss_rate: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("mode", "temperature", "seed", "semantic_threshold", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "penalty_last_n", "logit_bias", "logprobs", "top_logprobs")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PENALTY_LAST_N_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    mode: AcceptanceMode
    temperature: float
    seed: int
    semantic_threshold: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    penalty_last_n: int
    logit_bias: _containers.ScalarMap[int, float]
    logprobs: bool
    top_logprobs: int
    def __init__(self, mode: _Optional[_Union[AcceptanceMode, str]] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., semantic_threshold: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., penalty_last_n: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("prompt_tokens", "sampling", "slo_class", "draft_tokenizer", "client_id", "draft_hidden_size", "slo_name", "target_tokens_per_s", "history")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    SLO_NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    slo_class: SloClass
    draft_tokenizer: TokenizerFingerprint
    client_id: str
    draft_hidden_size: int
    slo_name: str
    target_tokens_per_s: float
    history: _containers.RepeatedCompositeFieldContainer[ContextSpan]
    def __init__(self, prompt_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., slo_class: _Optional[_Union[SloClass, str]] = ..., draft_tokenizer: _Optional[_Union[TokenizerFingerprint, _Mapping]] = ..., client_id: _Optional[str] = ..., draft_hidden_size: _Optional[int] = ..., slo_name: _Optional[str] = ..., target_tokens_per_s: _Optional[float] = ..., history: _Optional[_Iterable[_Union[ContextSpan, _Mapping]]] = ...) -> None: ...

class ContextSpan(_message.Message):
    __slots__ = ("length", "generated")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    length: int
    generated: bool
    def __init__(self, length: _Optional[int] = ..., generated: _Optional[bool] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "committed_length", "max_context", "next_budget", "prefill_ms", "reused_tokens", "target_tokens_per_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    NEXT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    committed_length: int
    max_context: int
    next_budget: int
    prefill_ms: float
    reused_tokens: int
    target_tokens_per_s: float
    def __init__(self, session_id: _Optional[str] = ..., committed_length: _Optional[int] = ..., max_context: _Optional[int] = ..., next_budget: _Optional[int] = ..., prefill_ms: _Optional[float] = ..., reused_tokens: _Optional[int] = ..., target_tokens_per_s: _Optional[float] = ...) -> None: ...

class ExtendSessionRequest(_message.Message):
    __slots__ = ("session_id", "base_position", "tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    base_position: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., base_position: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class ExtendSessionResponse(_message.Message):
    __slots__ = ("committed_length", "prefill_ms")
    COMMITTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    committed_length: int
    prefill_ms: float
    def __init__(self, committed_length: _Optional[int] = ..., prefill_ms: _Optional[float] = ...) -> None: ...

class DraftDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class HiddenStates(_message.Message):
    __slots__ = ("encoding", "count", "dim", "data", "scales", "positions")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    encoding: HiddenEncoding
    count: int
    dim: int
    data: bytes
    scales: _containers.RepeatedScalarFieldContainer[float]
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, encoding: _Optional[_Union[HiddenEncoding, str]] = ..., count: _Optional[int] = ..., dim: _Optional[int] = ..., data: _Optional[bytes] = ..., scales: _Optional[_Iterable[float]] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "base_position", "draft_tokens", "draft_distributions", "upload_protocol", "hidden", "link", "slo_class", "round_index", "continue_after_eog", "draft_ms", "network_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    SLO_CLASS_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_AFTER_EOG_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    base_position: int
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_distributions: _containers.RepeatedCompositeFieldContainer[DraftDistribution]
    upload_protocol: UploadProtocol
    hidden: HiddenStates
    link: LinkState
    slo_class: SloClass
    round_index: int
    continue_after_eog: bool
    draft_ms: float
    network_ms: float
    def __init__(self, session_id: _Optional[str] = ..., base_position: _Optional[int] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., draft_distributions: _Optional[_Iterable[_Union[DraftDistribution, _Mapping]]] = ..., upload_protocol: _Optional[_Union[UploadProtocol, str]] = ..., hidden: _Optional[_Union[HiddenStates, _Mapping]] = ..., link: _Optional[_Union[LinkState, _Mapping]] = ..., slo_class: _Optional[_Union[SloClass, str]] = ..., round_index: _Optional[int] = ..., continue_after_eog: _Optional[bool] = ..., draft_ms: _Optional[float] = ..., network_ms: _Optional[float] = ...) -> None: ...

class ServerTimings(_message.Message):
    __slots__ = ("queue_ms", "verify_ms", "batch_size", "has_deadline", "budget_ms", "deadline_met", "estimated_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    HAS_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MET_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    verify_ms: float
    batch_size: int
    has_deadline: bool
    budget_ms: float
    deadline_met: bool
    estimated_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., verify_ms: _Optional[float] = ..., batch_size: _Optional[int] = ..., has_deadline: _Optional[bool] = ..., budget_ms: _Optional[float] = ..., deadline_met: _Optional[bool] = ..., estimated_ms: _Optional[float] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("accepted", "next_token", "bonus", "committed_length", "next_budget", "context_full", "ended", "hidden_rows", "semantic_accepted", "semantic_threshold", "semantic_head", "logprobs")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BONUS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NEXT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FULL_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_ROWS_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_HEAD_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    next_token: int
    bonus: bool
    committed_length: int
    next_budget: int
    context_full: bool
    ended: bool
    hidden_rows: int
    semantic_accepted: int
    semantic_threshold: float
    semantic_head: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    def __init__(self, accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., bonus: _Optional[bool] = ..., committed_length: _Optional[int] = ..., next_budget: _Optional[int] = ..., context_full: _Optional[bool] = ..., ended: _Optional[bool] = ..., hidden_rows: _Optional[int] = ..., semantic_accepted: _Optional[int] = ..., semantic_threshold: _Optional[float] = ..., semantic_head: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ...) -> None: ...

class HiddenRequest(_message.Message):
    __slots__ = ("positions", "encoding")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    encoding: HiddenEncoding
    def __init__(self, positions: _Optional[_Iterable[int]] = ..., encoding: _Optional[_Union[HiddenEncoding, str]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("verdict", "hidden_request", "timings")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    hidden_request: HiddenRequest
    timings: ServerTimings
    def __init__(self, verdict: _Optional[_Union[Verdict, _Mapping]] = ..., hidden_request: _Optional[_Union[HiddenRequest, _Mapping]] = ..., timings: _Optional[_Union[ServerTimings, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt_tokens", "sampling", "max_tokens", "stop_tokens", "slo_name", "target_tokens_per_s")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SLO_NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    max_tokens: int
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    slo_name: str
    target_tokens_per_s: float
    def __init__(self, prompt_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., slo_name: _Optional[str] = ..., target_tokens_per_s: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token", "index", "decode_ms", "finish_reason", "prefill_ms", "logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: int
    index: int
    decode_ms: float
    finish_reason: FinishReason
    prefill_ms: float
    logprobs: TokenLogprobs
    def __init__(self, token: _Optional[int] = ..., index: _Optional[int] = ..., decode_ms: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., prefill_ms: _Optional[float] = ..., logprobs: _Optional[_Union[TokenLogprobs, _Mapping]] = ...) -> None: ...
