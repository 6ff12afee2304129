// The TypeScript period billing plugin under node's test runner (`npm test`:
// tsc compiles it and this test to dist/, then `node --test dist/`), through
// Tally's test driver: docs/billing.md, "The period billing plugin", row by
// row, with the Rust build's bytes (plugins/billing-periods/src/lib.rs); and,
// at the end, built and run by the real host (PeriodsRun), its FINAL and
// ADJUSTMENT records as the host emits them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PeriodsRun, PeriodsTest, type PeriodRecord } from "tally/testing";

const PLUGIN = new URL("./billing.js", import.meta.url);
const CONFIG = { meters: { calls: "sum", requests: "count", peak: "max", gb: "latest", seats: { unique_count: "user" } } };
const load = (config: unknown = CONFIG) => PeriodsTest.load(PLUGIN, config);
const U64_MAX = "18446744073709551615";
const event = (metric: string, rest = ',"quantity":1') => `{"id":"x","customer":"acme","metric":"${metric}"${rest},"ts":"2026-11-01T00:00:00Z"}`;

test("every malformed event gets the reason docs/billing.md gives, in the order of its checks", async () => {
  const plugin = await load();
  const cases: Array<[string | Buffer, string]> = [
    [Buffer.from('{"id":"x\xff"}', "latin1"), "event is not UTF-8"],
    [Buffer.from([0xed, 0xa0, 0x80]), "event is not UTF-8"],
    ['{"id":"x",}', "event is not valid JSON"],
    ['{"id":"x"} {}', "event is not valid JSON"],
    ["", "event is not valid JSON"],
    ["\ufeff{}", "event is not valid JSON"],
    ['"\\ud800"', "event is not valid JSON"],
    ["1e400", "event is not valid JSON"],
    [(2n ** 1024n - 2n ** 970n).toString(), "event is not valid JSON"],
    [`{"a":${"[".repeat(128)}${"]".repeat(128)}}`, "event is not valid JSON"],
    ['{"id":"x","\\udc00":1}', "event is not valid JSON"],
    ["[1]", "event must be a JSON object"],
    ['"text"', "event must be a JSON object"],
    ["1e308", "event must be a JSON object"],
    ["null", "event must be a JSON object"],
    ['{"id":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}', "field `id` is given twice"],
    ['{"\\u0069d":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}', "field `id` is given twice"],
    ['{"customer":"a","metric":"calls","quantity":1,"ts":"t","customer":"b"}', "field `id` is missing"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":1,"quantity":2,"ts":"t"}', "field `quantity` is given twice"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":1}', "field `ts` is missing"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":1,"x":{"ts":"t"}}', "field `ts` is missing"],
    ['{"id":7,"customer":"a","metric":"calls","quantity":1,"ts":"t"}', "field `id` must be a string"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":5}', "field `ts` must be a string"],
    ['{"id":"x","customer":"\\ud800","metric":"calls","quantity":1,"ts":"t"}', "event is not valid JSON"],
    ['{"id":"\\ud800","customer":7,"metric":"calls","quantity":1,"ts":"t"}', "event is not valid JSON"],
    ['{"id":"x","customer":"a","metric":"disk\\n","quantity":1,"ts":"t"}', `metric "disk\\n" has no meter; name it in the job's [plugin_config] meters (it has: calls, gb, peak, requests, seats)`],
    ['{"id":"x","customer":"a","metric":"calls","ts":"t"}', "field `quantity` is missing"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":-3,"ts":"t"}', "quantity must be a non-negative integer, got -3"],
    ['{"id":"x","customer":"a","metric":"peak","quantity":1.5e0,"ts":"t"}', "quantity must be a non-negative integer, got 1.5e0"],
    ['{"id":"x","customer":"a","metric":"gb","quantity":"5","ts":"t"}', 'quantity must be a non-negative integer, got "5"'],
    ['{"id":"x","customer":"a","metric":"calls","quantity":[ 1 , 2 ],"ts":"t"}', "quantity must be a non-negative integer, got [ 1 , 2 ]"],
    ['{"id":"x","customer":"a","metric":"calls","quantity":18446744073709551616,"ts":"t"}', "quantity 18446744073709551616 is over the largest meterable, 2^64 - 1"],
    ['{"id":"x","customer":"a","metric":"seats","ts":"t"}', 'field "user" (counted by unique_count) is missing'],
    ['{"id":"x","customer":"a","metric":"seats","ts":"t","user":[ 3 ]}', 'field "user" must be a string for its unique_count meter, got [ 3 ]'],
    ['{"id":"x","customer":"a","metric":"seats","ts":"t","user":"a","user":-1.5E+3}', 'field "user" must be a string for its unique_count meter, got -1.5E+3'],
    ['{"id":"x","customer":"a","metric":"seats","ts":"t","user":"\\udc00"}', "event is not valid JSON"],
  ];
  const got = plugin.describe(cases.map(([record]) => record));
  cases.forEach(([record, reason], i) => assert.deepEqual(got[i], { error: reason }, String(record)));
});

test("what a record may hold besides: count reads no quantity, other fields anything", async () => {
  const plugin = await load();
  const [count, nested, deep] = plugin.describe([
    '{"id":"x","customer":"a","metric":"requests","ts":"t","note":"\\ud800","q":{}}',
    '{"id":"x","customer":"a","metric":"requests","quantity":"many","ts":"t","x":[1e999,{"\\ud800":-0.5e-400}]}',
    `{"id":"x","customer":"a","metric":"requests","ts":"t","x":${"[".repeat(127)}${"]".repeat(127)}}`,
  ]);
  assert.equal(count.addend, '"count"');
  assert.deepEqual(count.key, [["customer", "a"], ["metric", "requests"]]);
  assert.deepEqual(count.time, { rfc3339: "t" });
  assert.equal(nested.addend, '"count"');
  assert.equal(deep.addend, '"count"');
});

test("each meter's addend, state and value, byte for byte", async () => {
  const plugin = await load();
  const addends = plugin.describe([event("calls", ',"quantity":7'), event("requests"), event("peak", ',"quantity":3'), event("gb", ',"quantity":4'), event("seats", ',"user":"Zo\\u00eb \\"the\\" one"')]);
  assert.deepEqual(addends.map((facts) => facts.addend), ['{"sum":7}', '"count"', '{"max":3}', '{"latest":4}', '{"unique":"Zoë \\"the\\" one"}']);
  const states = addends.map((facts) => plugin.add([null], [facts.addend!], [{ time: { seconds: 1762000000, nanoseconds: 5 }, addend: 0 }]).states![0]);
  assert.deepEqual(states, [
    '{"sum":7}',
    '{"count":1}',
    '{"max":3}',
    '{"latest":{"seconds":1762000000,"nanoseconds":5,"value":4}}',
    '{"unique":["Zoë \\"the\\" one"]}',
  ]);
  assert.deepEqual(states.map((state) => plugin.value(state)), [7, 1, 3, 4, 1]);
});

test("a batch folds in order into several periods, and the first refusal names its addition", async () => {
  const plugin = await load();
  const folded = plugin.add([null, '{"max":5}'], ['{"sum":2}', '{"max":9}', '{"sum":3}'], [
    { period: 0, addend: 0 },
    { period: 1, addend: 1 },
    { period: 0, addend: 2 },
  ]);
  assert.deepEqual(folded, { states: ['{"sum":5}', '{"max":9}'] });
  const refused = plugin.add([`{"sum":${U64_MAX}}`, null], ['{"sum":0}', '{"sum":1}'], [
    { period: 1, addend: 1 },
    { period: 0, addend: 0 },
    { period: 0, addend: 1 },
  ]);
  assert.deepEqual(refused, { refusal: { addition: 2, reason: "the period's sum would pass 2^64 - 1, the largest meterable" } });
  assert.equal(plugin.add([null], ['{"sum":1}'], [{ period: 2, addend: 0 }]).refusal!.reason, "the addition names period 2, of 1");
  assert.equal(plugin.add([null], ['{"sum":1}'], [{ period: 0, addend: 1 }]).refusal!.reason, "the addition names addend 1, of 1");
  assert.equal(plugin.add([null, null], ['{"sum":1}'], [{ period: 0, addend: 0 }]).refusal!.reason, "period 1 has neither a state nor an addition");
  assert.match(plugin.add([null], ['{"sum":-1}'], [{ addend: 0 }]).refusal!.reason, /^the event's addend is not the JSON this plugin makes: /);
  assert.match(plugin.add(['{"sum":"x"}'], ['{"sum":1}'], [{ addend: 0 }]).refusal!.reason, /^a period's state does not decode: /);
});

test("a metric whose meter changed while its period was open is refused", async () => {
  const plugin = await load();
  for (const [state, addend, by, opened] of [
    ['{"count":3}', '{"sum":1}', "sum", "count"],
    ['{"unique":[]}', '"count"', "count", "unique_count"],
    ['{"sum":1}', '{"unique":"u"}', "unique_count", "sum"],
    ['{"latest":{"seconds":1,"nanoseconds":0,"value":1}}', '{"max":1}', "max", "latest"],
    ['{"max":1}', '{"latest":1}', "latest", "max"],
  ]) {
    assert.deepEqual(plugin.add([state], [addend], [{ addend: 0 }]).refusal, {
      addition: 0,
      reason: `the event's metric is metered by ${by} but its period was opened by ${opened}: a metric's meter changed while its period was open; keep a metric's meter for its periods`,
    });
  }
});

test("values up to 2^64 - 1 are exact; count saturates; sum refuses past it", async () => {
  const plugin = await load();
  const [max] = plugin.describe([event("calls", `,"quantity":${U64_MAX}`)]);
  assert.equal(max.addend, `{"sum":${U64_MAX}}`);
  const sum = plugin.add([null], ['{"sum":9007199254740993}', '{"sum":2}', '{"sum":0}'], [{ addend: 0 }, { addend: 1 }, { addend: 2 }]);
  assert.deepEqual(sum.states, ['{"sum":9007199254740995}']);
  assert.equal(plugin.value(`{"sum":${U64_MAX}}`), 2 ** 64); // the double the host saturates to 2^64 - 1
  assert.deepEqual(plugin.add([`{"count":${U64_MAX}}`], ['"count"'], [{ addend: 0 }]).states, [`{"count":${U64_MAX}}`]);
  assert.deepEqual(plugin.add([`{"max":${U64_MAX}}`], ['{"max":1}'], [{ addend: 0 }]).states, [`{"max":${U64_MAX}}`]);
  assert.deepEqual(plugin.add([`{"sum":18446744073709551614}`], ['{"sum":1}'], [{ addend: 0 }]).states, [`{"sum":${U64_MAX}}`]);
  // A value past 2^53 that a double does not hold cannot be returned exactly: it traps.
  assert.throws(() => plugin.value('{"sum":9007199254740993}'), /past 2\^53/);
});

test("the common shape, read by its fast path, gets what the exact reading gets", async () => {
  const plugin = await load();
  // Each record of the common shape beside the same record with a space (read exactly).
  const records = [
    event("calls", ',"quantity":0'),
    event("calls", ',"quantity":999999999999999'),
    event("calls", ',"quantity":9007199254740993'),
    event("peak", ',"quantity":4096'),
    event("gb", ',"quantity":4095'),
    event("requests", ',"quantity":7'),
    event("disk", ',"quantity":1'),
    event("seats", ',"quantity":1'),
    event("calls", ',"quantity":1.0'),
    event("calls", ',"quantity":01'),
    '{"id":"x","customer":"a\u00e9\u{1f600}","metric":"calls","quantity":3,"ts":"t\u007f"}',
  ];
  const fast = plugin.describe(records);
  const exact = plugin.describe(records.map((record) => record.replace('"metric":', ' "metric" : ')));
  assert.deepEqual(fast, exact);
  assert.deepEqual(fast.slice(0, 5).map((facts) => facts.addend), ['{"sum":0}', '{"sum":999999999999999}', '{"sum":9007199254740993}', '{"max":4096}', '{"latest":4095}']);
  assert.deepEqual(fast.slice(6, 10).map((facts) => facts.error), [
    `metric "disk" has no meter; name it in the job's [plugin_config] meters (it has: calls, gb, peak, requests, seats)`,
    'field "user" (counted by unique_count) is missing',
    "quantity must be a non-negative integer, got 1.0",
    "event is not valid JSON",
  ]);
  assert.deepEqual(fast[10].key, [["customer", "a\u00e9\u{1f600}"], ["metric", "calls"]]);
  // Totals and counts cross 2^53 exactly (Numbers below it, BigInts past it).
  assert.deepEqual(plugin.add(['{"sum":9007199254740990}'], ['{"sum":5}'], [{ addend: 0 }]).states, ['{"sum":9007199254740995}']);
  assert.deepEqual(plugin.add(['{"count":9007199254740991}'], ['"count"', '"count"'], [{ addend: 0 }, { addend: 1 }]).states, ['{"count":9007199254740993}']);
  assert.deepEqual(plugin.add(['{"max":999999999999999}'], ['{"max":1000000000000000}'], [{ addend: 0 }]).states, ['{"max":1000000000000000}']);
  assert.deepEqual(plugin.add(['{ "sum" : 5 }'], ['{"sum":999999999999999}'], [{ addend: 0 }]).states, ['{"sum":1000000000000004}']);
});

test("latest keeps the greatest event time; of a tie, the first added", async () => {
  const plugin = await load();
  const addends = ['{"latest":7}', '{"latest":3}', '{"latest":9}', '{"latest":2}'];
  const at = (seconds: number, nanoseconds = 0) => ({ seconds, nanoseconds });
  const fold = (times: Array<{ seconds: number; nanoseconds: number }>) => plugin.add([null], addends, times.map((time, addend) => ({ time, addend }))).states![0];
  assert.equal(fold([at(5), at(2)]), '{"latest":{"seconds":5,"nanoseconds":0,"value":7}}');
  assert.equal(fold([at(5), at(5)]), '{"latest":{"seconds":5,"nanoseconds":0,"value":7}}');
  assert.equal(fold([at(5), at(5), at(4, 999999999), at(5, 1)]), '{"latest":{"seconds":5,"nanoseconds":1,"value":2}}');
  assert.equal(fold([at(-5), at(-6)]), '{"latest":{"seconds":-5,"nanoseconds":0,"value":7}}');
});

test("unique_count keeps each value once, by UTF-8 bytes, written as serde_json writes it", async () => {
  const plugin = await load();
  const users = ['"Zoë"', '"Zo\\u00eb"', '"zoe"', '"\\ue000"', '"😀"', '"\\ud83d\\ude00"', '"é"', '"e\\u0301"', '"\\u0000\\u001f\\u007f\\t\\n\\r\\b\\f\\"\\\\\\/\\u2028"', '""', '"B"', '"a"'];
  const described = plugin.describe(users.map((user) => event("seats", `,"user":${user}`)));
  const folded = plugin.add([null], described.map((facts) => facts.addend!), described.map((_, addend) => ({ addend })));
  assert.equal(
    folded.states![0],
    '{"unique":["","\\u0000\\u001f\u007f\\t\\n\\r\\b\\f\\"\\\\/\u2028","B","Zoë","a","e\u0301","zoe","é","\ue000","😀"]}',
  );
  assert.equal(plugin.value(folded.states![0]), 10);
  // Field names spelt with escapes are the same field; of one given twice, the last.
  const [twice, escaped] = plugin.describe([
    '{"id":"x","customer":"acme","metric":"seats","user":"a","ts":"t","user":"b"}',
    '{"id":"x","customer":"acme","metric":"seats","u\\u0073er":"a","ts":"t","user":"b"}',
  ]);
  assert.equal(twice.addend, '{"unique":"b"}');
  assert.equal(escaped.addend, '{"unique":"b"}');
  // A state another build wrote (spaces, unordered, repeated) reads as serde reads it.
  assert.deepEqual(plugin.add(['{ "unique" : ["b","a","b"] }'], ['{"unique":"c"}'], [{ addend: 0 }]).states, ['{"unique":["a","b","c"]}']);
});

test("the meters of [plugin_config], in their three forms, and the Rust build's configure errors", async () => {
  const plugin = await load({ meters: { a: "unique_count:user", b: { meter: "unique_count", field: "user" }, c: { meter: "sum" }, d: { unique_count: "user", other: 1 } } });
  const facts = plugin.describe(["a", "b", "d"].map((metric) => event(metric, ',"user":"u"')));
  assert.deepEqual(facts.map((f) => f.addend), ['{"unique":"u"}', '{"unique":"u"}', '{"unique":"u"}']);
  assert.equal(plugin.describe([event("c", ',"quantity":2')])[0].addend, '{"sum":2}');
  const example = 'write meters = { calls = "sum", seats = { unique_count = "user" } }';
  const refused = async (config: unknown): Promise<unknown> => {
    try {
      await load(config);
    } catch (message) {
      return message;
    }
    assert.fail(`configured with ${JSON.stringify(config)}`);
  };
  const named = 'the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }';
  assert.equal(await refused({ meters: { calls: "avg" } }), `meters.calls = "avg": ${named}`);
  assert.equal(await refused({ meters: { calls: "sum:x" } }), `meters.calls = "sum": ${named}`);
  assert.equal(await refused({ meters: { calls: { meter: "we\"ird\n" } } }), `meters.calls = "we\\"ird\\n": ${named}`);
  assert.equal(await refused({ meters: { seats: "unique_count" } }), 'meters.seats: unique_count counts the values of a field; name it: { unique_count = "user" }');
  assert.equal(await refused({ meters: { seats: "unique_count:" } }), 'meters.seats: unique_count counts the values of a field; name it: { unique_count = "user" }');
  assert.equal(await refused({ meters: { a: "avg", b: "unique_count" } }), `meters.a = "avg": ${named}`);
  assert.equal(await refused({ meters: {} }), "meters is empty: name at least one metric's meter");
  assert.equal(await refused({}), `${example}: missing field \`meters\``);
  assert.equal(await refused({ meters: { a: "sum" }, extra: 1 }), `${example}: unknown field \`extra\`, expected \`meters\``);
  assert.equal(await refused({ meters: "sum" }), `${example}: invalid type: string "sum", expected a map`);
  assert.equal(await refused({ meters: 5 }), `${example}: invalid type: integer \`5\`, expected a map`);
  assert.equal(await refused({ meters: { a: 5 } }), `${example}: data did not match any variant of untagged enum MeterSpec`);
  assert.equal(await refused({ meters: { a: { meter: "sum", field: 3 } } }), `${example}: data did not match any variant of untagged enum MeterSpec`);
});

test("the host's view: a fold of described events per key", async () => {
  const plugin = await load();
  const { values, errors } = plugin.fold([
    [event("calls", ',"quantity":2'), 1],
    [event("calls", ',"quantity":3'), 2],
    [event("calls", `,"quantity":${U64_MAX}`), 3],
    [event("nope"), 4],
  ]);
  assert.deepEqual([...values], [["acme/calls", 5]]);
  assert.deepEqual(errors.map((e) => e.index), [2, 3]);
  assert.match(errors[0].reason, /^refused: the period's sum would pass/);
  assert.match(errors[1].reason, /^malformed: metric "nope" has no meter/);
});

// ---- Through the real host (`tally plugin build`, then `tally run`) -------

const usage = (id: string, customer: string, quantity: number | bigint, ts: string) =>
  `{"id":"${id}","customer":"${customer}","metric":"calls","quantity":${quantity},"ts":"${ts}"}`;
const summary = ({ fields, ...record }: PeriodRecord) => record;

test("the host closes each customer's month in its zone, then adjusts it", async (t) => {
  // This test runs from dist/: the package is its parent.
  const run = await PeriodsRun.start(new URL("..", import.meta.url), {
    periods: 'time_zones = { acme = "America/New_York", globex = "Australia/Lord_Howe" }',
    pluginConfig: 'meters = { calls = "sum" }',
  });
  t.after(() => run.close());
  let sent = run.send([
    usage("a1", "acme", 5, "2026-11-01T04:00:00Z"), // New York's first instant of November
    usage("a0", "acme", 100, "2026-11-01T03:59:59Z"), // still October there
    usage("g1", "globex", 3, "2026-10-31T12:59:59Z"), // Lord Howe's last instant of October
    usage("a2", "acme", 7, "2026-12-01T04:59:59Z"), // 23:59:59 on 30 November in New York
  ]);
  // The watermark is past October's end plus the grace (24h) in either
  // zone, not yet past November's.
  assert.deepEqual(sent.records.map(summary), [
    { type: "final", customer: "globex", period: "2026-10", start: "2026-09-30T13:30:00Z", end: "2026-10-31T13:00:00Z", value: 3n, version: 1, previous: null, delta: null },
    { type: "final", customer: "acme", period: "2026-10", start: "2026-10-01T04:00:00Z", end: "2026-11-01T04:00:00Z", value: 100n, version: 1, previous: null, delta: null },
  ]);
  assert.deepEqual(sent.deadLetters, []);

  sent = run.send([usage("a3", "acme", 1, "2026-12-02T05:00:00Z"), '{"id":"a4",']);
  assert.deepEqual(sent.records.map(summary), [
    { type: "final", customer: "acme", period: "2026-11", start: "2026-11-01T04:00:00Z", end: "2026-12-01T05:00:00Z", value: 12n, version: 1, previous: null, delta: null },
  ]);
  const { tzdata, ...fields } = sent.records[0].fields;
  assert.equal(typeof tzdata, "string");
  assert.deepEqual(fields, {
    type: "final",
    customer: "acme",
    metric: "calls",
    period: "2026-11",
    time_zone: "America/New_York",
    start: "2026-11-01T04:00:00Z",
    end: "2026-12-01T05:00:00Z",
    value: 12n,
    version: 1n,
  });
  assert.deepEqual(sent.deadLetters, [{ offset: 5, reason: "malformed: event is not valid JSON" }]);

  const max = BigInt(U64_MAX);
  sent = run.send([usage("a5", "acme", max - 12n, "2026-11-15T00:00:00Z"), usage("a1", "acme", 5, "2026-11-01T04:00:00Z")]);
  assert.deepEqual(sent.records.map(summary), [
    { type: "adjustment", customer: "acme", period: "2026-11", start: "2026-11-01T04:00:00Z", end: "2026-12-01T05:00:00Z", value: max, version: 2, previous: 12n, delta: max - 12n },
  ]);
  assert.deepEqual(sent.deadLetters, [{ offset: 7, reason: 'duplicate: event id "a1" was counted already' }]);
});
