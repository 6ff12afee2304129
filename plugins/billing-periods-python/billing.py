"""The period billing plugin in Python: usage metered per customer, metric
and calendar period in the customer's time zone. The host owns the periods
(docs/periods.md); this plugin says what each event is and how its metric's
meter counts it. It is plugins/billing-periods (Rust), byte for byte: the
spec is docs/billing.md, "The period billing plugin".

Events: {"id":"e1","customer":"acme","metric":"calls","quantity":12,"ts":"2026-11-03T10:00:00Z"}
The job's [plugin_config] names each metric's meter:

    meters = { calls = "sum", requests = "count", peak_gb = "max", storage_gb = "latest", seats = { unique_count = "user" } }
"""

from __future__ import annotations

import json
import re
import unicodedata
from bisect import bisect_left
from json.decoder import scanstring

from tally import MAX_DEPTH, JsonNumber, Reject, decode_json, duplicates, too_deep
from tally.periods import ConfigError, Facts, Instant, PeriodPlugin, export, float_json

U64_MAX = (1 << 64) - 1
FIELDS = ("id", "customer", "metric", "quantity", "ts")
STRINGS = ("id", "customer", "metric", "ts")
METERS = ("sum", "count", "max", "latest")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NUMBER_ADDEND = re.compile(rb'\{"(sum|max|latest)":(0|[1-9][0-9]{0,19})\}')
NUMBER_STATE = re.compile(rb'\{"(sum|count|max)":(0|[1-9][0-9]{0,19})\}')
KINDS = {b"sum": "sum", b"count": "count", b"max": "max", b"latest": "latest"}
quoted = json.JSONEncoder(ensure_ascii=False).encode
"""A string as JSON, as serde_json writes it (as a refusal quotes it)."""
compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode
"""A list of strings as JSON, as serde_json writes it."""


class Billing(PeriodPlugin):
    """The billing plugin, configured: `meters` maps each metric to `"sum"`,
    `"count"`, `"max"`, `"latest"` or `("unique_count", field)`.

    In memory an addend is `(meter, payload)` (`("sum", 5)`, `("count",
    None)`, `("unique", "user-1")`), and so is a state (`("latest",
    (seconds, nanoseconds, quantity))`, `("unique", [sorted values])`); both
    travel as the JSON docs/billing.md gives."""

    def __init__(self, config) -> None:
        self.meters = read_meters(config)
        self.known = ", ".join(self.meters)

    # ---- describe --------------------------------------------------------

    def decode(self, value: bytes) -> Usage:
        return Usage(value)

    def describe(self, usage: Usage) -> Facts:
        fields = usage.fields
        metric = fields["metric"]
        meter = self.meters.get(metric)
        if meter is None:
            raise Reject(f"metric {quoted(metric)} has no meter; name it in the job's [plugin_config] meters (it has: {self.known})")
        if meter == "count":
            addend = ("count", None)
        elif type(meter) is str:
            addend = (meter, usage.quantity())
        else:
            addend = ("unique", usage.unique(meter[1]))
        customer = fields["customer"]
        return Facts(fields["id"], fields["ts"], [("customer", customer), ("metric", metric)], customer, addend)

    def encode_addend(self, addend) -> bytes:
        meter, payload = addend
        if meter == "count":
            return b'"count"'
        if meter == "unique":
            return b'{"unique":' + quoted(payload).encode() + b"}"
        return b'{"%s":%d}' % (meter.encode(), payload)

    def decode_addend(self, data: bytes):
        # The bytes encode_addend makes, read without the json module;
        # anything else as JSON (serde reads what it writes and more).
        number = NUMBER_ADDEND.fullmatch(data)
        if number is not None and int(number[2]) <= U64_MAX:
            return (KINDS[number[1]], int(number[2]))
        if data == b'"count"':
            return ("count", None)
        addend = decode_json(data)
        if addend == "count":
            return ("count", None)
        if type(addend) is dict and len(addend) == 1:
            ((meter, payload),) = addend.items()
            if meter in ("sum", "max", "latest") and type(payload) is int and 0 <= payload <= U64_MAX:
                return (meter, payload)
            if meter == "unique" and type(payload) is str:
                return (meter, payload)
            if meter == "count" and payload is None:
                return ("count", None)
        raise ValueError(f"{bytes(data).decode(errors='replace')} is none of the addends it makes")

    # ---- add and value ---------------------------------------------------

    def add(self, state, time: Instant, addend):
        kind, quantity = addend
        if state is None:
            if kind == "count":
                return ("count", 1)
            if kind == "latest":
                return ("latest", (time.seconds, time.nanoseconds, quantity))
            if kind == "unique":
                return ("unique", [quantity])
            return (kind, quantity)
        held, value = state
        if held != kind:
            raise Reject(
                f"the event's metric is metered by {meter_name(kind)} but its period was opened by {meter_name(held)}: "
                "a metric's meter changed while its period was open; keep a metric's meter for its periods"
            )
        if kind == "sum":
            total = value + quantity
            if total > U64_MAX:
                raise Reject("the period's sum would pass 2^64 - 1, the largest meterable")
            return ("sum", total)
        if kind == "count":
            return ("count", value + 1 if value < U64_MAX else value)
        if kind == "max":
            return ("max", quantity if quantity > value else value)
        if kind == "latest":
            # Of events with the same time, the one added first stays.
            if (time.seconds, time.nanoseconds) > (value[0], value[1]):
                return ("latest", (time.seconds, time.nanoseconds, quantity))
            return state
        at = bisect_left(value, quantity)
        if at == len(value) or value[at] != quantity:
            value.insert(at, quantity)
        return state

    def value(self, state) -> int:
        kind, value = state
        if kind == "latest":
            return value[2]
        if kind == "unique":
            return len(value)
        return value

    def encode_state(self, state) -> bytes:
        kind, value = state
        if kind == "latest":
            return b'{"latest":{"seconds":%d,"nanoseconds":%d,"value":%d}}' % value
        if kind == "unique":
            return b'{"unique":' + compact(value).encode() + b"}"
        return b'{"%s":%d}' % (kind.encode(), value)

    def decode_state(self, data: bytes):
        number = NUMBER_STATE.fullmatch(data)
        if number is not None and int(number[2]) <= U64_MAX:
            return (KINDS[number[1]], int(number[2]))
        state = decode_json(data)
        if type(state) is dict and len(state) == 1:
            ((kind, value),) = state.items()
            if kind in ("sum", "count", "max") and type(value) is int and 0 <= value <= U64_MAX:
                return (kind, value)
            if kind == "latest" and type(value) is dict and value.keys() == {"seconds", "nanoseconds", "value"}:
                seconds, nanoseconds, quantity = value["seconds"], value["nanoseconds"], value["value"]
                if all(type(part) is int for part in (seconds, nanoseconds, quantity)) and -(1 << 63) <= seconds < 1 << 63 \
                        and 0 <= nanoseconds < 1 << 32 and 0 <= quantity <= U64_MAX:
                    return (kind, (seconds, nanoseconds, quantity))
            if kind == "unique" and type(value) is list and all(type(item) is str for item in value):
                # A set, ordered by UTF-8 bytes (code points): as written, or made so.
                if value != sorted(value) or len(set(value)) != len(value):
                    value = sorted(set(value))
                return (kind, value)
        raise ValueError(f"{bytes(data).decode(errors='replace')} is none of the states it makes")


def meter_name(kind: str) -> str:
    """The meter an addend's or state's kind comes from, as [plugin_config] names it."""
    return "unique_count" if kind == "unique" else kind


class Usage:
    """A usage event, decoded and checked as docs/billing.md orders it: the
    record is UTF-8, one JSON value, an object; each of the five fields is
    given at most once and each but `quantity` is present; `id`,
    `customer`, `metric` and `ts` are strings without a lone surrogate.
    Other fields are kept (a `unique_count` meter reads one), and the
    record, to quote a refused value as written."""

    __slots__ = ("fields", "text")

    def __init__(self, value: bytes):
        try:
            text = value.decode()
        except UnicodeDecodeError:
            raise Reject("event is not UTF-8") from None
        # The common path: an object, read by the json module's C scanner
        # with its members in order (to see a name given twice). Anything
        # it does not read whole (a number past 4300 digits, text after
        # the object, NaN) goes the exact way, decode_json's.
        members = None
        if text[:1] == "{":
            if len(text) > 2 * MAX_DEPTH and too_deep(value):
                raise Reject("event is not valid JSON")
            try:
                members, end = scan_members(text, 0)
            except (ValueError, StopIteration, RecursionError):
                members = None
            else:
                if end != len(text) and WHITESPACE.match(text, end).end() != len(text):
                    members = None
        if members is None:
            fields = exact_fields(value)
        else:
            fields = dict(members)
            if len(fields) != len(members):
                seen = set()
                twice = frozenset(name for name, _ in members if name in seen or seen.add(name))
                fields = Fields(fields)
                fields.twice = twice
        escapes = "\\u" in text
        # Its names are read as text.
        if escapes and any(LONE_SURROGATE.search(name) for name in fields):
            raise Reject("event is not valid JSON")
        twice = getattr(fields, "twice", ())
        for field in FIELDS:
            if field in twice:
                raise Reject(f"field `{field}` is given twice")
            if field not in fields and field != "quantity":
                raise Reject(f"field `{field}` is missing")
        for field in STRINGS:
            string = fields[field]
            if type(string) is not str:
                raise Reject(f"field `{field}` must be a string")
            if escapes and LONE_SURROGATE.search(string):
                raise Reject("event is not valid JSON")
        self.fields = fields
        self.text = text

    def quantity(self) -> int:
        """`quantity`, exactly as written: a non-negative integer up to 2^64 − 1."""
        quantity = self.fields.get("quantity", MISSING)
        if type(quantity) is int and quantity > 0:  # written as its digits
            if quantity <= U64_MAX:
                return quantity
            raise Reject(f"quantity {quantity} is over the largest meterable, 2^64 - 1")
        if quantity is MISSING:
            raise Reject("field `quantity` is missing")
        text = quantity.text if isinstance(quantity, JsonNumber) else self.written("quantity")
        if text.isdigit():  # no sign, fraction or exponent (JSON digits are ASCII)
            if len(text) <= 20 and int(text) <= U64_MAX:
                return int(text)
            raise Reject(f"quantity {text} is over the largest meterable, 2^64 - 1")
        raise Reject(f"quantity must be a non-negative integer, got {text}")

    def unique(self, field: str) -> str:
        """The string `field` holds, for a `unique_count` meter (of a field
        other than the five written twice, the last)."""
        value = self.fields.get(field, MISSING)
        if value is MISSING:
            raise Reject(f"field {quoted(field)} (counted by unique_count) is missing")
        if type(value) is not str:
            raise Reject(f"field {quoted(field)} must be a string for its unique_count meter, got {self.written(field)}")
        if LONE_SURROGATE.search(value):
            raise Reject("event is not valid JSON")
        return value

    def written(self, field: str) -> str:
        """The text of `field`'s value in the record, from its first byte to
        its last (its last one, if given twice)."""
        return written(self.text, field)


class Fields(dict):
    """An event's fields, some given twice (`twice`; the last one kept)."""

    __slots__ = ("twice",)


MISSING = object()


def not_json(name: str):
    raise ValueError(f"{name} is not JSON")


scan_members = json.JSONDecoder(object_pairs_hook=list, parse_constant=not_json).scan_once


def exact_fields(value: bytes) -> dict:
    """The fields of an event the common path does not read, by
    decode_json (every number as written; lone surrogates kept, as other
    fields may hold them); refused in the table's words."""
    fields = decode_json(value, numbers="raw", lone_surrogates=True)
    if isinstance(fields, dict):
        twice = duplicates(fields)
        if twice:
            fields = Fields(fields)
            fields.twice = twice
        return fields
    # A number alone is read as a float, so one out of range is not JSON; a
    # string alone is read as text.
    if isinstance(fields, JsonNumber) and not fields.is_finite():
        raise Reject("event is not valid JSON")
    if isinstance(fields, str) and LONE_SURROGATE.search(fields):
        raise Reject("event is not valid JSON")
    raise Reject("event must be a JSON object")


WHITESPACE = re.compile(r"[ \t\n\r]*")
_scan_value = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=str, object_pairs_hook=len).scan_once


def written(text: str, name: str) -> str | None:
    """The text of the last top-level member `name` of the JSON object
    `text` (known to be valid JSON)."""
    found = None
    at = WHITESPACE.match(text, 0).end() + 1  # past the `{`
    while True:
        at = WHITESPACE.match(text, at).end()
        if text[at] == "}":
            return found
        if text[at] == ",":
            at = WHITESPACE.match(text, at + 1).end()
        key, at = scanstring(text, at + 1)
        at = WHITESPACE.match(text, at).end() + 1  # past the `:`
        start = WHITESPACE.match(text, at).end()
        _, at = _scan_value(text, start)
        if key == name:
            found = text[start:at]


# ---- [plugin_config] meters, read as the Rust build's serde reads them ------

CONFIG_HINT = 'write meters = { calls = "sum", seats = { unique_count = "user" } }'
UNTAGGED = "data did not match any variant of untagged enum MeterSpec"


def utf8_order(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def read_meters(config) -> dict:
    """Each metric's meter, by metric in UTF-8 byte order; or `ConfigError`
    with the Rust build's message."""
    def refuse(reason: str):
        raise ConfigError(f"{CONFIG_HINT}: {reason}")

    if isinstance(config, list):  # serde reads a struct from a sequence too
        if not config:
            refuse("invalid length 0, expected struct Config with 1 element")
        if len(config) > 1:
            refuse(f"invalid length {len(config)}, expected fewer elements in array")
        config = {"meters": config[0]}
    elif not isinstance(config, dict):
        refuse(f"invalid type: {unexpected(config)}, expected struct Config")
    specs = None
    for name in sorted(config, key=utf8_order):  # serde reads the names in this order
        if name != "meters":
            refuse(f"unknown field `{name}`, expected `meters`")
        table = config["meters"]
        if not isinstance(table, dict):
            refuse(f"invalid type: {unexpected(table)}, expected a map")
        specs = {}
        for metric in sorted(table, key=utf8_order):
            spec = meter_spec(table[metric])
            if spec is None:
                refuse(UNTAGGED)
            specs[metric] = spec
    if specs is None:
        refuse("missing field `meters`")
    if not specs:
        raise ConfigError("meters is empty: name at least one metric's meter")
    meters = {}
    for metric, (name, field) in specs.items():
        if name in METERS and field is None:
            meters[metric] = name
        elif name == "unique_count" and field:
            meters[metric] = ("unique_count", field)
        elif name == "unique_count":
            raise ConfigError(f'meters.{metric}: unique_count counts the values of a field; name it: {{ unique_count = "user" }}')
        else:
            raise ConfigError(
                f'meters.{metric} = {rust_debug(name)}: the meters are "sum", "count", "max", "latest" and {{ unique_count = "<field>" }}'
            )
    return meters


def meter_spec(spec):
    """(meter, field or None) of a meter as written, or None where the Rust
    build's untagged enum matches none of its forms: `"sum"`,
    `"unique_count:user"`, `{ unique_count = "user" }` or `{ meter =
    "unique_count", field = "user" }` (a table's other names are ignored;
    an untagged struct is read from a table only, not from an array)."""
    if isinstance(spec, str):
        name, colon, field = spec.partition(":")
        return (name, field if colon else None)
    if isinstance(spec, dict):
        if isinstance(spec.get("unique_count"), str):
            return ("unique_count", spec["unique_count"])
        field = spec.get("field")
        if isinstance(spec.get("meter"), str) and (field is None or isinstance(field, str)):
            return (spec["meter"], field)
    return None


def unexpected(value) -> str:
    """A JSON value as serde_json's `invalid type` names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{float_json(value)}`"
    if isinstance(value, str):
        return f"string {rust_debug(value)}"
    return "sequence" if isinstance(value, list) else "map"


_RUST_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"'}


def rust_debug(text: str) -> str:
    """`text` as Rust's `{:?}` writes a string: quoted, with `\\n`, `\\"`,
    and `\\u{…}` for what it does not print (control, format, unassigned,
    private-use and separator characters but the space, and combining
    marks; by Python's Unicode tables, which may lag Rust's)."""
    out = []
    for char in text:
        if char in _RUST_ESCAPES:
            out.append(_RUST_ESCAPES[char])
        elif char != " " and (unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs", "Mn", "Me") or char == "\u200c"):
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


Config, Periods = export(Billing)
