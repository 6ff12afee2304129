"""Tally's Python SDK: write an aggregation plugin as a few functions, build
it with `tally plugin build <dir>` into a component that imports nothing but
`tally:plugin` (state, output, log). A period plugin (`tally:plugin@0.2.0`,
`[tool.tally] world = "periods-plugin"`) is a class: see `tally.periods`.

    from tally import aggregate, Reject

    def apply(total, event):
        if not isinstance(event.get("n"), int) or event["n"] < 0:
            raise Reject("n must be a non-negative integer")
        return total + event["n"]

    Aggregator = aggregate(output="totals", key=lambda event: event["customer"],
                           initial=lambda: 0, apply=apply, emit=lambda total: total)

The semantics are the Rust SDK's (`sdk/rust/src/aggregate.rs`), so a plugin
ported between them computes the same bytes: one state read and one write
per batch, keys and states stored as JSON, an emitted record keyed by its
state key, rejections in event order. See docs/sdk-python.md.
"""

import json
import math
import re
import sys
from pathlib import Path

_IN_COMPONENT = sys.platform == "wasi"
if not _IN_COMPONENT:
    # Natively (under pytest) there is no component: the bindings checked in
    # beside the SDK stand in, and tally.testing provides their host calls.
    sys.path.append(str(Path(__file__).resolve().parent.parent / "bindings"))
from wit_world.imports import log as _host_log
from wit_world.imports.types import Level

try:
    from wit_world.imports import output as _output, state as _state
    from wit_world.imports.types import OutputRecord, Rejection
except ImportError:
    # A period plugin's component (tally:plugin@0.2.0) imports only `log`:
    # it has no state or outputs of its own, and `aggregate` and `raw`,
    # which need them, are not for it.
    _output = _state = OutputRecord = Rejection = None


class LogStream:
    """A text stream whose lines go to the host's log at `level` (inside a
    component, `sys.stdout` at info and `sys.stderr` at warn: the build
    stubs WASI out, so there is no other stdout)."""

    def __init__(self, level: Level):
        self.level = level
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            _host_log.log(self.level, line)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            _host_log.log(self.level, self.pending)
            self.pending = ""


if _IN_COMPONENT:
    sys.stdout = LogStream(Level.INFO)
    sys.stderr = LogStream(Level.WARN)

__all__ = [
    "Reject", "log", "aggregate", "raw", "state", "output",
    "decode_json", "encode_json", "JsonNumber", "duplicates", "MAX_DEPTH", "too_deep",
]

state = _state
"""The host's keyed state (`get`, `get_many`, `put`, `put_many`, `delete`,
`delete_many`; keys and values are bytes), for the raw interface."""
output = _output
"""The host's outputs (`emit`, `emit_many` of `OutputRecord`s), for the raw interface."""


class Reject(Exception):
    """Why an event is refused: raise it from `decode`, `key` or `apply`. Its
    message reaches the dead-letter output as is. Any other exception is a
    bug: the plugin traps, and the host dead-letters the event alone."""

    @property
    def reason(self) -> str:
        return str(self)


class log:
    """Writes one line to the host's log (the host rate-limits and labels it)."""

    @staticmethod
    def trace(message) -> None:
        _host_log.log(Level.TRACE, str(message))

    @staticmethod
    def debug(message) -> None:
        _host_log.log(Level.DEBUG, str(message))

    @staticmethod
    def info(message) -> None:
        _host_log.log(Level.INFO, str(message))

    @staticmethod
    def warn(message) -> None:
        _host_log.log(Level.WARN, str(message))

    @staticmethod
    def error(message) -> None:
        _host_log.log(Level.ERROR, str(message))


def raw(process):
    """The raw batch interface: `process(events)` gets the host's events
    (`partition`, `offset`, `timestamp_ms`, `key`, `value`; bytes as bytes)
    and returns `[(index, reason)]` for the events it refuses. Use `state`
    and `output` for effects.

        Aggregator = raw(lambda events: [])
    """

    class Aggregator:
        def process(self, events):
            return [Rejection(index, reason) for index, reason in process(events)]

    return Aggregator


def aggregate(*, output, key, initial, apply, decode=None, emit=None):
    """A keyed aggregation, as the class componentize-py exports:

    - `output`: the output emitted records go to (the job declares it);
    - `decode(value: bytes)`: the event from a record's value (default:
      `decode_json`); raise `Reject` to refuse it;
    - `key(event)`: the state key, any JSON-encodable value;
    - `initial()`: the state of a key never written;
    - `apply(state, event)`: the next state (never mutate `state`);
    - `emit(state)`: what to emit after an update (`None`: nothing).

    Assign the result to `Aggregator` in the plugin's module.
    """
    decode = decode or decode_json
    output_name = output

    class Aggregator:
        def process(self, events):
            rejections = []
            slot_of = {}  # encoded key (str) -> slot index
            slots = []  # [key bytes, state, dirty]
            accepted = []
            for index, event in enumerate(events):
                try:
                    decoded = decode(event.value)
                    encoded = encode_json(key(decoded))
                except Reject as reject:
                    rejections.append(Rejection(index, str(reject)))
                    continue
                slot = slot_of.get(encoded)
                if slot is None:
                    slot = slot_of[encoded] = len(slots)
                    slots.append([encoded.encode(), None, False])
                accepted.append((index, slot, decoded))
            if not accepted:
                return rejections
            for slot, stored in zip(slots, _state.get_many([slot[0] for slot in slots])):
                slot[1] = initial() if stored is None else json.loads(stored)
            records = []
            for index, slot_index, decoded in accepted:
                slot = slots[slot_index]
                try:
                    slot[1] = apply(slot[1], decoded)
                except Reject as reject:
                    rejections.append(Rejection(index, str(reject)))
                    continue
                slot[2] = True
                if emit is not None:
                    out = emit(slot[1])
                    if out is not None:
                        records.append(OutputRecord(index, slot[0], encode_json(out).encode()))
            written = [(slot[0], encode_json(slot[1]).encode()) for slot in slots if slot[2]]
            if written:
                _state.put_many(written)
            if records:
                _output.emit_many(output_name, records)
            rejections.sort(key=lambda rejection: rejection.index)
            return rejections

    return Aggregator


# ---- JSON, exactly --------------------------------------------------------

MAX_DEPTH = 128
"""Most nesting a decoded value may have (as serde_json's limit)."""


class JsonNumber:
    """A JSON number kept as its source text (`decode_json(value, numbers="raw")`)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def is_integer(self) -> bool:
        """Whether it is written as an integer (no fraction, no exponent)."""
        return "." not in self.text and "e" not in self.text and "E" not in self.text

    def is_finite(self) -> bool:
        """Whether it reads as a finite double (`1e400` does not); CPython's
        `float` rounds correctly, as serde_json's float_roundtrip does."""
        return math.isfinite(float(self.text))

    def __repr__(self) -> str:
        return f"JsonNumber({self.text!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, JsonNumber) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class _Object(dict):
    """A decoded object that had a name more than once (the last one wins)."""

    __slots__ = ("duplicates",)


def duplicates(value) -> frozenset:
    """The names a decoded object gave more than once."""
    return getattr(value, "duplicates", frozenset())


def _object(pairs):
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen = set()
    with_duplicates = _Object(obj)
    with_duplicates.duplicates = frozenset(name for name, _ in pairs if name in seen or seen.add(name))
    return with_duplicates


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _float(text):
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number out of range: {text}")
    return number


_STRICT = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_refuse_constant, parse_float=_float)
_RAW = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_refuse_constant, parse_float=JsonNumber, parse_int=JsonNumber)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def too_deep(data: bytes) -> bool:
    """Whether arrays and objects nest past MAX_DEPTH, strings skipped
    (linear, and only scanned when the record holds that many brackets at
    all): `decode_json` refuses such a record, and so should a plugin's own
    decoder before it hands a record to the json module."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", data)):
        depth += 1 if bracket in b"[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _has_lone_surrogate(value) -> bool:
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(name) or _has_lone_surrogate(item) for name, item in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def decode_json(value: bytes, *, numbers: str = "exact", lone_surrogates: bool = False):
    """Decodes one JSON value as strictly as serde_json: UTF-8 only, no NaN
    or Infinity, numbers in range, at most MAX_DEPTH levels. Integers are
    `int` (exact at any size), other numbers `float`; `numbers="raw"` keeps
    every number as a `JsonNumber` instead. A name given twice keeps its
    last value and is listed by `duplicates(obj)`. A string holding a lone
    surrogate escape (`"\\ud800"`) is refused unless `lone_surrogates`.
    Raises `Reject("event is not UTF-8")` or `Reject("event is not valid JSON")`.
    """
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        raise Reject("event is not UTF-8") from None
    if too_deep(value):
        raise Reject("event is not valid JSON")
    try:
        decoded = (_RAW if numbers == "raw" else _STRICT).decode(text)
    except (ValueError, RecursionError):
        raise Reject("event is not valid JSON") from None
    if not lone_surrogates and _SURROGATE_ESCAPE.search(value) and _has_lone_surrogate(decoded):
        raise Reject("event is not valid JSON")
    return decoded


_dumps_string = json.JSONEncoder(ensure_ascii=False).encode


def encode_json(value) -> str:
    """JSON text as serde_json writes it: no spaces, non-ASCII as is, the
    same escapes; integers exact at any size, a `JsonNumber` as written,
    dict keys must be strings. (Floats are written as Python's `repr`:
    `1e+16` where serde_json writes `1e16`.)"""
    if isinstance(value, str):
        return _dumps_string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not JSON: JSON has no NaN or Infinity")
        return float.__repr__(value)
    if isinstance(value, JsonNumber):
        return value.text
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str):
                raise TypeError(f"a JSON object's names are strings, not {type(name).__name__} ({name!r})")
        return "{" + ",".join(_dumps_string(name) + ":" + encode_json(item) for name, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode_json(item) for item in value) + "]"
    raise TypeError(f"cannot encode a {type(value).__name__} as JSON")
