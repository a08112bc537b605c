"""Who wrote a line: the engine, a user, the access log or a request's handler. Standard library only.

vLLM echoes requests and responses into its log (`--enable-log-requests`, `--enable-log-outputs`),
and those lines carry user text. They are tagged USER and never decide a diagnosis nor appear in its
evidence; uvicorn access lines are tagged ACCESS; the API server's request handlers' lines, REQUEST.
vLLM's formatter repeats the logger header on every line of a multi-line message, and the request
logger writes prompts with %r (one line), so the header and the message's opening words identify
them. (scan.py tags each line, and carries a user-text message's origin over its further lines.)
"""

from __future__ import annotations

import re

from .needles import any_of

# What patterns see of a line: every decisive vLLM line is shorter. (scan.py's bound on per-line work,
# kept here, where origin_of reads that much of a line, so that scan.py can import this module.)
MATCH_CHARS = 2048

ENGINE, USER, ACCESS, REQUEST = "engine", "user", "access", "request"
FORGED = "<second header>"  # the file scan.py names for a line with a second header: user text (_USER_FILES)

# The request logger's and response logger's opening words (vLLM 0.2 to 0.33), and the
# parsers that log model output; a header naming entrypoints/logger.py is user text too.
_USER_START = re.compile(
    r"(?:Received request |Generated response |Request \S+ details:|Added request \S+:? .{0,40}prompt)"
)
# Searched anywhere in a line of up to MATCH_CHARS: every alternative starts with a letter, so
# the regex engine skips ahead to those letters instead of trying each position. `p(?<!\w.)`
# is `\bp`: the character before the `p` is no word character.
_WB = r"(?<!\w.)"
_USER_QUOTE = re.compile(
    rf"p{_WB}rompt(?:_token_ids: \[|: ['\"])|o{_WB}utputs?: ['\"]|d{_WB}elta_text: ['\"]|"
    rf"c{_WB}urrent_text: ['\"]|m{_WB}odel_output: ['\"]"
)


def _quotes_a_user(head: str) -> bool:
    """_USER_QUOTE is in the line. (Every match holds one of these words: str `in` rules most lines out
    before the search, ~3 us a long line.)"""
    worded = "rompt" in head or "utput" in head or "elta_text: " in head or "urrent_text: " in head
    return worded and _USER_QUOTE.search(head) is not None


_USER_FILES = re.compile(
    r"^(?:(?:request_)?logger\.py|dump_input\.py|log_response\.py|.*tool_parser.*|.*reasoning.*parser.*|.*_parser\.py|"
    r"<second header>)$"
)
# Lines that name a request by its id or dump a scheduled batch carry text a client chose (the
# X-Request-Id header, stop strings), wherever they come from.
_REQUEST_START = re.compile(
    # AsyncLLM's "Request <id> aborted/failed ..."
    r"(?:Added|Aborted|Finished|Abort) request|Request \S+(?: |$)|Aborted request\(s\)"
)
# The prefixes vLLM 0.32 puts before _base_request_id (pooling's request_id_prefix, speech's task_type).
_API_ID_PREFIXES = (
    "chatcmpl-",
    "cmpl-",
    "embd-",
    "classify-",
    "tokenize-",
    "decision-",
    "generative-scoring-",
    "generate-tokens-",
    "pooling-",
    "score-",
    "transcribe-",
    "translate-",
)
_REQUEST_IDS = re.compile(  # (each alternative starts with a letter: see _USER_QUOTE)
    rf"S{_WB}chedulerOutput\(|N{_WB}ewRequestData\(|C{_WB}achedRequestData\(|"
    # `request_id=`, and a dict's repr or a JSON object naming one (`'request_id': `, `"request_id":`):
    # the NIXL connector's failure report puts the request's KV transfer parameters (remote_engine_id,
    # remote_host: the client's kv_transfer_params) in such a context, even where the id is None
    rf"r{_WB}eq(?:uest)?_ids?['\"]?[=:]|"
    # LMCache's "Reqid: <id>" (a Responses request_id is the client's whole id, with no prefix)
    rf"R{_WB}eq_?[Ii][Dd]s?\b|r{_WB}eq_?[Ii][Dd]s?\b|"
    # the camel-case form (KServe's trace logger: "requestId: <the x-request-id header>, preprocess_ms: ...")
    rf"R{_WB}equest[Ii][Dd]s?\b|r{_WB}equest[Ii][Dd]s?\b|"
    # --log-error-stack's "Exception caught. Request id: <id>"
    r"Request [Ii][Dd]s?\b|request [Ii][Dd]s?\b|"
    # any other line naming "request" (an id follows it in every vLLM 0.32 form: the engine's
    # "... for request <id>" of structured output and KV connectors), but the engine's own memory
    # figures that speak of one request ("KV cache for one max_model_len request": 0.34's RDNA W4A16
    # cache), and vLLM 0.34's advice on host pages ("Reserve the pages on the host and request them for the
    # container": v1/simple_kv_offload/host_buffer.py)
    rf"R{_WB}equest\b(?<!at least one request)(?<!tokens per request)|"
    rf"r{_WB}equest\b(?<!at least one request)(?<!tokens per request)(?<!on the host and request)"
    r"(?<!one max_model_len request)|"
    # the ids the API server makes, each holding the client's X-Request-Id or body request_id
    # ("cmpl-<id>-0-1a2b"), as KV connectors log them without the word "request"
    + "|".join(p[0] + _WB + re.escape(p[1:]) for p in _API_ID_PREFIXES)
)
# (every request-id form holds one of these hints: a cheap test before the regex on long lines; the
# word "request" only where no word character follows it, so that the engine's "Requested memory" costs
# no search of _REQUEST_IDS, ~9 us a line)
_ID_HINTS = ["SchedulerOutput", "ewRequestData", "achedRequestData", "eq_", "eqI", "eqi", "equest_", "equestI"]
_HOLDS_ID_HINT_WORD = any_of([*_ID_HINTS, "equesti", *(p[1:] for p in _API_ID_PREFIXES)])
_REQUEST_WORD = re.compile(r"equest(?!\w)")


def _holds_id_hint(text: str) -> bool:
    return _HOLDS_ID_HINT_WORD(text) or _REQUEST_WORD.search(text) is not None


# The API server handles requests one by one: its errors (a 400 for a long prompt, a bad chat
# template) are the request's, carry the request's text, and never decide a crash's cause.
_REQUEST_FILES = re.compile(
    # (connection.py: the realtime endpoint's websocket, one per client; vLLM 0.33/0.34's renderers, which
    # render a request's chat messages through its template and log what failed with the exception's message,
    # the client's: renderers/inkling.py, renderers/mistral.py, renderers/chat_utils/item_tracker.py and
    # chat_message.py, and the Mistral parser of the model's tool calls, parser/mistral.py; no other
    # vLLM file of those names logs an error)
    r"^(?:serving_\w{1,40}|serving|api_server|api_router|protocol|chat_utils|connection|"
    r"inkling|mistral|item_tracker|chat_message|openai_serving_\w{1,40})\.py$"
)
# huggingface_hub ends its HTTP errors with the Hub's own id of the failed call ("401 Client Error.
# (Request ID: Root=1-...)"): the Hub's, not a client's, so it does not make the line a request's.
_HUB_REQUEST_ID = re.compile(r" ?\(Request ID: [\w;=.:/+-]{1,200}\)")
# Ray Serve's text formatter (ServeFormatter, ray/serve/_private/logging_utils.py): `%(levelname)s
# %(asctime)s {component} {component_id} ` and, inside a request's context, `%(request_id)s ` before
# `%(filename)s:%(lineno)d - %(message)s`. The request id is the client's X-Request-Id header, spaces and
# all (it may itself open with `x.py:1 - `, as a line out of any request does); the replica's print() in
# a request is logged the same way. The engine prints its own failures in vLLM's format, so a Serve line
# is the replica's or the proxy's report, scoped like an API handler's (REQUEST): it names no failure of
# the engine's, and it is no sign that the engine served (Serve's proxy answers requests, 503 or queued,
# while the engine is still starting). (A logging format of one's own for vLLM may open the same way,
# `%(levelname)s %(asctime)s %(name)s %(filename)s:%(lineno)d - `: a vLLM logger's name, or a file:line,
# in the component's place is no Serve component.)
_FILE_LINE = r"[\w.-]{1,80}\.py:\d{1,7}"
_SERVE_LINE = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
    rf"(?!vllm\.)(?!{_FILE_LINE}\b)\S{{1,200}} (?!{_FILE_LINE}\b)\S{{1,200}} "
)
# The method is whatever the client sent: uvicorn logs any method its HTTP parser takes (llhttp's TRACE,
# PROPFIND, M-SEARCH, ...; h11's any token), and its WebSocket handshake as `"WebSocket <path>"`, the
# client's address then a host:port or a tuple's repr.
_METHOD = r"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,24} |WebSocket )"
_ACCESS = re.compile(rf'^(?:\[?[\w.:\[\]-]{{1,60}}:\d{{1,5}}\]? |\(\'[\w.:-]{{1,60}}\', \d{{1,5}}\) )?- "{_METHOD}')
# Any access log's own field: the request line, quoted (uvicorn's AccessFormatter `"%(request_line)s"`,
# gunicorn's `"%(r)s"`, the common log format's), wherever the log's format puts it (KServe's
# `<time> uvicorn.access INFO:     <client> <pid> - "GET /path?query HTTP/1.1" 200 OK`, a
# logging config of one's own). Its target is the client's, and no line of the engine's holds one. The
# target is not read: uvicorn logs the query as sent, and its parsers take `"` (h11, llhttp) and a tab
# (llhttp's loose mode) there, up to 16 KiB (h11); so the line opens `"METHOD ` and closes ` HTTP/1.1"`
# wherever that comes (two scans, no backtracking over the target).
_REQUEST_OPEN = re.compile(rf'"{_METHOD}')
_REQUEST_CLOSE = re.compile(r' HTTP/\d(?:\.\d)?"')


# A JSON object is a structured log record that log_records.py did not decode (longer than it reads, cut by the
# launcher's piece, or of a schema it does not read): its fields are whoever's (a client's query or
# tool-call id may fill it), and nothing tells its level or logger, so it never decides. (vLLM's text formatter
# opens no line so: its dicts print with Python's repr, `{'`.)
_RECORD_OPENING = '{"'
# ... and a member of one on a line of its own (a formatter's indented JSON: python-json-logger's json_indent)
_RECORD_MEMBER = re.compile(r'\s{0,40}"[^"\\]{1,200}"\s?:\s')


def _holds_request_line(head: str, text: str) -> bool:
    opening = _REQUEST_OPEN.search(head)
    if opening is None:
        return False
    return '"WebSocket ' in head or _REQUEST_CLOSE.search(text, opening.end()) is not None


def a_requests_file(source_file: str | None) -> bool:
    """The logger header names a file that reports requests (the API server's handlers, the request
    logger): whatever one of its lines says, the report is a request's."""
    name = source_file.rsplit("/", 1)[-1] if source_file else ""
    return bool(name) and (_REQUEST_FILES.match(name) is not None or _USER_FILES.match(name) is not None)


def origin_of(text: str, source_file: str | None) -> str:
    """Who wrote a (normalized) line: the engine, a user (request/response echo), or the access log."""
    name = source_file.rsplit("/", 1)[-1] if source_file else ""
    if name and _USER_FILES.match(name):
        return USER
    head = text[:MATCH_CHARS]
    if head.startswith(_RECORD_OPENING) or (head[:1] in ' "\t' and _RECORD_MEMBER.match(head)):
        return USER
    # (every request-id form holds one of the id hints: a cheap test first on long lines)
    if _USER_START.match(head) or _quotes_a_user(head) or _REQUEST_START.match(head):
        return USER
    if _SERVE_LINE.match(head):
        return REQUEST
    named = _HUB_REQUEST_ID.sub("", head) if "(Request ID: " in head else head  # (only the Hub's id is let go)
    if _holds_id_hint(named) and _REQUEST_IDS.search(named):
        return USER
    if _ACCESS.match(head) or ('"' in head and _holds_request_line(head, text)):
        return ACCESS
    if name and _REQUEST_FILES.match(name):
        return REQUEST
    return ENGINE
