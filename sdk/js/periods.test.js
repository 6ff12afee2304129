// The period SDK (periods.js) under node's test runner: decoding records
// as the Rust SDK's decode_event does, the fold's plumbing as add_all's,
// and the exact helpers (UTF-8 order, u64 lowering).
import { test } from "node:test";
import assert from "node:assert/strict";
import "./testing.js"; // resolves the host imports
const { JsonEvent, Periods, Reject, Instant, addAll, describeAll, valueOf, configurePlugin, exportPeriods, compareUtf8, lowerU64, U64_MAX } = await import("./periods.js");

const bytes = (text) => new TextEncoder().encode(text);
const reason = (text) => {
  try {
    JsonEvent.decode(typeof text === "string" ? bytes(text) : text);
  } catch (err) {
    assert.ok(err instanceof Reject);
    return err.message;
  }
  return undefined;
};

test("records decode as serde_json reads them into a struct", () => {
  assert.equal(reason(new Uint8Array([0x7b, 0xff, 0x7d])), "event is not UTF-8");
  for (const text of ["", "{", "[1,]", "01", "{} {}", '"\\ud800"', '{"\\udc00":1}', "1e400", "-1e999", "\ufeff1", "\u00a01", `${"[".repeat(129)}${"]".repeat(129)}`]) {
    assert.equal(reason(text), "event is not valid JSON", text);
  }
  for (const text of ['{"a":"\\ud800"}', '["\\udc00"]', '{"a":{"\\ud800":1e999}}', "1e308", `${"[".repeat(128)}${"]".repeat(128)}`, ` {"a":"${"[".repeat(300)}"} `]) {
    assert.equal(reason(text), undefined, text);
  }
});

test("fields are counted and read as written, with or without escapes", () => {
  const plain = JsonEvent.decode(bytes('{"id":"x","n":18446744073709551615,"m":[ 1, {"id":2} ],"f":-1.50E+3,"s":"id"}'));
  assert.equal(plain.escaped, false);
  assert.equal(plain.count("id"), 1);
  assert.equal(plain.count("nope"), 0);
  assert.equal(plain.written("n"), "18446744073709551615");
  assert.equal(plain.integer("n"), 18446744073709551615n);
  assert.equal(plain.written("m"), "[ 1, {\"id\":2} ]");
  assert.equal(plain.written("f"), "-1.50E+3");
  assert.equal(plain.integer("f"), undefined);
  assert.equal(plain.written("s"), '"id"');
  const escaped = JsonEvent.decode(bytes('{"i\\u0064":"x" , "id" : "y","t":"a\\"b","t":{ "k" : [] }}'));
  assert.equal(escaped.escaped, true);
  assert.equal(escaped.count("id"), 2);
  assert.equal(escaped.count("t"), 2);
  assert.equal(escaped.written("id"), '"y"');
  assert.equal(escaped.written("t"), '{ "k" : [] }');
  assert.deepEqual(escaped.members().map(([name]) => name), ["id", "id", "t", "t"]);
  assert.equal(JsonEvent.decode(bytes("[1]")).count("id"), 0);
});

test("strings order by UTF-8 bytes", () => {
  const alphabet = ["a", "B", "é", "\u0301", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff", "😀", "𝄞", "\u0000", ""];
  let seed = 3;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const word = () => Array.from({ length: Math.floor(random() * 4) }, () => alphabet[Math.floor(random() * alphabet.length)]).join("");
  for (let i = 0; i < 3000; i++) {
    const [a, b] = [word(), word()];
    assert.equal(Math.sign(compareUtf8(a, b)), Math.sign(Buffer.compare(Buffer.from(a), Buffer.from(b))), `${a} ${b}`);
  }
});

/** Counts events per customer; a state is `{ n }` (BigInt), the default codecs. */
class Counter extends Periods {
  constructor(config) {
    super(config);
    if (config.limit === undefined) throw new Error("name a limit");
  }
  describe(event) {
    const { id, customer, at } = event.value;
    if (typeof customer !== "string") throw new Reject("no customer");
    return { id, time: at, key: [["customer", customer]], customer, addend: { n: event.integer("n") ?? 1n } };
  }
  add(state, time, addend) {
    const n = (state?.n ?? 0n) + addend.n;
    if (n > this.config.limit) throw new Reject(`over ${this.config.limit}`);
    return { n, at: time.seconds };
  }
  value(state) {
    return state.n;
  }
}

test("a plugin class is configured, describes a batch and folds it as the Rust SDK does", () => {
  assert.throws(() => configurePlugin(Counter, "{}"), (message) => message === "name a limit");
  const plugin = configurePlugin(Counter, '{"limit":18446744073709551615}');
  assert.equal(plugin.config.limit, U64_MAX);
  const events = ['{"id":"1","customer":"a","at":"2026-11-03T10:00:00Z","n":9007199254740993}', '{"id":"2","customer":7}', '{"id":"3","customer":"b","at":1762164000000}', "nope"].map((text, offset) => ({ partition: 0, offset, timestampMs: null, key: null, value: bytes(text) }));
  const described = describeAll(plugin, events);
  assert.equal(described[0].tag, "ok");
  assert.deepEqual(described[0].val.time, { tag: "rfc3339", val: "2026-11-03T10:00:00Z" });
  assert.equal(new TextDecoder().decode(described[0].val.addend), '{"n":9007199254740993}');
  assert.deepEqual(described[1], { tag: "err", val: "no customer" });
  assert.deepEqual(described[2].val.time, { tag: "unix-millis", val: 1762164000000 });
  assert.deepEqual(described[3], { tag: "err", val: "event is not valid JSON" });
  const addends = [described[0].val.addend, described[2].val.addend];
  const time = { seconds: 1762164000, nanoseconds: 0 };
  const folded = addAll(plugin, [null, bytes('{"n":1}')], addends, [
    { period: 0, time, addend: 0 },
    { period: 1, time, addend: 1 },
    { period: 0, time, addend: 1 },
  ]);
  assert.deepEqual(folded.map((state) => new TextDecoder().decode(state)), ['{"n":9007199254740994,"at":1762164000}', '{"n":2,"at":1762164000}']);
  assert.equal(valueOf(plugin, folded[0]), 9007199254740994n);
  const small = configurePlugin(Counter, '{"limit":2}');
  assert.throws(
    () => addAll(small, [null], [bytes('{"n":1}')], [0, 0, 0].map((addend) => ({ period: 0, time, addend }))),
    (refusal) => refusal.addition === 2 && refusal.reason === "over 2",
  );
  // A bug (not a Reject) traps: it is thrown as is.
  assert.throws(() => addAll(small, [bytes('{"n":1.5}')], [bytes('{"n":1}')], [{ period: 0, time, addend: 0 }]), TypeError);
});

test("a plugin may read a record's text first (JsonEvent.parse) and return an addend's bytes", () => {
  class Fast extends Periods {
    decodeEvent(bytes, record) {
      const text = new TextDecoder().decode(bytes);
      return text.startsWith("fast:") ? text.slice(5) : JsonEvent.parse(text, record);
    }
    describe(event) {
      const id = typeof event === "string" ? event : event.value.id;
      return { id, time: 0, key: [["k", "v"]], customer: "c", addend: typeof event === "string" ? "fast" : "slow" };
    }
    encodeAddend(addend) {
      return addend === "fast" ? FAST : '"slow"';
    }
  }
  const FAST = bytes('"fast"');
  const plugin = configurePlugin(Fast, "{}");
  const events = ["fast:a", '{"id":"b"}', '{"id":"\\ud800"} x', `{"a":${"[".repeat(129)}${"]".repeat(129)}}`].map((text, offset) => ({ partition: 0, offset, timestampMs: 5, key: null, value: bytes(text) }));
  const described = describeAll(plugin, events);
  assert.equal(described[0].val.addend, FAST);
  assert.equal(described[0].val.id, "a");
  assert.deepEqual(new TextDecoder().decode(described[1].val.addend), '"slow"');
  assert.deepEqual(described.slice(2), [{ tag: "err", val: "event is not valid JSON" }, { tag: "err", val: "event is not valid JSON" }]);
  const parsed = JsonEvent.parse('{"n":1}', events[1]);
  assert.deepEqual([parsed.value, parsed.offset, parsed.timestampMs], [{ n: 1 }, 1, 5]);
});

test("the component's exports: configure first; u64 values as the host can take them", () => {
  const { config, periods } = exportPeriods(Counter);
  assert.throws(() => periods.value(bytes('{"n":1}')), /before configure/);
  config.configure('{"limit":100}');
  assert.equal(periods.value(bytes('{"n":5}')), 5);
  assert.equal(lowerU64(U64_MAX), 2 ** 64);
  assert.equal(lowerU64(2n ** 60n), 2 ** 60);
  assert.throws(() => lowerU64(2n ** 53n + 1n), RangeError);
  assert.equal(new Instant(5, 1).compare(new Instant(5, 0)) > 0, true);
});
