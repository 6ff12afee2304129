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
"""

from dataclasses import dataclass

import tally  # noqa: F401  (puts the bindings on the path natively)
from wit_world.imports import log as host_log, output as host_output, state as host_state
from wit_world.imports.types import Event

from tally import encode_json


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
