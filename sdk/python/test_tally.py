"""The SDK under pytest: its JSON codec must agree with Python's own json
where both are defined and refuse what serde_json refuses; aggregate, raw
and log must make the host calls a component makes."""

import json
import random

import pytest

from tally import JsonNumber, LogStream, Reject, aggregate, decode_json, duplicates, encode_json, log, raw, state
from tally.testing import DeadLetter, PluginTest

ALPHABET = ["a", "é", "☃", "𝄞", '"', "\\", "\n", "\u0001", "/", "\u2028", "\u007f"]


def random_value(rng, depth=0):
    string = lambda: "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(8)))  # noqa: E731
    kind = rng.randrange(4 if depth > 3 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randrange(-(10**30), 10**30)
    if kind == 2:
        return (rng.random() - 0.5) * 1e6
    if kind == 3:
        return string()
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {string(): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_decoding_agrees_with_json_loads_and_encoding_is_compact_utf8():
    rng = random.Random(7)
    for _ in range(2000):
        value = random_value(rng)
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        assert decode_json(text.encode()) == json.loads(text), text
        assert encode_json(json.loads(text)) == text


def test_encoding_matches_serde_json_escapes():
    assert encode_json({"k": "tab\t nl\n q\" bs\\ nul\x00 us\x1f del\x7f é 𝄞 \u2028"}) == '{"k":"tab\\t nl\\n q\\" bs\\\\ nul\\u0000 us\\u001f del\x7f é 𝄞 \u2028"}'
    assert encode_json([True, False, None, 2**64 - 1, -5, JsonNumber("1E400")]) == "[true,false,null,18446744073709551615,-5,1E400]"
    with pytest.raises(ValueError):
        encode_json(float("nan"))
    with pytest.raises(TypeError):
        encode_json({1: "a number as a name"})


def test_numbers_decode_exactly_or_as_written():
    assert decode_json(b"18446744073709551616") == 2**64
    assert decode_json(b"2.5") == 2.5
    number = decode_json(b'{"q":1E400}', numbers="raw")["q"]
    assert number == JsonNumber("1E400") and not number.is_integer()
    assert decode_json(b"-12", numbers="raw").is_integer()
    least = str(2**1024 - 2**970)  # the least number that rounds to infinity
    assert JsonNumber(str(2**1024 - 2**970 - 1)).is_finite() and JsonNumber("1.7976931348623157e308").is_finite()
    assert not JsonNumber(least).is_finite() and not JsonNumber(f"0.{least}e309").is_finite()


REFUSED = ["", " ", "{", "[1,]", '{"a":1,}', "01", "+1", "1.", ".5", "1e", "NaN", "Infinity", "-Infinity", "'a'", '"\\x"',
           '"\\ud800"', '["\\udc00"]', '{"\\ud800":1}', '"a\tb"', "[1] 2", "tru", "nul", "1e400", "[" * 129 + "]" * 129,
           "// c\n1", "\ufeff1", '{"a":' * 200 + "1" + "}" * 200]


@pytest.mark.parametrize("text", REFUSED)
def test_what_serde_json_refuses_is_refused(text):
    with pytest.raises(Reject, match="^event is not valid JSON$"):
        decode_json(text.encode("utf-8", "surrogatepass"))


def test_depth_and_surrogates_at_their_limits():
    assert len(decode_json((" [" * 128 + "]" * 128 + "\r\n\t").encode())) == 1
    assert decode_json(('["' + "[" * 300 + '"]').encode()) == ["[" * 300]
    assert decode_json(b'"\\ud800"', lone_surrogates=True) == "\ud800"
    assert decode_json(b'"\\ud834\\udd1e"') == "𝄞"


@pytest.mark.parametrize("data", [b"\xff", b"\x80", b"\xc0\x80", b"\xc2", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b'"\xe2\x82"'])
def test_utf8_is_decoded_as_strictly_as_rust(data):
    with pytest.raises(Reject, match="^event is not UTF-8$"):
        decode_json(data)


def test_duplicate_names_keep_the_last_value_and_are_listed():
    decoded = decode_json(b'{"a":1,"b":2,"a":3,"c":{"d":1,"d":2}}')
    assert decoded == {"a": 3, "b": 2, "c": {"d": 2}}
    assert duplicates(decoded) == {"a"} and duplicates(decoded["c"]) == {"d"} and duplicates({}) == frozenset()


def counter(**overrides):
    def apply(count, event):
        if event.get("n", 0) < 0:
            raise Reject("n must not be negative")
        if event.get("n") == 13:
            raise ValueError("a bug")
        return count + event.get("n", 1)

    spec = dict(output="counts", key=lambda event: event["key"], initial=lambda: 0, apply=apply, emit=lambda count: count)
    spec.update(overrides)
    return aggregate(**spec)


def test_aggregate_reads_once_writes_once_and_rejects_in_event_order():
    plugin = PluginTest(counter(), outputs=["counts"])
    sent = plugin.send(['{"key":"a","n":2}', '{"key":"b","n":-1}', "{", '{"key":"a","n":3}', '{"key":["x",1]}'])
    assert sent.dead_letters == [DeadLetter(1, "n must not be negative"), DeadLetter(2, "event is not valid JSON")]
    assert [(record.event, record.key, record.value) for record in sent.outputs] == [(0, '"a"', "2"), (3, '"a"', "5"), (4, '["x",1]', "1")]
    assert plugin.all_state() == [('"a"', "5"), ('["x",1]', "1")]


def test_a_bug_discards_the_batch_and_is_raised():
    plugin = PluginTest(counter(), outputs=["counts"])
    plugin.send(['{"key":"a","n":2}'])
    with pytest.raises(ValueError, match="a bug"):
        plugin.send(['{"key":"a","n":5}', '{"key":"a","n":13}'])
    assert plugin.state("a") == 2


def test_emitting_to_an_undeclared_output_is_an_error_naming_it():
    plugin = PluginTest(counter(output="elsewhere"), outputs=["counts"])
    with pytest.raises(RuntimeError, match="`elsewhere`, which the job does not declare"):
        plugin.send(['{"key":"a"}'])
    assert plugin.all_state() == []


def test_raw_and_log_reach_the_host():
    def process(events):
        log.info(f"{len(events)} events")
        state.put_many([(event.value, b"1") for event in events])
        return [(index, "odd") for index, event in enumerate(events) if event.offset % 2]

    plugin = PluginTest(raw(process), outputs=[])
    sent = plugin.send([b"x", b"y", b"z"])
    assert sent.dead_letters == [DeadLetter(1, "odd")]
    assert plugin.logs == [("info", "3 events")]
    assert plugin.all_state() == [("x", "1"), ("y", "1"), ("z", "1")]


def test_a_log_stream_writes_whole_lines_to_the_host_log():
    from wit_world.imports.types import Level

    def process(events):
        stream = LogStream(Level.INFO)
        print("hello", "world", file=stream)
        stream.write("part")
        stream.write("ial\nand the rest")
        stream.flush()
        return []

    plugin = PluginTest(raw(process), outputs=[])
    plugin.send([b"x"])
    assert plugin.logs == [("info", "hello world"), ("info", "partial"), ("info", "and the rest")]
