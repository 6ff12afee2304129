"""Period plugins (`tally:plugin@0.2.0`, world `periods-plugin`): the
aggregation of a job that declares `[periods]`.

The host owns event time in such a job: it assigns each event to its
customer's calendar period, keeps watermarks, closes periods, de-duplicates
event ids and writes the FINAL and ADJUSTMENT records (docs/periods.md). A
period plugin says only what the host cannot know: what an event says about
itself and adds to its period (`describe`: its `Facts`, with an addend), how
an addend changes a period's state (`add`) and a period's value (`value`).
An event is read once, by `describe`: the host keeps its addend and hands
that to `add`. Each is a pure function of its arguments and the job's
`[plugin_config]`: the plugin has no state of its own.

    from tally import Reject
    from tally.periods import Facts, Instant, PeriodPlugin, export

    class CallsPerPeriod(PeriodPlugin):
        def __init__(self, config: dict) -> None:
            pass

        def describe(self, call: dict) -> Facts:
            if not isinstance(call.get("customer"), str):
                raise Reject("field `customer` must be a string")
            return Facts(id=call["id"], time=call["ts"], key=[("customer", call["customer"])],
                         customer=call["customer"], addend=None)

        def add(self, calls: int | None, time: Instant, addend: None) -> int:
            return (calls or 0) + 1

        def value(self, calls: int) -> int:
            return calls

    Config, Periods = export(CallsPerPeriod)

The module the project's `pyproject.toml` names (`[tool.tally] module`, with
`world = "periods-plugin"`) must bind `Config` and `Periods`: they are the
interfaces the component exports. The semantics are the Rust SDK's
(`sdk/rust/src/periods.rs`), refusal words included, so a plugin ported
between them makes the same bytes.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, NamedTuple, Sequence, TypeVar

from . import _IN_COMPONENT, Reject, decode_json


def _native_bindings():
    """The checked-in bindings of the periods world, loaded natively under a
    package name of their own: the 0.1 world's, which `tally` itself loads,
    are also called `wit_world`."""
    import importlib
    import importlib.util

    name = "_tally_periods_wit_world"
    if name not in sys.modules:
        root = Path(__file__).resolve().parent.parent / "bindings-periods" / "wit_world"
        spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return importlib.import_module(name + ".imports.types"), importlib.import_module(name + ".exports.periods")


if _IN_COMPONENT:
    try:
        from wit_world.exports import periods as _wit_periods
        from wit_world.imports import types as _wit_types
    except ImportError:
        raise ImportError('tally.periods is for period plugins: build with [tool.tally] world = "periods-plugin"') from None
else:
    _wit_types, _wit_periods = _native_bindings()
from componentize_py_types import Err as _Err, Ok as _Ok  # noqa: E402  (after the bindings are on the path)

_EventFacts = _wit_types.EventFacts
_Rfc3339 = _wit_types.EventTime_Rfc3339
_UnixMillis = _wit_types.EventTime_UnixMillis
_Refusal = _wit_periods.Refusal

__all__ = [
    "Facts", "Instant", "PeriodPlugin", "ConfigError", "Refused", "export",
    "configure", "describe", "describe_all", "add_all", "add", "value", "encode", "decode", "float_json", "U64_MAX",
]

U64_MAX = (1 << 64) - 1
"""The largest value a period can have (a `u64`)."""

Event = TypeVar("Event")
Addend = TypeVar("Addend")
State = TypeVar("State")


class Instant(NamedTuple):
    """An event's time as the host read it: seconds since the Unix epoch and
    nanoseconds within the second. Instants order as times do."""

    seconds: int
    nanoseconds: int = 0


@dataclass(slots=True)
class Facts(Generic[Addend]):
    """What an event says about itself, and what it adds to its period.

    - `id`: the producer's id of the event; a retry carries the same one
      (at most 256 bytes);
    - `time`: when it happened: an RFC 3339 `str` (`2026-11-03T10:00:00Z`;
      the host parses it, and refuses it in its own words), an `int` of
      milliseconds since the Unix epoch, or an aware `datetime`;
    - `key`: the aggregation key's fields, in order, as (name, value) pairs
      or a dict: each period is one key's, and its records carry them;
    - `customer`: whose time zone decides the event's period;
    - `addend`: what the event adds to its period; the host keeps it
      (encoded by `encode_addend`, JSON by default) and hands it to `add`
      in place of the event.
    """

    id: str
    time: str | int | datetime
    key: Sequence[tuple[str, str]] | dict[str, str]
    customer: str
    addend: Addend


class ConfigError(ValueError):
    """Why the job's `[plugin_config]` is refused: raise it from the
    plugin's `__init__`. The job does not start, and says this message."""


class Refused(Reject):
    """`add` refused an addition (`addition`: its index in the call)."""

    def __init__(self, addition: int, reason: str):
        super().__init__(reason)
        self.addition = addition


# ---- JSON, as serde_json writes it ----------------------------------------

_encode_fast = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False).encode
_decode_text = json.JSONDecoder(parse_constant=lambda name: _not_json(name)).decode
_EXPONENT = re.compile(r"[0-9]e-0")  # where repr and zmij differ: 1e-05, 1e-07


def _not_json(name):
    raise ValueError(f"{name} is not JSON")


def float_json(number: float) -> str:
    """A finite float as serde_json (1.0.154, the build's: `zmij`) writes it:
    the shortest digits that read back the same, as Python's `repr` finds
    them; in decimal from 1e-5 to under 1e16 (`0.00001`, `123.0`), else as
    `1.5e+16`, `1e-7` (the exponent unpadded)."""
    if not math.isfinite(number):
        raise ValueError(f"{number} is not JSON: JSON has no NaN or Infinity")
    text = float.__repr__(number)
    if "e" not in text:
        return text  # repr is decimal from 1e-4 to under 1e16, as zmij is
    mantissa, exponent = text.split("e")
    power = int(exponent)
    if power == -5:  # zmij's decimal range starts an order of magnitude lower
        sign = "-" if mantissa[0] == "-" else ""
        return f"{sign}0.0000{mantissa.lstrip('-').replace('.', '')}"
    return f"{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


def _name(name) -> str:
    """A dict key as a JSON object's name, as the json module makes it."""
    if isinstance(name, float):
        return '"' + float_json(name) + '"'
    if isinstance(name, str):
        return _encode_fast(name)
    return _encode_fast({name: 0})[1:-3]


def _encode_exact(value) -> str:
    if isinstance(value, float):
        return float_json(value)
    if isinstance(value, dict):
        return "{" + ",".join(_name(name) + ":" + _encode_exact(item) for name, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode_exact(item) for item in value) + "]"
    return _encode_fast(value)


def encode(value) -> bytes:
    """`value` as JSON bytes, as serde_json writes it: no spaces, non-ASCII
    as is, serde_json's escapes, integers exact, floats as `float_json`.
    (The json module's C encoder; again in Python where it wrote a float
    from 1e-9 to under 1e-4, the one place `repr` and serde_json differ.)"""
    text = _encode_fast(value)
    if _EXPONENT.search(text) is not None:
        text = _encode_exact(value)
    return text.encode()


def decode(data: bytes):
    """JSON bytes as Python values (`int` exact at any size); raises
    `ValueError` when they are not JSON."""
    return _decode_text(bytes(data).decode())


# ---- The plugin -------------------------------------------------------------


class PeriodPlugin(Generic[Event, Addend, State]):
    """The aggregation of a period job: subclass it, and `export` it.

    The host makes one per component instance, with the job file's
    `[plugin_config]` decoded from JSON (a dict; `{}` when the job has
    none): raise `ConfigError` from `__init__` to refuse it.

    Override `describe`, `add` and `value`; `decode` (how a record becomes
    the event `describe` gets) and the addend and state codecs have JSON
    defaults. Raise `tally.Reject` from `decode` or `describe` to dead-letter
    a malformed event, from `add` to refuse an event (it then counts for
    nothing); any other exception is a bug: the plugin traps.
    """

    def __init__(self, config: Any) -> None:
        self.config = config

    def decode(self, value: bytes) -> Event:
        """The event in a record's value: `tally.decode_json` by default
        (refusing with `event is not UTF-8` or `event is not valid JSON`,
        the words every SDK uses)."""
        return decode_json(value)

    def describe(self, event: Event) -> Facts[Addend]:
        """What `event` says about itself and adds to its period."""
        raise NotImplementedError(f"{type(self).__name__} must define describe(self, event)")

    def add(self, state: State | None, time: Instant, addend: Addend) -> State:
        """A period's state after an event's `addend` is added to `state`
        (`None`: the period's first event); `time` is the event's time as
        the host read it. It may change `state` in place and return it."""
        raise NotImplementedError(f"{type(self).__name__} must define add(self, state, time, addend)")

    def value(self, state: State) -> int:
        """The value of a period whose state is `state` (0 to 2^64 - 1):
        what its FINAL and ADJUSTMENT records carry."""
        raise NotImplementedError(f"{type(self).__name__} must define value(self, state)")

    def encode_addend(self, addend: Addend) -> bytes:
        """An addend as the host keeps it (JSON, by `encode`)."""
        return encode(addend)

    def decode_addend(self, data: bytes) -> Addend:
        """An addend `encode_addend` made; raise `ValueError` for bytes it
        did not make."""
        return decode(data)

    def encode_state(self, state: State) -> bytes:
        """A period's state as the host keeps it (JSON, by `encode`): another
        build of the plugin, in any language, takes it over in a hot swap."""
        return encode(state)

    def decode_state(self, data: bytes) -> State:
        """A period's state `encode_state` made; raise `ValueError` for bytes
        it did not make."""
        return decode(data)


# ---- What the exports do (natively callable, as tally.testing does) ---------


def configure(plugin: type[PeriodPlugin], config: str) -> PeriodPlugin:
    """The plugin configured by `config` (the `[plugin_config]` JSON), or
    `ConfigError` with the message the job is refused with."""
    try:
        decoded = json.loads(config)
    except ValueError as err:
        raise ConfigError(f"[plugin_config] does not fit this plugin: {err}") from None
    return plugin(decoded)


def _event_time(time):
    if isinstance(time, str):
        return _Rfc3339(time)
    if isinstance(time, int) and not isinstance(time, bool):
        return _UnixMillis(time)
    if isinstance(time, datetime):
        if time.utcoffset() is None:
            raise TypeError(f"an event time must be aware (it has no offset): {time!r}")
        return _Rfc3339(time.isoformat())
    if isinstance(time, (_Rfc3339, _UnixMillis)):
        return time
    raise TypeError(f"an event time is an RFC 3339 str, Unix milliseconds (int) or an aware datetime, not {type(time).__name__}")


def describe(plugin: PeriodPlugin, value: bytes):
    """The facts of one record (`value`), with the addend encoded as the host
    keeps it (a WIT `event-facts`), or `Reject` with the dead-letter reason."""
    facts = plugin.describe(plugin.decode(value))
    try:
        addend = plugin.encode_addend(facts.addend)
    except (TypeError, ValueError) as err:
        raise Reject(f"its addend does not encode: {err}") from None
    key = facts.key
    if isinstance(key, dict):
        key = list(key.items())
    return _EventFacts(facts.id, _event_time(facts.time), key, facts.customer, addend)


def describe_all(plugin: PeriodPlugin, events) -> list:
    """The `describe` export: one `Ok(event-facts)` or `Err(reason)` per
    event, in order, in one pass over the batch."""
    decode_event, describe_event, encode_addend = plugin.decode, plugin.describe, plugin.encode_addend
    facts_type, rfc3339 = _EventFacts, _Rfc3339
    results = []
    append = results.append
    for event in events:
        try:
            facts = describe_event(decode_event(event.value))
        except Reject as reject:
            append(_Err(str(reject)))
            continue
        try:
            addend = encode_addend(facts.addend)
        except (TypeError, ValueError) as err:
            append(_Err(f"its addend does not encode: {err}"))
            continue
        time, key = facts.time, facts.key
        time = rfc3339(time) if type(time) is str else _event_time(time)
        if type(key) is dict:
            key = list(key.items())
        append(_Ok(facts_type(facts.id, time, key, facts.customer, addend)))
    return results


_ABSENT = object()


def add_all(plugin: PeriodPlugin, states: Sequence[bytes | None], addends: Sequence[bytes], additions) -> list[bytes]:
    """The `add` export: folds `additions` (each with `period`, `time`
    (`seconds`, `nanoseconds`) and `addend`, indices into `states` and
    `addends`), in order, into `states` (`None`: a period without an event
    yet), decoding each state once and encoding it once. Returns each
    period's state after the fold, or raises `Refused` for the first
    addition refused (then nothing of the call counts)."""
    count = len(addends)
    for index, addition in enumerate(additions):
        if addition.addend >= count:
            raise Refused(index, f"the addition names addend {addition.addend}, of {count}")
    decode_state = plugin.decode_state
    try:
        folded = [_ABSENT if state is None else decode_state(state) for state in states]
    except (TypeError, ValueError) as err:
        raise Refused(0, f"a period's state does not decode: {err}") from None
    decode_addend, add_one = plugin.decode_addend, plugin.add
    periods = len(folded)
    for index, addition in enumerate(additions):
        period = addition.period
        if period >= periods:
            raise Refused(index, f"the addition names period {period}, of {periods}")
        try:
            addend = decode_addend(addends[addition.addend])
        except (TypeError, ValueError) as err:
            raise Refused(index, f"the event's addend is not the JSON this plugin makes: {err}") from None
        state = folded[period]
        time = addition.time
        try:
            folded[period] = add_one(None if state is _ABSENT else state, Instant(time.seconds, time.nanoseconds), addend)
        except Refused:
            raise
        except Reject as reject:
            raise Refused(index, str(reject)) from None
    encode_state = plugin.encode_state
    result = []
    for period, state in enumerate(folded):
        if state is _ABSENT:
            raise Refused(0, f"period {period} has neither a state nor an addition")
        result.append(encode_state(state))
    return result


class _Addition(NamedTuple):
    period: int
    time: Instant
    addend: int


def add(plugin: PeriodPlugin, state: bytes | None, time: Instant, addend: bytes) -> bytes:
    """The state after the encoded `addend` (of an event at `time`) is added
    to `state`: a fold of one addition. Raises `Refused` (`addition` 0)."""
    return add_all(plugin, [state], [addend], [_Addition(0, time, 0)])[0]


def value(plugin: PeriodPlugin, state: bytes) -> int:
    """The `value` export: the value of the period whose state is `state`."""
    number = plugin.value(plugin.decode_state(state))
    if type(number) is not int or not 0 <= number <= U64_MAX:
        raise ValueError(f"a period's value is an int from 0 to 2^64 - 1, not {number!r}")
    return number


def export(plugin: type[PeriodPlugin]) -> tuple[type, type]:
    """The `Config` and `Periods` classes a component exports for `plugin`
    (a `PeriodPlugin` subclass): bind them in the plugin's module,

        Config, Periods = export(MyPlugin)

    The host configures each instance once, before any other call; a second
    configuration is checked but changes nothing (as in the Rust SDK)."""
    configured: list[PeriodPlugin] = []

    def instance() -> PeriodPlugin:
        if not configured:
            raise RuntimeError("the host configures a period plugin before calling it")
        return configured[0]

    class Config:
        def configure(self, config: str) -> None:
            try:
                made = configure(plugin, config)
            except ConfigError as err:
                raise _Err(str(err)) from None
            if not configured:
                configured.append(made)

    class Periods:
        def describe(self, events):
            return describe_all(instance(), events)

        def add(self, states, addends, additions):
            try:
                return add_all(instance(), states, addends, additions)
            except Refused as refused:
                raise _Err(_Refusal(refused.addition, str(refused))) from None

        def value(self, state: bytes) -> int:
            return value(instance(), state)

    Config.__qualname__ = Config.__name__ = "Config"
    Periods.__qualname__ = Periods.__name__ = "Periods"
    return Config, Periods
