"""The period billing plugin under pytest, through the exports its component
has (tally.testing.PeriodsTest): docs/billing.md's "The period billing
plugin", row by row, with the bytes plugins/billing-periods (Rust) makes;
and, at the end, built and run by the real host (tally.testing.PeriodsRun),
its FINAL and ADJUSTMENT records as the host emits them."""

import json
from pathlib import Path

import pytest

import billing
from tally.periods import ConfigError, Instant, Refused
from tally.testing import DeadLetter, Described, PeriodRecord, PeriodsRun, PeriodsTest

METERS = {"calls": "sum", "requests": "count", "peak": "max", "gb": "latest", "seats": {"unique_count": "user"}}
MAX = 2**64 - 1
TS = "2026-11-01T00:00:00Z"


def plugin(meters=None) -> PeriodsTest:
    return PeriodsTest(billing.Billing, {"meters": METERS if meters is None else meters})


def event(metric, quantity="1", extra="", customer="acme"):
    return f'{{"id":"x","customer":"{customer}","metric":"{metric}","quantity":{quantity},"ts":"{TS}"{extra}}}'


def reason(record, meters=None) -> str:
    (described,) = plugin(meters).describe([record])
    assert isinstance(described, str), described
    return described


# Every row of "Which events are refused", in the table's order, with the
# Rust build's own cases (plugins/billing-periods/src/lib.rs).
REFUSED = [
    (b'{"id":"x\xff"}', "event is not UTF-8"),
    (b'{"id":"x\xed\xa0\x80","customer":"a"}', "event is not UTF-8"),
    (b'{"id":"x",}', "event is not valid JSON"),
    (b'{"id":"x"} {}', "event is not valid JSON"),
    (b"[" * 129 + b"]" * 129, "event is not valid JSON"),
    (b'{"id":"x","deep":' + b"[" * 128 + b"]" * 128 + b"}", "event is not valid JSON"),
    (b"1e400", "event is not valid JSON"),
    (b"-" + b"1" * 400, "event is not valid JSON"),
    (b'{"id":NaN}', "event is not valid JSON"),
    (b'"\\ud800"', "event is not valid JSON"),
    (b'{"\\udc00":1,"id":"x","id":"y"}', "event is not valid JSON"),
    (b"", "event is not valid JSON"),
    (b"[1]", "event must be a JSON object"),
    (b'["\\ud800"]', "event must be a JSON object"),
    (b'"text"', "event must be a JSON object"),
    (b"-0", "event must be a JSON object"),
    (b"18446744073709551616", "event must be a JSON object"),
    (b"null", "event must be a JSON object"),
    (b'{"id":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}', "field `id` is given twice"),
    (b'{"customer":"a","metric":"calls","quantity":1,"ts":"t","customer":"b"}', "field `id` is missing"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":1,"quantity":2,"ts":"t"}', "field `quantity` is given twice"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":1}', "field `ts` is missing"),
    (b'{"id":"x","metric":"calls","ts":5,"ts":6}', "field `customer` is missing"),
    (b'{"id":7,"customer":"a","metric":"calls","quantity":1,"ts":"t"}', "field `id` must be a string"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":5}', "field `ts` must be a string"),
    (b'{"id":"x","customer":"a","metric":["calls"],"quantity":1,"ts":5}', "field `metric` must be a string"),
    (b'{"id":"x","customer":"\\ud800","metric":"calls","quantity":1,"ts":"t"}', "event is not valid JSON"),
    (b'{"id":"x","customer":"\\ud800","metric":7,"ts":"t"}', "event is not valid JSON"),
    (b'{"id":"x","customer":"a","metric":"calls","ts":"\\udc00"}', "event is not valid JSON"),
    (b'{"id":"x","customer":"a","metric":"disk\\n","quantity":1,"ts":"t"}',
     'metric "disk\\n" has no meter; name it in the job\'s [plugin_config] meters (it has: calls, gb, peak, requests, seats)'),
    (b'{"id":"x","customer":"a","metric":"\\u00e9\\"\\\\\\u0001\\/","ts":"t"}',
     'metric "é\\"\\\\\\u0001/" has no meter; name it in the job\'s [plugin_config] meters (it has: calls, gb, peak, requests, seats)'),
    (b'{"id":"x","customer":"a","metric":"calls","ts":"t"}', "field `quantity` is missing"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":-3,"ts":"t"}', "quantity must be a non-negative integer, got -3"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":-0,"ts":"t"}', "quantity must be a non-negative integer, got -0"),
    (b'{"id":"x","customer":"a","metric":"peak","quantity":1.5e0,"ts":"t"}', "quantity must be a non-negative integer, got 1.5e0"),
    (b'{"id":"x","customer":"a","metric":"peak","quantity":1E400,"ts":"t"}', "quantity must be a non-negative integer, got 1E400"),
    (b'{"id":"x","customer":"a","metric":"gb","quantity":"5","ts":"t"}', 'quantity must be a non-negative integer, got "5"'),
    (b'{"id":"x","customer":"a","metric":"gb","quantity" : "\\u0035\\ud800" ,"ts":"t"}', 'quantity must be a non-negative integer, got "\\u0035\\ud800"'),
    (b'{"id":"x","customer":"a","metric":"gb","quantity":{ "a" :[ true ]},"ts":"t"}', 'quantity must be a non-negative integer, got { "a" :[ true ]}'),
    (b'{"id":"x","customer":"a","metric":"gb","quantity":null,"ts":"t"}', "quantity must be a non-negative integer, got null"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":18446744073709551616,"ts":"t"}',
     "quantity 18446744073709551616 is over the largest meterable, 2^64 - 1"),
    (b'{"id":"x","customer":"a","metric":"calls","quantity":' + b"9" * 5000 + b',"ts":"t"}',
     f"quantity {'9' * 5000} is over the largest meterable, 2^64 - 1"),
    (b'{"id":"x","customer":"a","metric":"seats","ts":"t"}', 'field "user" (counted by unique_count) is missing'),
    (b'{"id":"x","customer":"a","metric":"seats","ts":"t","user":[ 3 ]}', 'field "user" must be a string for its unique_count meter, got [ 3 ]'),
    (b'{"id":"x","customer":"a","metric":"seats","ts":"t","user":"a","user":12.50}', 'field "user" must be a string for its unique_count meter, got 12.50'),
    (b'{"id":"x","customer":"a","metric":"seats","ts":"t","user":"\\udc00"}', "event is not valid JSON"),
]


@pytest.mark.parametrize("record, expected", REFUSED, ids=range(len(REFUSED)))
def test_each_refusal_of_describe_gets_its_reason_word_for_word(record, expected):
    assert reason(record) == expected


def test_a_unique_count_field_is_named_and_quoted_as_json():
    meters = {"odd": {"unique_count": 'us"er\n'}, "q": "unique_count:quantity", "ids": {"meter": "unique_count", "field": "id"}}
    assert reason(event("odd"), meters) == 'field "us\\"er\\n" (counted by unique_count) is missing'
    assert reason(event("q", "12"), meters) == 'field "quantity" must be a string for its unique_count meter, got 12'
    assert plugin(meters).describe([event("q", '"12"')])[0].addend == '{"unique":"12"}'
    assert plugin(meters).describe([event("ids")])[0].addend == '{"unique":"x"}'


def test_a_count_meter_reads_no_quantity_and_other_fields_may_hold_anything():
    described = plugin().describe([
        '{"id":"x","customer":"a","metric":"requests","ts":"t"}',
        '{"id":"x","customer":"a","metric":"requests","ts":"t","quantity":"many","note":"\\ud800","q":{"\\udc00":[1e400]}}',
        '{"id":"x","customer":"a","metric":"requests","ts":"t","quantity":-1.5e3,"metric2":1,"x":2,"x":3}',
    ])
    assert [facts.addend for facts in described] == ['"count"'] * 3


def test_facts_are_the_id_ts_key_and_customer():
    (facts,) = plugin().describe(['{"ts":"2026-11-03T10:00:00-05:00","metric":"calls","customer":"Zo\\u00eb","quantity":3,"id":"e\\/1","extra":1}'])
    assert facts == Described("e/1", "2026-11-03T10:00:00-05:00", [("customer", "Zoë"), ("metric", "calls")], "Zoë", '{"sum":3}')


def test_each_meter_has_the_addend_state_and_value_of_the_table():
    test = plugin()
    cases = [
        ("calls", "7", '{"sum":7}', '{"sum":7}', 7),
        ("requests", "7", '"count"', '{"count":1}', 1),
        ("peak", "7", '{"max":7}', '{"max":7}', 7),
        ("gb", "7", '{"latest":7}', '{"latest":{"seconds":1793700000,"nanoseconds":5,"value":7}}', 7),
        ("seats", "7", '{"unique":"Zoë \\"the\\" one"}', '{"unique":["Zoë \\"the\\" one"]}', 1),
    ]
    for metric, quantity, addend, state, value in cases:
        (facts,) = test.describe([event(metric, quantity, ',"user":"Zo\\u00eb \\"the\\" one"')])
        assert facts.addend == addend
        (folded,) = test.add([None], [facts.addend], [(0, Instant(1793700000, 5), 0)])
        assert (folded, test.value(folded)) == (state, value)


def test_values_reach_2_to_the_64_minus_1_and_a_sum_past_it_is_refused():
    test = plugin()
    quantities = [str(MAX), str(MAX - 1), "0"]
    addends = [facts.addend for facts in test.describe([event("calls", q) for q in quantities])]
    assert addends == ['{"sum":18446744073709551615}', '{"sum":18446744073709551614}', '{"sum":0}']
    assert test.add([None], addends[1:], [(0, TS, 0), (0, TS, 1)]) == ['{"sum":18446744073709551614}']
    assert test.add(['{"sum":18446744073709551614}'], ['{"sum":1}'], [(0, TS, 0)]) == ['{"sum":18446744073709551615}']
    with pytest.raises(Refused) as refused:
        test.add([None, '{"sum":18446744073709551615}'], ['{"sum":0}', '{"sum":1}'], [(0, TS, 0), (1, TS, 0), (1, TS, 1)])
    assert (refused.value.addition, str(refused.value)) == (2, "the period's sum would pass 2^64 - 1, the largest meterable")
    assert test.add(['{"max":5}'], ['{"max":18446744073709551615}', '{"max":3}'], [(0, TS, 0), (0, TS, 1)]) == ['{"max":18446744073709551615}']
    assert test.value('{"latest":{"seconds":-5,"nanoseconds":0,"value":18446744073709551615}}') == MAX


def test_count_stops_at_2_to_the_64_minus_1():
    test = plugin()
    assert test.add(['{"count":18446744073709551614}'], ['"count"'], [(0, TS, 0), (0, TS, 0)]) == ['{"count":18446744073709551615}']


def test_latest_keeps_the_greatest_event_time_and_of_a_tie_the_first_added():
    test = plugin()
    addends = ['{"latest":7}', '{"latest":3}', '{"latest":9}', '{"latest":11}']
    times = [Instant(100, 5), Instant(100, 5), Instant(99, 999999999), Instant(100, 6)]
    for count, value in [(1, 7), (2, 7), (3, 7), (4, 11)]:
        (state,) = test.add([None], addends[:count], [(0, time, index) for index, time in enumerate(times[:count])])
        assert test.value(state) == value
    assert state == '{"latest":{"seconds":100,"nanoseconds":6,"value":11}}'
    # The same instant written in two offsets is a tie, read by the host alike.
    assert test.add([None], addends, [(0, "2026-10-20T10:00:00Z", 0), (0, "2026-10-20T06:00:00-04:00", 1)]) == [
        '{"latest":{"seconds":1792490400,"nanoseconds":0,"value":7}}'
    ]


def test_unique_count_keeps_each_value_once_ordered_by_utf8_bytes_and_written_as_serde_json_writes_it():
    test = plugin()
    # As written in the records (JSON string contents).
    users = ["Zoë", r"Zo\u00eb", "zoe", r'\u0000nul\t\"q\"\\ \u001f\u007f' + "\u2028", "𝄞", r"\ud834\udd1e", "\uffff", "\ue000é", "", r"a\/b"]
    described = test.describe([event("seats", extra=f',"user":"{user}"') for user in users])
    addends = [facts.addend for facts in described]
    assert addends[3] == '{"unique":"\\u0000nul\\t\\"q\\"\\\\ \\u001f\x7f\u2028"}'
    assert addends[5] == '{"unique":"𝄞"}' and addends[9] == '{"unique":"a/b"}'
    (state,) = test.add([None], addends, [(0, TS, index) for index in range(len(addends))])
    assert state == '{"unique":["","\\u0000nul\\t\\"q\\"\\\\ \\u001f\x7f\u2028","Zoë","a/b","zoe","\ue000é","\uffff","𝄞"]}'
    assert test.value(state) == 8
    # Of a field other than the five written twice, the last.
    assert test.describe([event("seats", extra=',"user":"a","user":"b"')])[0].addend == '{"unique":"b"}'
    # A state another build wrote out of order is read as the set it is.
    assert test.add(['{"unique":["b","a","b"]}'], ['{"unique":"c"}'], [(0, TS, 0)]) == ['{"unique":["a","b","c"]}']


def test_a_meter_changed_while_a_period_is_open_is_refused_and_changes_nothing():
    test = plugin()
    meters = [("calls", '{"sum":1}'), ("requests", '"count"'), ("peak", '{"max":1}'), ("gb", '{"latest":1}'), ("seats", '{"unique":"u"}')]
    states = {"sum": '{"sum":1}', "count": '{"count":1}', "max": '{"max":1}', "latest": '{"latest":{"seconds":1,"nanoseconds":0,"value":1}}', "unique_count": '{"unique":["u"]}'}
    names = {"calls": "sum", "requests": "count", "peak": "max", "gb": "latest", "seats": "unique_count"}
    for metric, addend in meters:
        for opened, state in states.items():
            if opened == names[metric]:
                continue
            with pytest.raises(Refused) as refused:
                test.add([state], ['{"sum":1}', addend], [(0, TS, 1)])
            assert str(refused.value) == (
                f"the event's metric is metered by {names[metric]} but its period was opened by {opened}: "
                "a metric's meter changed while its period was open; keep a metric's meter for its periods"
            )


def test_add_refuses_addends_and_states_it_did_not_make_in_the_rust_sdks_words():
    test = plugin()
    with pytest.raises(Refused, match="^the event's addend is not the JSON this plugin makes: "):
        test.add([None], ['{"sum":-1}'], [(0, TS, 0)])
    with pytest.raises(Refused, match="^a period's state does not decode: "):
        test.add(['{"sum":1,"max":2}'], ['{"sum":1}'], [(0, TS, 0)])


def test_send_folds_a_batch_and_dead_letters_as_the_host_does():
    test = plugin()
    sent = test.send([event("calls", "5"), event("calls", str(MAX)), event("seats", extra=',"user":"x"'), event("calls", "-1"), event("calls", "2")])
    assert sent.dead_letters == [
        DeadLetter(1, "refused: the period's sum would pass 2^64 - 1, the largest meterable"),
        DeadLetter(3, "malformed: quantity must be a non-negative integer, got -1"),
    ]
    assert sent.values == {("acme", "calls"): 7, ("acme", "seats"): 1}


def test_the_three_ways_to_write_a_unique_count_meter_and_the_others():
    test = PeriodsTest(billing.Billing, {"meters": {
        "a": "unique_count:user", "b": {"meter": "unique_count", "field": "user"}, "c": {"unique_count": "user", "other": 1},
        "d": {"meter": "sum"}, "e": "unique_count:a:b", "f": {"unique_count": 5, "meter": "count"}, "g": "latest",
    }})
    described = test.describe([event(metric, extra=',"user":"u","a:b":"v"') for metric in "abcdefg"])
    assert [facts.addend for facts in described] == [
        '{"unique":"u"}', '{"unique":"u"}', '{"unique":"u"}', '{"sum":1}', '{"unique":"v"}', '"count"', '{"latest":1}'
    ]


HINT = 'write meters = { calls = "sum", seats = { unique_count = "user" } }: '
THE_METERS = ': the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }'
NAME_IT = ': unique_count counts the values of a field; name it: { unique_count = "user" }'

# Each as the Rust build refuses it (checked against it through `tally run`).
CONFIG_ERRORS = [
    ({"meters": {"calls": "avg"}}, 'meters.calls = "avg"' + THE_METERS),
    ({"meters": {"calls": "sum:x", "a": "max"}}, 'meters.calls = "sum"' + THE_METERS),
    ({"meters": {"calls": ""}}, 'meters.calls = ""' + THE_METERS),
    ({"meters": {"tab\tq\"é\u0301\u200b": "x\ny\u00ad"}}, 'meters.tab\tq"é\u0301\u200b = "x\\ny\\u{ad}"' + THE_METERS),
    ({"meters": {"seats": "unique_count"}}, "meters.seats" + NAME_IT),
    ({"meters": {"seats": "unique_count:"}}, "meters.seats" + NAME_IT),
    ({"meters": {"seats": {"meter": "unique_count"}}}, "meters.seats" + NAME_IT),
    ({"meters": {"seats": {"meter": "unique_count", "field": ""}}}, "meters.seats" + NAME_IT),
    ({"meters": {"b": "avg", "a": "nope", "c": 5}}, HINT + "data did not match any variant of untagged enum MeterSpec"),
    ({"meters": {"seats": {"unique_count": 5}}}, HINT + "data did not match any variant of untagged enum MeterSpec"),
    ({"meters": {"seats": ["unique_count", "user"]}}, HINT + "data did not match any variant of untagged enum MeterSpec"),
    ({"meters": {"seats": {"meter": "sum", "field": 5}}}, HINT + "data did not match any variant of untagged enum MeterSpec"),
    ({"meters": {"calls": 1.5}}, HINT + "data did not match any variant of untagged enum MeterSpec"),
    ({"meters": {}}, "meters is empty: name at least one metric's meter"),
    ({"meters": "sum"}, HINT + 'invalid type: string "sum", expected a map'),
    ({"meters": [1, 2]}, HINT + "invalid type: sequence, expected a map"),
    ({"meters": 5, "zzz": 1}, HINT + "invalid type: integer `5`, expected a map"),
    ({"meters": 5, "aaa": 1}, HINT + "unknown field `aaa`, expected `meters`"),
    ({"meters": 2.5e20}, HINT + "invalid type: floating point `2.5e+20`, expected a map"),
    ({"meters": None}, HINT + "invalid type: null, expected a map"),
    ({}, HINT + "missing field `meters`"),
    ("[]", HINT + "invalid length 0, expected struct Config with 1 element"),
    ('"x"', HINT + 'invalid type: string "x", expected struct Config'),
]


@pytest.mark.parametrize("config, message", CONFIG_ERRORS, ids=range(len(CONFIG_ERRORS)))
def test_a_config_it_cannot_meter_by_is_refused_with_the_rust_builds_message(config, message):
    with pytest.raises(ConfigError) as refused:
        PeriodsTest(billing.Billing, config if isinstance(config, str) else json.dumps(config))
    assert str(refused.value) == message


# ---- Through the real host (`tally plugin build`, then `tally run`) ---------


def usage(id, customer, quantity, ts):
    return json.dumps({"id": id, "customer": customer, "metric": "calls", "quantity": quantity, "ts": ts})


def test_the_host_closes_each_customers_month_in_its_zone_then_adjusts_it():
    periods = 'time_zones = { acme = "America/New_York", globex = "Australia/Lord_Howe" }'
    with PeriodsRun(Path(__file__).parent, periods=periods, plugin_config='meters = { calls = "sum" }') as run:
        sent = run.send([
            usage("a1", "acme", 5, "2026-11-01T04:00:00Z"),  # New York's first instant of November
            usage("a0", "acme", 100, "2026-11-01T03:59:59Z"),  # still October there
            usage("g1", "globex", 3, "2026-10-31T12:59:59Z"),  # Lord Howe's last instant of October
            usage("a2", "acme", 7, "2026-12-01T04:59:59Z"),  # 23:59:59 on 30 November in New York
        ])
        # The watermark (30 November, 23:59:59 in New York) is past October's end
        # plus the grace (24h) in either zone, not yet past November's.
        assert sent.records == [
            PeriodRecord("final", "globex", "2026-10", "2026-09-30T13:30:00Z", "2026-10-31T13:00:00Z", 3, 1, None, None, sent.records[0].fields),
            PeriodRecord("final", "acme", "2026-10", "2026-10-01T04:00:00Z", "2026-11-01T04:00:00Z", 100, 1, None, None, sent.records[1].fields),
        ]
        assert sent.dead_letters == []

        sent = run.send([usage("a3", "acme", 1, "2026-12-02T05:00:00Z"), '{"id":"a4",'])
        (final,) = sent.records
        assert final == PeriodRecord("final", "acme", "2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", 12, 1, None, None, final.fields)
        assert final.fields == {
            "type": "final",
            "customer": "acme",
            "metric": "calls",
            "period": "2026-11",
            "time_zone": "America/New_York",
            "start": "2026-11-01T04:00:00Z",
            "end": "2026-12-01T05:00:00Z",
            "value": 12,
            "version": 1,
            "tzdata": final.fields["tzdata"],
        }
        assert sent.dead_letters == [DeadLetter(5, "malformed: event is not valid JSON")]

        sent = run.send([usage("a5", "acme", MAX - 12, "2026-11-15T00:00:00Z"), usage("a1", "acme", 5, "2026-11-01T04:00:00Z")])
        assert sent.records == [
            PeriodRecord("adjustment", "acme", "2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", MAX, 2, 12, MAX - 12, sent.records[0].fields)
        ]
        assert sent.dead_letters == [DeadLetter(7, 'duplicate: event id "a1" was counted already')]
