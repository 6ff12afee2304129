"""tally.periods under pytest: the plumbing of the period contract
(tally:plugin@0.2.0) as sdk/rust/src/periods.rs and bindings.rs do it (a
batch described in one call, additions folded in order, the first refusal
and its index, the same words), JSON written as serde_json writes it, and
`tally` importable in either world."""

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tally import Reject, log
from tally.periods import ConfigError, Facts, Instant, PeriodPlugin, Refused, encode, export, float_json
from tally.testing import Described, DeadLetter, Folded, PeriodsTest, instant

HERE = Path(__file__).resolve().parent


class Counter(PeriodPlugin):
    """Per customer: a count of events and the sum of their `n` (its addend);
    `n` 13 is a bug, a sum past `limit` is refused."""

    def __init__(self, config: dict) -> None:
        if not isinstance(config.get("limit", 0), int):
            raise ConfigError("limit must be an integer")
        self.limit = config.get("limit", 1 << 64)
        self.calls = 0

    def describe(self, event) -> Facts:
        if not isinstance(event, dict) or not isinstance(event.get("customer"), str):
            raise Reject("customer must be a string")
        if event.get("n") == 13:
            raise KeyError("a bug")
        time = event.get("ts", event.get("ms"))
        if event.get("as") == "datetime":
            time = datetime.fromtimestamp(time / 1000, timezone(timedelta(hours=-5)))
        key = {"customer": event["customer"]} if event.get("as") == "dict" else [("customer", event["customer"])]
        return Facts(id=event.get("id", "x"), time=time, key=key, customer=event["customer"], addend=event.get("n", 1))

    def add(self, state, time: Instant, n):
        self.calls += 1
        state = state or {"count": 0, "sum": 0}
        if state["sum"] + n > self.limit:
            raise Reject(f"the sum would pass {self.limit}")
        state["count"] += 1  # in place: the SDK encodes it once, after the fold
        state["sum"] += n
        state["at"] = list(time)
        return state

    def value(self, state) -> int:
        return state["sum"]


def test_describe_answers_each_event_of_a_batch_in_one_call():
    plugin = PeriodsTest(Counter)
    described = plugin.describe([
        '{"customer":"acme","n":2,"ts":"2026-11-03T10:00:00Z","id":"e1"}',
        '{"customer":7}',
        b"{\xff}",
        "{",
        '{"customer":"glob\\u00e9x","ms":1793700000000,"as":"dict"}',
        '{"customer":"acme","ms":1793700000000,"as":"datetime","n":1.5e300}',
        '{"customer":"acme","n":"\\ud800"}',
    ])
    assert described == [
        Described("e1", "2026-11-03T10:00:00Z", [("customer", "acme")], "acme", "2"),
        "customer must be a string",
        "event is not UTF-8",
        "event is not valid JSON",
        Described("x", 1793700000000, [("customer", "globéx")], "globéx", "1"),
        Described("x", "2026-11-03T05:00:00-05:00", [("customer", "acme")], "acme", "1.5e+300"),
        "event is not valid JSON",
    ]


def test_an_exception_other_than_reject_is_a_bug_and_traps():
    plugin = PeriodsTest(Counter)
    with pytest.raises(KeyError, match="a bug"):
        plugin.describe(['{"customer":"a","n":13}'])


def test_an_addend_that_does_not_encode_dead_letters_its_event():
    class Bad(Counter):
        def describe(self, event):
            facts = super().describe(event)
            facts.addend = float("nan") if event.get("nan") else {1, 2}
            return facts

    plugin = PeriodsTest(Bad)
    assert plugin.describe(['{"customer":"a","ts":"t","nan":true}', '{"customer":"a","ts":"t"}']) == [
        "its addend does not encode: Out of range float values are not JSON compliant",
        "its addend does not encode: Object of type set is not JSON serializable",
    ]


def test_add_folds_in_order_decodes_and_encodes_each_state_once():
    plugin = PeriodsTest(Counter)
    states = plugin.add(
        [None, '{"count":1,"sum":10,"at":[0,0]}'],
        ["5", "7", "1"],
        [(1, Instant(5, 1), 0), (0, "2026-11-03T10:00:00.5Z", 2), (1, 1793700000123, 1), (0, Instant(9), 2)],
    )
    assert states == ['{"count":2,"sum":2,"at":[9,0]}', '{"count":3,"sum":22,"at":[1793700000,123000000]}']
    assert plugin.value(states[1]) == 22


@pytest.mark.parametrize(
    "states, addends, additions, index, reason",
    [
        ([None], ["1"], [(0, Instant(1), 0), (0, Instant(1), 1)], 1, "the addition names addend 1, of 1"),
        ([None], ["1"], [(0, Instant(1), 0), (1, Instant(1), 0)], 1, "the addition names period 1, of 1"),
        (['{"count":1,"sum":0,"at":[0,0]}', "{"], ["1"], [(0, Instant(1), 0)], 0, "a period's state does not decode: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ([None], ["1", "x"], [(0, Instant(1), 0), (0, Instant(1), 1)], 1, "the event's addend is not the JSON this plugin makes: Expecting value: line 1 column 1 (char 0)"),
        ([None, None], ["1"], [(0, Instant(1), 0)], 0, "period 1 has neither a state nor an addition"),
        ([None], ["9", "2"], [(0, Instant(1), 0), (0, Instant(1), 1)], 1, "the sum would pass 10"),
    ],
)
def test_add_refuses_the_first_addition_it_cannot_fold_in_the_rust_sdks_words(states, addends, additions, index, reason):
    plugin = PeriodsTest(Counter, {"limit": 10})
    with pytest.raises(Refused) as refused:
        plugin.add(states, addends, additions)
    assert (refused.value.addition, str(refused.value)) == (index, reason)


def test_send_plays_the_host_refusing_one_event_and_folding_the_rest():
    plugin = PeriodsTest(Counter, {"limit": 10})
    sent = plugin.send([
        '{"customer":"a","n":4,"ts":"2026-11-03T10:00:00Z"}',
        '{"customer":"b","n":3,"ts":"2026-11-03T10:00:00Z"}',
        '{"customer":"a","n":7,"ts":"2026-11-03T10:00:01Z"}',  # 4 + 7 > 10
        '{"customer":"a","n":6,"ts":"2026-11-03T10:00:02Z"}',
        '{"customer":"a","ts":"2026-02-30T10:00:00Z"}',
        "[]",
    ])
    assert sent == Folded(
        [
            DeadLetter(2, "refused: the sum would pass 10"),
            DeadLetter(4, "malformed: event time '2026-02-30T10:00:00Z' is not an RFC 3339 instant with an offset"),
            DeadLetter(5, "malformed: customer must be a string"),
        ],
        {("a",): 10, ("b",): 3},
    )
    assert plugin.state("a") == '{"count":2,"sum":10,"at":[1793700002,0]}'
    assert plugin.send(['{"customer":"b","n":1,"ts":"2026-11-03T10:00:00+01:00"}']).values == {("b",): 4}


def test_configure_decodes_the_plugin_config_and_refuses_with_the_plugins_message():
    with pytest.raises(ConfigError, match="^limit must be an integer$"):
        PeriodsTest(Counter, {"limit": "ten"})
    with pytest.raises(ConfigError, match=r"^\[plugin_config\] does not fit this plugin: Expecting property name"):
        PeriodsTest(Counter, "{not json")
    config, periods = export(Counter)
    with pytest.raises(RuntimeError, match="configures a period plugin before calling it"):
        periods().value(b"{}")
    config().configure('{"limit": 10}')
    config().configure('{"limit": 99}')  # a second configuration changes nothing
    assert periods().value(b'{"sum":10}') == 10


def test_a_value_must_be_a_u64():
    class Negative(Counter):
        def value(self, state):
            return -1

    with pytest.raises(ValueError, match="from 0 to 2\\^64 - 1, not -1"):
        PeriodsTest(Negative).value('{"sum":1}')


def test_floats_are_written_as_serde_json_writes_them():
    # serde_json 1.0.154 writes floats with zmij: these are its own tests' values.
    cases = {
        6.62607015e-34: "6.62607015e-34", 5.444310685350916e14: "544431068535091.6", 5e-324: "5e-324",
        2.2250738585072004e-308: "2.2250738585072004e-308", 1.0: "1.0", 0.0: "0.0",
        3.439070283483335e35: "3.439070283483335e+35", 2.9802322387695312e-08: "2.9802322387695312e-8",
        5.960464477539062e-07: "5.960464477539062e-7", 43210.0: "43210.0", 1.7976931348623157e308: "1.7976931348623157e+308",
        1e15: "1000000000000000.0", 1e16: "1e+16", 1e-5: "0.00001", 1.234e-5: "0.00001234", 1e-6: "1e-6", 0.0001: "0.0001",
    }
    for number, text in cases.items():
        assert float_json(number) == text
    assert float_json(-0.0) == "-0.0" and float_json(-1.234e-5) == "-0.00001234"
    assert encode({"x": [1e-7, "1e-07", 2**64 - 1], "é\n": 1e-5, 3: None}) == '{"x":[1e-7,"1e-07",18446744073709551615],"é\\n":0.00001,"3":null}'.encode()
    assert encode("tab\t nul\x00 del\x7f 𝄞 \u2028 \"\\") == '"tab\\t nul\\u0000 del\x7f 𝄞 \u2028 \\"\\\\"'.encode()
    with pytest.raises(ValueError):
        encode([float("inf")])


def test_the_test_driver_reads_event_times_as_the_host_does():
    assert instant("2026-11-03T10:00:00Z") == Instant(1793700000, 0)
    assert instant("2026-11-03T05:00:00.123456789-05:00") == Instant(1793700000, 123456789)
    assert instant(-1) == Instant(-1, 999000000)
    with pytest.raises(ValueError):
        instant("2026-11-03 10:00")


def test_logging_works_from_a_period_plugin():
    class Logs(Counter):
        def describe(self, event):
            log.info(f"describing {event['customer']}")
            return super().describe(event)

    from tally.testing import _Host
    import tally.testing as testing

    testing._current = host = _Host([])
    try:
        PeriodsTest(Logs).describe(['{"customer":"a","ts":"t"}'])
    finally:
        testing._current = None
    assert host.logs == [("info", "describing a")]


@pytest.mark.parametrize("world, bindings", [("periods-plugin", "bindings-periods"), ("plugin", "bindings")])
def test_tally_imports_inside_a_component_of_either_world(world, bindings):
    # Inside a component sys.platform is "wasi" and componentize-py's own
    # bindings of the world are `wit_world`: the checked-in ones stand in.
    # (There `print` goes to the host log: stdout is put back to read it.)
    script = f"""
import sys
sys.platform = "wasi"
sys.path[:0] = [{str(HERE / bindings)!r}, {str(HERE)!r}]
import tally
sys.stdout = sys.__stdout__
print(tally.state is None, tally.output is None, tally.LogStream.__name__)
try:
    import tally.periods
    print("periods", tally.periods.Facts.__name__)
except ImportError as err:
    print(err)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    expected = ["True True LogStream", "periods Facts"] if world == "periods-plugin" else [
        "False False LogStream", 'tally.periods is for period plugins: build with [tool.tally] world = "periods-plugin"']
    assert run.stdout.splitlines() == expected
