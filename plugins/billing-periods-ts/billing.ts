// The period billing plugin in TypeScript: usage events metered per
// customer, metric and calendar period in the customer's time zone. The
// host owns the periods (docs/periods.md); this plugin says what each event
// is and how its metric's meter counts it, exactly as plugins/billing-periods
// (Rust) does: the spec is docs/billing.md, "The period billing plugin".
// The build compiles it with tsc, then makes the JavaScript a component.
//
// Events: {"id":"e1","customer":"acme","metric":"calls","quantity":12,"ts":"2026-11-03T10:00:00Z"}
// [plugin_config] meters = { calls = "sum", requests = "count", peak_gb = "max",
//                            storage_gb = "latest", seats = { unique_count = "user" } }

import { JsonEvent, Periods, Reject, U64_MAX, compareUtf8, exportPeriods, isWellFormed, parseJson, utf8Decode, utf8Encode } from "tally/periods";
import type { FactsFields, HostEvent, Instant } from "tally/periods";

/** How a metric counts. */
export type Meter = { name: "sum" | "count" | "max" | "latest" } | { name: "unique_count"; field: string };

/** A quantity, total or count: a Number while a double holds it exactly
 * (up to 2^53 - 1), a BigInt past that; the same digits either way. */
export type Amount = number | bigint;

/** What an event adds to its period, tagged by its meter (JSON: `{"sum":5}`, `"count"`, `{"unique":"zoë"}`). */
export type Addend = { sum: Amount } | "count" | { max: Amount } | { latest: Amount } | { unique: string };

/** A period's state, tagged by the meter that built it. */
export type State =
  | { sum: Amount }
  | { count: Amount }
  | { max: Amount }
  | { latest: { seconds: number; nanoseconds: number; value: Amount } }
  | { unique: string[] };

/** A usage event as `JSON.parse` reads it (exact numbers come from the record's text). */
interface Usage {
  [field: string]: unknown;
}

/** The fields every event has, in the order they are checked. */
const FIELDS = ["id", "customer", "metric", "quantity", "ts"] as const;
/** The fields that must be strings, in the order they are checked. */
const TEXT_FIELDS: readonly string[] = ["id", "customer", "metric", "ts"];
const DIGITS = /^[0-9]+$/;
const NOT_JSON = "event is not valid JSON";
const EXACT = Number.MAX_SAFE_INTEGER;

/**
 * An event as producers write it: the five fields in their order, no
 * spaces, strings without escapes or control characters, a quantity of at
 * most 15 digits (below 2^53). Text that matches is one JSON object giving
 * each field once, with no lone surrogate, so none of the exact checks can
 * fail: its fields are the captures, its quantity an exact Number. Any
 * other record is read by `JsonEvent` and checked in full.
 */
/** `COMMON` with ASCII strings: matched against the record's bytes read
 * as Latin-1, it needs no UTF-8 decoding first (a match is all ASCII, so
 * the bytes are UTF-8 and their Latin-1 reading is their text). QuickJS
 * also tests this narrower class faster than `COMMON`'s. */
const COMMON_ASCII = /^\{"id":"([ !#-[\]-\u007f]*)","customer":"([ !#-[\]-\u007f]*)","metric":"([ !#-[\]-\u007f]*)","quantity":(0|[1-9][0-9]{0,14}),"ts":"([ !#-[\]-\u007f]*)"\}$/;
const COMMON = /^\{"id":"([^"\\\u0000-\u001f]*)","customer":"([^"\\\u0000-\u001f]*)","metric":"([^"\\\u0000-\u001f]*)","quantity":(0|[1-9][0-9]{0,14}),"ts":"([^"\\\u0000-\u001f]*)"\}$/;

/** A record of the common shape, as `COMMON` matches it: `[text, id, customer, metric, quantity, ts]`. */
type CommonEvent = RegExpExecArray;

/** Most customers whose aggregation keys a metric keeps (then it starts over). */
const KEYS_KEPT = 4096;
/** Quantities below this have their addends' bytes kept, per meter. */
const ADDENDS_KEPT = 4096;

type Key = [string, string][];

export class BillingPeriods extends Periods<State, Addend, unknown, CommonEvent | JsonEvent<Usage>> {
  /** metric -> meter, by the metrics' UTF-8 bytes. */
  readonly meters: Map<string, Meter>;
  /** The metrics with a meter, as a refusal lists them. */
  private readonly metered: string;
  /** metric -> customer -> the aggregation key. */
  private readonly keys = new Map<string, Map<string, Key>>();
  /** meter -> quantity -> the addend's bytes. */
  private readonly addends: Record<"sum" | "max" | "latest", Uint8Array[]> = { sum: [], max: [], latest: [] };
  /** addend text -> the addend (`add` changes no addend: they can be shared). */
  private readonly decoded = new Map<string, Addend>();

  /** Reads `[plugin_config] meters`; throws the Rust build's messages. */
  constructor(config: unknown) {
    super(config);
    this.meters = new Map(readMeters(config));
    this.metered = [...this.meters.keys()].join(", ");
  }

  /** A record of the common shape (see `COMMON`) as the pattern's match;
   * any other as a `JsonEvent`. */
  decodeEvent(bytes: Uint8Array, record: HostEvent): CommonEvent | JsonEvent<Usage> {
    // Bytes read as Latin-1 are the text when they match the pattern with
    // ASCII strings (no check for UTF-8 needed); else the text is decoded.
    if (bytes.length <= 4096) {
      const common = COMMON_ASCII.exec(String.fromCharCode.apply(null, bytes as unknown as number[]));
      if (common !== null) return common;
    }
    const text = utf8Decode(bytes);
    return COMMON.exec(text) ?? (JsonEvent.parse(text, record) as JsonEvent<Usage>);
  }

  describe(event: CommonEvent | JsonEvent<Usage>): FactsFields<Addend> {
    if (Array.isArray(event)) {
      const metric = event[3];
      const meter = this.meters.get(metric);
      if (meter !== undefined && meter.name !== "unique_count") {
        const customer = event[2];
        // sum, count, max, latest: all the five fields this plugin reads.
        const addend = meter.name === "count" ? "count" : ({ [meter.name]: Number(event[4]) } as Addend);
        return { id: event[1], time: event[5], key: this.keyOf(customer, metric), customer, addend };
      }
      // An unmetered metric, or a field to count: the exact reading says which.
      event = JsonEvent.parse(event.input) as JsonEvent<Usage>;
    }
    if (!event.isObject()) throw new Reject("event must be a JSON object");
    for (const field of FIELDS) {
      const count = event.count(field);
      if (count > 1) throw new Reject(`field \`${field}\` is given twice`);
      if (count === 0 && field !== "quantity") throw new Reject(`field \`${field}\` is missing`);
    }
    const usage = event.value;
    const text = (field: string): string => {
      const value = usage[field];
      if (typeof value !== "string") throw new Reject(`field \`${field}\` must be a string`);
      if (event.escaped && !isWellFormed(value)) throw new Reject(NOT_JSON);
      return value;
    };
    const [id, customer, metric, ts] = TEXT_FIELDS.map(text);
    const meter = this.meters.get(metric);
    if (meter === undefined) {
      throw new Reject(`metric ${JSON.stringify(metric)} has no meter; name it in the job's [plugin_config] meters (it has: ${this.metered})`);
    }
    let addend: Addend;
    switch (meter.name) {
      case "sum":
        addend = { sum: quantity(event) };
        break;
      case "count":
        addend = "count";
        break;
      case "max":
        addend = { max: quantity(event) };
        break;
      case "latest":
        addend = { latest: quantity(event) };
        break;
      case "unique_count":
        addend = { unique: counted(event, meter.field) };
        break;
    }
    return { id, time: ts, key: [["customer", customer], ["metric", metric]], customer, addend };
  }

  /** The aggregation key of `customer`'s `metric` events (kept: the host
   * reads it, and keeps nothing of it). */
  private keyOf(customer: string, metric: string): Key {
    let keys = this.keys.get(metric);
    if (keys === undefined) this.keys.set(metric, (keys = new Map()));
    let key = keys.get(customer);
    if (key === undefined) {
      if (keys.size >= KEYS_KEPT) keys.clear();
      key = [["customer", customer], ["metric", metric]];
      keys.set(customer, key);
    }
    return key;
  }

  add(state: State | undefined, time: Instant, addend: Addend): State {
    const meter = meterOf(addend);
    if (state === undefined) {
      if (addend === "count") return { count: 1 };
      if ("sum" in addend) return { sum: addend.sum };
      if ("max" in addend) return { max: addend.max };
      if ("latest" in addend) return { latest: { seconds: time.seconds, nanoseconds: time.nanoseconds, value: addend.latest } };
      return { unique: [addend.unique] };
    }
    const opened = meterOf(state);
    if (opened !== meter) {
      throw new Reject(
        `the event's metric is metered by ${meter} but its period was opened by ${opened}: a metric's meter changed while its period was open; keep a metric's meter for its periods`,
      );
    }
    if (addend === "count" && "count" in state) {
      const count = state.count;
      if (typeof count === "number" && count < EXACT) return { count: count + 1 };
      return { count: BigInt(count) < U64_MAX ? BigInt(count) + 1n : U64_MAX };
    }
    if (addend === "count") throw new Error("unreachable: meters match");
    if ("sum" in addend && "sum" in state) {
      const a = state.sum;
      const b = addend.sum;
      if (typeof a === "number" && typeof b === "number" && a + b <= EXACT) return { sum: a + b };
      const sum = BigInt(a) + BigInt(b);
      if (sum > U64_MAX) throw new Reject("the period's sum would pass 2^64 - 1, the largest meterable");
      return { sum };
    }
    if ("max" in addend && "max" in state) return addend.max > state.max ? { max: addend.max } : state;
    if ("latest" in addend && "latest" in state) {
      // Ties go to the event added first.
      const { seconds, nanoseconds } = state.latest;
      const later = time.seconds > seconds || (time.seconds === seconds && time.nanoseconds > nanoseconds);
      return later ? { latest: { seconds: time.seconds, nanoseconds: time.nanoseconds, value: addend.latest } } : state;
    }
    if ("unique" in addend && "unique" in state) {
      insertSorted(state.unique, addend.unique);
      return state;
    }
    throw new Error("unreachable: meters match");
  }

  value(state: State): Amount {
    if ("unique" in state) return BigInt(state.unique.length);
    if ("latest" in state) return state.latest.value;
    if ("sum" in state) return state.sum;
    if ("count" in state) return state.count;
    return state.max;
  }

  encodeAddend(addend: Addend): string | Uint8Array {
    if (addend === "count") return COUNT_ADDEND;
    if ("unique" in addend) return `{"unique":${JSON.stringify(addend.unique)}}`;
    const [meter, quantity] = "sum" in addend ? ["sum", addend.sum] as const : "max" in addend ? ["max", addend.max] as const : ["latest", addend.latest] as const;
    if (typeof quantity !== "number" || quantity >= ADDENDS_KEPT) return `{"${meter}":${quantity}}`;
    // The bytes, kept: most quantities recur.
    const kept = this.addends[meter];
    return (kept[quantity] ??= utf8Encode(`{"${meter}":${quantity}}`));
  }

  decodeAddend(text: string): Addend {
    const kept = this.decoded.get(text);
    if (kept !== undefined) return kept;
    const number = ADDEND_NUMBER.exec(text);
    if (number !== null) {
      if (this.decoded.size >= ADDENDS_KEPT) this.decoded.clear();
      const addend = tagNumber(number[1], u64Digits(number[2])) as Addend;
      this.decoded.set(text, addend);
      return addend;
    }
    if (text === '"count"') return "count";
    return readAddend(parseJson(text));
  }

  encodeState(state: State): string {
    if ("unique" in state) return `{"unique":[${state.unique.map((value) => JSON.stringify(value)).join(",")}]}`;
    if ("latest" in state) {
      const { seconds, nanoseconds, value } = state.latest;
      return `{"latest":{"seconds":${seconds},"nanoseconds":${nanoseconds},"value":${value}}}`;
    }
    if ("sum" in state) return `{"sum":${state.sum}}`;
    if ("count" in state) return `{"count":${state.count}}`;
    return `{"max":${state.max}}`;
  }

  decodeState(text: string): State {
    const number = STATE_NUMBER.exec(text);
    if (number !== null) return tagNumber(number[1], u64Digits(number[2])) as State;
    const latest = STATE_LATEST.exec(text);
    if (latest !== null) return { latest: { seconds: i64Digits(latest[1]), nanoseconds: u32(latest[2]), value: u64Digits(latest[3]) } };
    return readState(parseJson(text));
  }
}

export const { config, periods } = exportPeriods(BillingPeriods);

// ---- Events ---------------------------------------------------------------

/** The event's quantity, exactly as written: a non-negative integer up to 2^64 - 1. */
function quantity(event: JsonEvent<Usage>): bigint {
  const written = event.written("quantity");
  if (written === undefined) throw new Reject("field `quantity` is missing");
  if (!DIGITS.test(written)) throw new Reject(`quantity must be a non-negative integer, got ${written}`);
  const value = BigInt(written);
  if (value > U64_MAX) throw new Reject(`quantity ${written} is over the largest meterable, 2^64 - 1`);
  return value;
}

/** The string a `unique_count` meter counts: field `name` (of a field
 * other than the five every event has, given twice, the last). */
function counted(event: JsonEvent<Usage>, name: string): string {
  const value = event.value[name];
  if (TEXT_FIELDS.includes(name)) return value as string; // checked by describe
  const written = event.written(name);
  if (written === undefined) throw new Reject(`field ${JSON.stringify(name)} (counted by unique_count) is missing`);
  if (typeof value !== "string") throw new Reject(`field ${JSON.stringify(name)} must be a string for its unique_count meter, got ${written}`);
  if (event.escaped && !isWellFormed(value)) throw new Reject(NOT_JSON);
  return value;
}

/** Inserts `value` into `values` (ordered by UTF-8 bytes) unless there. */
function insertSorted(values: string[], value: string): void {
  let low = 0;
  let high = values.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    const order = compareUtf8(values[middle], value);
    if (order === 0) return;
    if (order < 0) low = middle + 1;
    else high = middle;
  }
  values.splice(low, 0, value);
}

// ---- Addends and states ---------------------------------------------------

type MeterName = Meter["name"];

/** The meter that made an addend or state, as `[plugin_config]` names it. */
function meterOf(tagged: Addend | State): MeterName {
  if (tagged === "count") return "count";
  // Each addend and state has one field: its meter's.
  if ("sum" in tagged) return "sum";
  if ("count" in tagged) return "count";
  if ("max" in tagged) return "max";
  if ("latest" in tagged) return "latest";
  return "unique_count";
}

const COUNT_ADDEND = utf8Encode('"count"');

const ADDEND_NUMBER = /^\{"(sum|max|latest)":(0|[1-9][0-9]*)\}$/;
const STATE_NUMBER = /^\{"(sum|count|max)":(0|[1-9][0-9]*)\}$/;
const STATE_LATEST = /^\{"latest":\{"seconds":(-?(?:0|[1-9][0-9]*)),"nanoseconds":(0|[1-9][0-9]*),"value":(0|[1-9][0-9]*)\}\}$/;

const tagNumber = (tag: string, value: Amount): { [tag: string]: Amount } => ({ [tag]: value });

/** An integer in `[low, high]`, or throws. */
function ranged(value: unknown, low: bigint, high: bigint, what: string): bigint {
  const integer = typeof value === "string" ? BigInt(value) : value;
  if (typeof integer !== "bigint" || integer < low || integer > high) throw new Error(`expected ${what}, got ${String(value)}`);
  return integer;
}
const u64 = (value: unknown): bigint => ranged(value, 0n, U64_MAX, "u64");
const i64 = (value: unknown): number => Number(ranged(value, -(1n << 63n), (1n << 63n) - 1n, "i64"));
const u32 = (value: unknown): number => Number(ranged(value, 0n, 0xffffffffn, "u32"));
/** A u64 or i64 written as digits (as the patterns above capture them): a
 * Number when of 15 digits or fewer (exact), else as `u64`/`i64` read it. */
const u64Digits = (digits: string): Amount => (digits.length <= 15 ? Number(digits) : u64(digits));
const i64Digits = (digits: string): number => (digits.length <= 15 ? Number(digits) : i64(digits));

/** The one `[tag, value]` of an externally tagged JSON enum value. */
function tagged(json: unknown): [string, unknown] {
  if (json === null || typeof json !== "object" || Array.isArray(json)) throw new Error("expected a meter's tagged value");
  const entries = Object.entries(json);
  if (entries.length !== 1) throw new Error("expected a map with a single key");
  return entries[0];
}

/** An addend decoded in any form serde_json reads (spaces, escapes). */
function readAddend(json: unknown): Addend {
  if (json === "count") return "count";
  const [tag, value] = tagged(json);
  switch (tag) {
    case "sum":
      return { sum: u64(value) };
    case "max":
      return { max: u64(value) };
    case "latest":
      return { latest: u64(value) };
    case "count":
      if (value !== null) throw new Error("expected unit variant count");
      return "count";
    case "unique":
      return { unique: text(value) };
    default:
      throw new Error(`unknown variant \`${tag}\``);
  }
}

/** A state decoded in any form serde_json reads (spaces, field order,
 * unordered or repeated `unique` values). */
function readState(json: unknown): State {
  const [tag, value] = tagged(json);
  switch (tag) {
    case "sum":
      return { sum: u64(value) };
    case "count":
      return { count: u64(value) };
    case "max":
      return { max: u64(value) };
    case "latest": {
      if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error("expected struct variant State::Latest");
      const fields = value as Record<string, unknown>;
      for (const field of ["seconds", "nanoseconds", "value"]) if (!(field in fields)) throw new Error(`missing field \`${field}\``);
      return { latest: { seconds: i64(fields.seconds), nanoseconds: u32(fields.nanoseconds), value: u64(fields.value) } };
    }
    case "unique": {
      if (!Array.isArray(value)) throw new Error("expected a sequence");
      const values: string[] = [];
      for (const item of value) insertSorted(values, text(item));
      return { unique: values };
    }
    default:
      throw new Error(`unknown variant \`${tag}\``);
  }
}

function text(value: unknown): string {
  if (typeof value !== "string" || !isWellFormed(value)) throw new Error("expected a string");
  return value;
}

// ---- Configuration --------------------------------------------------------

const EXAMPLE = 'write meters = { calls = "sum", seats = { unique_count = "user" } }';
const NAMED = `the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }`;

/** `[plugin_config]`'s meters, as `[metric, meter]` by the metrics' UTF-8
 * bytes; throws the message of the Rust build (serde's words included). */
function readMeters(config: unknown): Array<[string, Meter]> {
  const shape = (message: string) => new Error(`${EXAMPLE}: ${message}`);
  if (!isObject(config)) throw shape(`invalid type: ${unexpected(config)}, expected struct Config`);
  let meters: Record<string, unknown> | undefined;
  for (const name of Object.keys(config).sort(compareUtf8)) {
    if (name !== "meters") throw shape(`unknown field \`${name}\`, expected \`meters\``);
    const written = config.meters;
    if (!isObject(written)) throw shape(`invalid type: ${unexpected(written)}, expected a map`);
    for (const metric of Object.keys(written).sort(compareUtf8)) {
      if (spec(written[metric]) === undefined) throw shape("data did not match any variant of untagged enum MeterSpec");
    }
    meters = written;
  }
  if (meters === undefined) throw shape("missing field `meters`");
  const metrics = Object.keys(meters).sort(compareUtf8);
  if (metrics.length === 0) throw new Error("meters is empty: name at least one metric's meter");
  return metrics.map((metric): [string, Meter] => {
    const [name, field] = spec(meters[metric])!;
    if (field === undefined && (name === "sum" || name === "count" || name === "max" || name === "latest")) return [metric, { name }];
    if (name === "unique_count" && field) return [metric, { name, field }];
    if (name === "unique_count") throw new Error(`meters.${metric}: unique_count counts the values of a field; name it: { unique_count = "user" }`);
    throw new Error(`meters.${metric} = ${rustDebug(name)}: ${NAMED}`);
  });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function has(object: object, field: string): boolean {
  return Object.prototype.hasOwnProperty.call(object, field);
}

/** A meter as written, `[name, field]`, read as serde reads the Rust
 * build's untagged `MeterSpec`: `"sum"`, `"unique_count:user"`,
 * `{ unique_count = "user" }`, `{ meter = "unique_count", field = "user" }`;
 * `undefined` when it is none of these. */
function spec(written: unknown): [string, string | undefined] | undefined {
  if (typeof written === "string") {
    const colon = written.indexOf(":");
    return colon < 0 ? [written, undefined] : [written.slice(0, colon), written.slice(colon + 1)];
  }
  if (!isObject(written)) return undefined;
  if (typeof written.unique_count === "string" && has(written, "unique_count")) return ["unique_count", written.unique_count];
  if (typeof written.meter !== "string" || !has(written, "meter")) return undefined;
  const field = has(written, "field") ? written.field : null;
  if (field !== null && typeof field !== "string") return undefined;
  return [written.meter, field ?? undefined];
}

/** How serde names an unexpected JSON value in an "invalid type" error. */
function unexpected(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "boolean") return `boolean \`${value}\``;
  if (typeof value === "bigint") return `integer \`${value}\``;
  if (typeof value === "number") return `floating point \`${Number.isInteger(value) ? `${BigInt(value)}.0` : value}\``;
  if (typeof value === "string") return `string ${rustDebug(value)}`;
  return Array.isArray(value) ? "sequence" : "map";
}

/** `text` as Rust's `{:?}` writes a string (control characters escaped). */
function rustDebug(text: string): string {
  const escapes: Record<string, string> = { "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"', "\0": "\\0" };
  return `"${text.replace(/[\t\r\n\\"\0]|[\u0001-\u001f\u007f-\u009f]/g, (c) => escapes[c] ?? `\\u{${c.charCodeAt(0).toString(16)}}`)}"`;
}
