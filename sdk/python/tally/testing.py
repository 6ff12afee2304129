"""Tally's test driver for Python plugins, for pytest (or any runner):

    import billing
    from tally.testing import PluginTest

    def test_totals_add_up():
        plugin = PluginTest(billing.Aggregator, outputs=["totals"])
        sent = plugin.send(['{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}'])
        assert sent.dead_letters == []

It runs the plugin natively under CPython against an in-memory host that
answers the same `tally:plugin` calls a component makes, so a test needs no
build; `tally plugin build` and the host's own tests check the component.
Like the host, it discards a batch's state changes and outputs when
`process` raises anything but `Reject` (and re-raises it: that is a bug).

A period plugin (tally.periods) is tested with `PeriodsTest`, below, natively,
or with `PeriodsRun`, through the real host (`tally run`), to see its FINAL
and ADJUSTMENT records exactly as the host emits them.
"""

import calendar
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime

import tally  # noqa: F401  (puts the bindings on the path natively)
from componentize_py_types import Err
from wit_world.imports import log as host_log, output as host_output, state as host_state
from wit_world.imports.types import Event

from tally import encode_json, periods


@dataclass
class Record:
    """One record a batch emitted, its key and value as text."""

    output: str
    event: int
    key: str | None
    value: str


@dataclass
class DeadLetter:
    """One event a batch refused."""

    offset: int
    reason: str


@dataclass
class Sent:
    """What one `send` did."""

    outputs: list
    dead_letters: list


class _Host:
    """The in-memory host the bindings' calls reach."""

    def __init__(self, outputs):
        self.declared = frozenset(outputs)
        self.state = {}
        self.emitted = []
        self.logs = []

    def emit(self, output, record):
        if output not in self.declared:
            raise RuntimeError(f"the plugin emitted to `{output}`, which the job does not declare (it declares {sorted(self.declared)})")
        self.emitted.append((output, record))


_current: _Host | None = None


def _host() -> _Host:
    if _current is None:
        raise RuntimeError("a host call outside PluginTest.send")
    return _current


host_state.get = lambda key: _host().state.get(bytes(key))
host_state.get_many = lambda keys: [_host().state.get(bytes(key)) for key in keys]
host_state.put = lambda key, value: _host().state.__setitem__(bytes(key), bytes(value))
host_state.put_many = lambda entries: _host().state.update((bytes(key), bytes(value)) for key, value in entries)
host_state.delete = lambda key: _host().state.pop(bytes(key), None)
host_state.delete_many = lambda keys: [_host().state.pop(bytes(key), None) for key in keys] and None
host_output.emit = lambda output, record: _host().emit(output, record)
host_output.emit_many = lambda output, records: [_host().emit(output, record) for record in records] and None
host_log.log = lambda level, message: _host().logs.append((level.name.lower(), message))


class PluginTest:
    """A plugin (its `Aggregator` class) under test, its state kept across `send`s."""

    def __init__(self, aggregator, outputs):
        self.aggregator = aggregator()
        self.host = _Host(outputs)
        self.offset = 0

    def send(self, records) -> Sent:
        """Sends one batch (str or bytes each) on partition 0."""
        global _current
        events = []
        for record in records:
            value = record.encode() if isinstance(record, str) else bytes(record)
            events.append(Event(partition=0, offset=self.offset, timestamp_ms=None, key=None, value=value))
            self.offset += 1
        before = dict(self.host.state)
        self.host.emitted = []
        _current = self.host
        try:
            rejections = self.aggregator.process(events)
        except BaseException:
            self.host.state = before
            raise
        finally:
            _current = None
        text = lambda data: None if data is None else bytes(data).decode()  # noqa: E731
        return Sent(
            outputs=[Record(output, record.event, text(record.key), text(record.value)) for output, record in self.host.emitted],
            dead_letters=[DeadLetter(events[rejection.index].offset, rejection.reason) for rejection in rejections],
        )

    def state(self, key):
        """The stored state of `key` (as the plugin's `key` returned it), decoded, or None."""
        stored = self.host.state.get(encode_json(key).encode())
        return None if stored is None else tally.decode_json(stored)

    def all_state(self) -> list:
        """Every stored entry as (key text, value text), by key bytes."""
        return [(key.decode(), value.decode()) for key, value in sorted(self.host.state.items())]

    @property
    def logs(self) -> list:
        """Every line logged so far, as (level, message)."""
        return self.host.logs


# ---- Period plugins (tally:plugin@0.2.0) ------------------------------------


@dataclass
class Described:
    """What `describe` said of a record it did not refuse (the addend as the
    host keeps it, as text)."""

    id: str
    time: str | int
    key: list
    customer: str
    addend: str


@dataclass
class Folded:
    """What one `PeriodsTest.send` did: the dead letters (`malformed: ` or
    `refused: ` and the plugin's reason, as the host writes them) and the
    value of each period it changed, by key (the tuple of the key's values)."""

    dead_letters: list
    values: dict


_TIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?([Zz]|([+-])([0-9]{2}):([0-9]{2}))")


def instant(time: str | int) -> periods.Instant:
    """An event time (RFC 3339 text with an offset, or Unix milliseconds) as
    the host reads it; `ValueError` when it is not one."""
    if isinstance(time, int):
        return periods.Instant(time // 1000, time % 1000 * 1_000_000)
    parts = _TIME.fullmatch(time)
    if parts is None:
        raise ValueError(f"event time {time!r} is not an RFC 3339 instant with an offset")
    year, month, day, hour, minute, second = (int(part) for part in parts.group(1, 2, 3, 4, 5, 6))
    try:
        seconds = calendar.timegm(datetime(year, month, day, hour, minute, min(second, 59)).timetuple())
    except ValueError:
        raise ValueError(f"event time {time!r} is not an RFC 3339 instant with an offset") from None
    if parts.group(9):
        offset = int(parts.group(10)) * 3600 + int(parts.group(11)) * 60
        seconds -= offset if parts.group(9) == "+" else -offset
    fraction = (parts.group(7) or ".")[1:]
    return periods.Instant(seconds, int(fraction.ljust(9, "0")))


class PeriodsTest:
    """A period plugin (its `PeriodPlugin` class) under test, natively,
    through the very `Config` and `Periods` exports its component has:

        plugin = PeriodsTest(billing.Billing, {"meters": {"calls": "sum"}})
        assert plugin.describe([record])[0].addend == '{"sum":3}'
        sent = plugin.send([record, another])
        assert sent.values == {("acme", "calls"): 5}

    `describe` and `add` are the exports' calls; `send` plays the host over
    one batch, simply: every key has one period, held across sends (no
    calendar, watermark or de-duplication: docs/periods.md's host does
    those). A configuration the plugin refuses raises `ConfigError`.
    """

    def __init__(self, plugin: type, config: dict | str | None = None):
        config_export, periods_export = periods.export(plugin)
        text = config if isinstance(config, str) else json.dumps({} if config is None else config)
        try:
            config_export().configure(text)
        except Err as err:
            raise periods.ConfigError(err.value) from None
        self.exports = periods_export()
        self.states: dict = {}
        self.offset = 0

    def _events(self, records) -> list:
        events = []
        for record in records:
            value = record.encode() if isinstance(record, str) else bytes(record)
            events.append(periods._wit_types.Event(partition=0, offset=self.offset, timestamp_ms=None, key=None, value=value))
            self.offset += 1
        return events

    def describe(self, records) -> list:
        """The export's answer for each record (str or bytes): a `Described`,
        or the plugin's reason for refusing it (the host dead-letters it
        with `malformed: ` before the reason)."""
        results = self.exports.describe(self._events(records))
        described = []
        for result in results:
            if isinstance(result, Err):
                described.append(result.value)
            else:
                facts = result.value
                described.append(Described(facts.id, facts.time.value, list(facts.key), facts.customer, bytes(facts.addend).decode()))
        return described

    def add(self, states, addends, additions) -> list:
        """The export's answer: each state after the fold (text), or
        `periods.Refused` (its `addition` index). `states` are text or None,
        `addends` text, `additions` (period, time, addend) with the time as
        an `Instant`, RFC 3339 text or Unix milliseconds."""
        wit_additions = []
        for period, time, addend in additions:
            at = time if isinstance(time, periods.Instant) else instant(time)
            wit_additions.append(periods._wit_periods.Addition(period, periods._wit_types.Instant(at.seconds, at.nanoseconds), addend))
        try:
            folded = self.exports.add(
                [None if state is None else _bytes(state) for state in states], [_bytes(addend) for addend in addends], wit_additions
            )
        except Err as err:
            raise periods.Refused(err.value.addition, err.value.reason) from None
        return [bytes(state).decode() for state in folded]

    def value(self, state) -> int:
        """The export's value of a state (text or bytes)."""
        return self.exports.value(_bytes(state))

    def send(self, records) -> Folded:
        """Describes a batch and adds what it may to each key's period in one
        `add` call (and, if it refuses one, event by event, as the host
        does); returns the dead letters and the values it changed."""
        events = self._events(records)
        dead_letters, accepted = [], []
        for event, result in zip(events, self.exports.describe(events)):
            if isinstance(result, Err):
                dead_letters.append(DeadLetter(event.offset, f"malformed: {result.value}"))
                continue
            facts = result.value
            try:
                at = instant(facts.time.value)
            except ValueError as err:
                dead_letters.append(DeadLetter(event.offset, f"malformed: {err}"))
                continue
            accepted.append((event.offset, tuple(value for _, value in facts.key), at, bytes(facts.addend)))
        changed = set()
        try:
            changed.update(self._fold(accepted))
        except periods.Refused:
            for one in accepted:
                try:
                    changed.update(self._fold([one]))
                except periods.Refused as refused:
                    dead_letters.append(DeadLetter(one[0], f"refused: {refused}"))
        dead_letters.sort(key=lambda letter: letter.offset)
        return Folded(dead_letters, {key: self.value(self.states[key]) for key in sorted(changed)})

    def _fold(self, accepted) -> list:
        keys = list(dict.fromkeys(key for _, key, _, _ in accepted))
        index = {key: at for at, key in enumerate(keys)}
        folded = self.add(
            [self.states.get(key) for key in keys],
            [addend for _, _, _, addend in accepted],
            [(index[key], at, number) for number, (_, key, at, _) in enumerate(accepted)],
        )
        self.states.update(zip(keys, folded))
        return keys

    def state(self, *key: str) -> str | None:
        """The state of the period of `key` (its values, in order), as text."""
        return self.states.get(key)


def _bytes(data) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


# ---- Period plugins through the real host ----------------------------------


@dataclass(frozen=True)
class PeriodRecord:
    """One FINAL or ADJUSTMENT record as the host wrote it (the `value` of
    its line in `out/periods.ndjson`): `type` is "final" or "adjustment";
    `previous` and `delta` (the value minus the previous one: negative when
    the value fell) are None on a final. `customer` is None when the
    aggregation key has no `customer` field. `fields` is the whole record
    (`metric`, `time_zone`, `tzdata` and every other field)."""

    type: str
    customer: str | None
    period: str
    start: str
    end: str
    value: int
    version: int
    previous: int | None
    delta: int | None
    fields: dict = field(hash=False, repr=False)


@dataclass
class PeriodsSent:
    """What one `PeriodsRun.send` added: the period records and the dead
    letters (each's offset is the line's, 0-based, in the one input file
    every send appends to: offsets go on across sends)."""

    records: list
    dead_letters: list


_TALLY_MISSING = (
    "the host-run test driver needs the `tally` binary: set $TALLY_BIN to its path, or put `tally` on PATH. "
    "Build it from the Tally tree with `cargo install --path host`, or put the built "
    "`tally` (target/release/tally) on PATH"
)


def tally_binary() -> str:
    """The `tally` the host-run driver uses: `$TALLY_BIN`, else `tally` on
    PATH; raises `FileNotFoundError` naming both when there is neither."""
    explicit = os.environ.get("TALLY_BIN")
    if explicit:
        if not os.path.isfile(explicit) or not os.access(explicit, os.X_OK):
            raise FileNotFoundError(f"$TALLY_BIN is {explicit!r}, which is not an executable file; {_TALLY_MISSING}")
        return explicit
    found = shutil.which("tally")
    if found is None:
        raise FileNotFoundError(f"$TALLY_BIN is not set and there is no `tally` on PATH; {_TALLY_MISSING}")
    return found


class PeriodsRun:
    """A period plugin run through the real host, `tally run` in local mode,
    so a test sees its FINAL and ADJUSTMENT records exactly as the host
    emits them (time zones, DST, grace, versions, de-duplication):

        with PeriodsRun(".", periods='time_zones = { acme = "America/New_York" }',
                        plugin_config='meters = { calls = "sum" }') as run:
            run.send(['{"id":"a","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-10T12:00:00Z"}'])
            sent = run.send(['{"id":"b","customer":"acme","metric":"calls","quantity":1,"ts":"2026-12-03T00:00:00Z"}'])
            assert [(r.type, r.period, r.value) for r in sent.records] == [("final", "2026-11", 5)]

    It builds the project at `project_dir` once (`tally plugin build`) into
    a temporary directory with a job of one input file, `[periods]` and
    `[plugin_config]` holding the TOML text given. Each `send` appends its
    lines to the input and runs the job again (its state kept: a later
    send is a later run of the same job, which closes, at its end, every
    period the watermark passed) and returns the records and dead letters
    that run added. The `tally` is `$TALLY_BIN`, else `tally` on PATH. A
    build or run that fails raises `RuntimeError` with its stderr. `close()`
    (or leaving the `with`) removes the temporary directory.
    """

    def __init__(self, project_dir, *, periods: str = "", plugin_config: str = ""):
        self.tally = tally_binary()
        self.project_dir = os.path.abspath(os.fspath(project_dir))
        self._temp = tempfile.TemporaryDirectory(prefix="tally-py-periods-run-")
        self.dir = self._temp.name
        self._read = {"periods.ndjson": 0, "dead-letters.ndjson": 0}
        self._closed = False
        try:
            self._tally("build", "plugin", "build", self.project_dir, "--out", os.path.join(self.dir, "plugin.wasm"))
            job = (
                'name = "test"\nplugin = "plugin.wasm"\noutputs = ["periods"]\n\n'
                '[local]\ninputs = ["events.ndjson"]\noutput_dir = "out"\nstate_dir = "state"\n\n'
                f"[periods]\n{periods}\n\n[plugin_config]\n{plugin_config}\n"
            )
            with open(os.path.join(self.dir, "job.toml"), "w", encoding="utf-8") as file:
                file.write(job)
            open(os.path.join(self.dir, "events.ndjson"), "wb").close()
        except BaseException:
            self.close()
            raise

    def send(self, lines) -> PeriodsSent:
        """Appends `lines` (str or bytes, one NDJSON line each, without its
        newline) to the input and runs the job; returns what this run added."""
        if self._closed:
            raise RuntimeError("this PeriodsRun is closed")
        data = bytearray()
        for line in lines:
            raw = line.encode() if isinstance(line, str) else bytes(line)
            if b"\n" in raw:
                raise ValueError(f"a line sent may not hold a line break: {raw!r}")
            data += raw + b"\n"
        with open(os.path.join(self.dir, "events.ndjson"), "ab") as file:
            file.write(data)
        self._tally("run", "run", "job.toml")
        records = [_period_record(line["value"]) for line in self._new_lines("periods.ndjson")]
        dead_letters = [DeadLetter(line["source"]["offset"], line["reason"]) for line in self._new_lines("dead-letters.ndjson")]
        return PeriodsSent(records, dead_letters)

    def close(self) -> None:
        """Removes the run's temporary directory (the build, job, input,
        outputs and state)."""
        self._closed = True
        self._temp.cleanup()

    def __enter__(self) -> "PeriodsRun":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _tally(self, what: str, *args: str) -> None:
        try:
            done = subprocess.run([self.tally, *args], cwd=self.dir, stdin=subprocess.DEVNULL, capture_output=True)
        except OSError as err:
            raise RuntimeError(f"could not start `{self.tally}`: {err}; {_TALLY_MISSING}") from None
        if done.returncode != 0:
            command = " ".join([self.tally, *args])
            stderr = done.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"`{command}` (the {what}, in {self.dir}) failed with exit status {done.returncode}:\n{stderr}")

    def _new_lines(self, name: str) -> list:
        path = os.path.join(self.dir, "out", name)
        if not os.path.exists(path):
            return []
        with open(path, "rb") as file:
            file.seek(self._read[name])
            data = file.read()
        end = data.rfind(b"\n") + 1
        self._read[name] += end
        return [tally.decode_json(line, lone_surrogates=True) for line in data[:end].splitlines() if line]


def _period_record(value: dict) -> PeriodRecord:
    return PeriodRecord(
        type=value["type"],
        customer=value.get("customer"),
        period=value["period"],
        start=value["start"],
        end=value["end"],
        value=value["value"],
        version=value["version"],
        previous=value.get("previous"),
        delta=value.get("delta"),
        fields=dict(value),
    )
