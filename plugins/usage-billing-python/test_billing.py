"""The billing plugin under pytest, through Tally's Python test driver: the
rules of docs/billing.md."""

import json

import billing
from tally.testing import DeadLetter, PluginTest


def usage(customer, quantity, ts):
    return f'{{"customer":"{customer}","metric":"api_calls","quantity":{quantity},"ts":"{ts}"}}'


def key(customer, period):
    return {"customer": customer, "metric": "api_calls", "period": period}


def test_every_update_emits_the_running_total_of_its_key_by_utc_month():
    plugin = PluginTest(billing.Aggregator, outputs=["totals"])
    sent = plugin.send([
        usage("acme", 3, "2026-11-03T10:00:00Z"),
        usage("acme", 4, "2026-12-01T00:30:00+01:00"),  # still November in UTC
        usage("acme", 5, "2026-12-01T00:30:00Z"),
    ])
    assert sent.dead_letters == []
    assert [record.value for record in sent.outputs] == ["3", "7", "5"]
    assert sent.outputs[1].key == json.dumps(key("acme", "2026-11"), separators=(",", ":"))
    assert plugin.state(key("acme", "2026-11")) == 7
    assert plugin.state(key("acme", "2026-12")) == 5


def test_bad_events_are_refused_with_the_reasons_of_docs_billing_md_and_change_nothing():
    plugin = PluginTest(billing.Aggregator, outputs=["totals"])
    sent = plugin.send([
        usage("acme", 2, "2026-11-03T10:00:00Z"),
        '{"customer":"acme"',
        '{"metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}',
        usage("acme", -3, "2026-11-03T10:00:00Z"),
        usage("acme", 2.5, "2026-11-03T10:00:00Z"),
        usage("acme", 1, "2026-02-30T10:00:00Z"),
        usage("acme", 18446744073709551615, "2026-11-03T10:00:00Z"),
        b'{"customer":"\xff"}',
        '{"customer":"a","customer":"b","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}',
        "[" * 129 + "]" * 129,
    ])
    assert sent.dead_letters == [
        DeadLetter(1, "event is not valid JSON"),
        DeadLetter(2, "field `customer` is missing"),
        DeadLetter(3, "quantity must be a non-negative integer, got -3"),
        DeadLetter(4, "quantity must be a non-negative integer, got 2.5"),
        DeadLetter(5, 'ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got "2026-02-30T10:00:00Z"'),
        DeadLetter(6, "total would overflow adding 18446744073709551615"),
        DeadLetter(7, "event is not UTF-8"),
        DeadLetter(8, "field `customer` is given twice"),
        DeadLetter(9, "event is not valid JSON"),
    ]
    assert [record.value for record in sent.outputs] == ["2"]
    assert plugin.all_state() == [('{"customer":"acme","metric":"api_calls","period":"2026-11"}', "2")]


def test_state_carries_across_batches():
    plugin = PluginTest(billing.Aggregator, outputs=["totals"])
    plugin.send([usage("acme", 3, "2026-11-03T10:00:00Z")])
    sent = plugin.send([usage("acme", 4, "2026-11-04T10:00:00Z")])
    assert [(record.output, record.event, record.value) for record in sent.outputs] == [("totals", 0, "7")]
    assert sent.dead_letters == []
