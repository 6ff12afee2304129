// Tally's period plugins in JavaScript (`tally:plugin@0.2.0`, world
// `periods-plugin`): the aggregation of a job that declares `[periods]`.
//
//   import { Periods, Reject, exportPeriods } from "tally/periods";
//
//   /** Calls per customer and period. */
//   class CallsPerPeriod extends Periods {
//     describe(event) {
//       const { id, customer, ts } = event.value;
//       return { id, time: ts, key: [["customer", customer]], customer, addend: null };
//     }
//     add(calls, time, addend) { return (calls ?? 0n) + 1n; }
//     value(calls) { return calls; }
//   }
//   export const { config, periods } = exportPeriods(CallsPerPeriod);
//
// The host owns event time: it assigns each event to its customer's
// calendar period, closes periods, de-duplicates ids and writes the FINAL
// and ADJUSTMENT records (docs/periods.md). The plugin says what an event
// is (`describe`: its facts and its addend), how an addend changes a
// period's state (`add`) and a period's value (`value`). The semantics are
// the Rust SDK's (`sdk/rust/src/periods.rs`): the SDK does the WIT
// plumbing (a batch of events in one call, the fold of a batch's additions
// with each state decoded and encoded once, the first refusal's index).
//
// This module imports only the 0.2.0 `log`: a period component has no
// other import (importing `tally`, the 0.1 SDK, into one does not build).

import { log as hostLog } from "tally:plugin/log@0.2.0";
import { loggerFor } from "./logger.js";
import { JsonNumber, Reject, MAX_DEPTH, parseJson, encodeJsonText, utf8Decode, utf8Encode } from "./json.js";

export { Reject, JsonNumber, MAX_DEPTH, parseJson, encodeJsonText, utf8Decode, utf8Encode };
export { DUPLICATES, decodeJson, encodeJson } from "./json.js";

/** Writes one line to the host's log (the host rate-limits and labels it). */
export const log = loggerFor(hostLog);

// ---- What the plugin gets and gives --------------------------------------

/** An instant as the host read an event's time: seconds since the Unix
 * epoch and nanoseconds within the second (0 to 999,999,999). */
export class Instant {
  constructor(seconds, nanoseconds = 0) {
    /** Seconds since 1970-01-01T00:00:00Z (a Number: exact, as every
     * instant the host reads lies within years 0 to 9999). */
    this.seconds = Number(seconds);
    /** Nanoseconds within the second. */
    this.nanoseconds = nanoseconds;
  }
  /** Negative, zero or positive as this is before, at or after `other`. */
  compare(other) {
    return this.seconds - other.seconds || this.nanoseconds - other.nanoseconds;
  }
}

/** The largest value a period may have, 2^64 - 1. */
export const U64_MAX = (1n << 64n) - 1n;

/**
 * A record decoded as JSON, as `describe` gets it by default. `value` is
 * what the engine's `JSON.parse` makes of it (numbers as Numbers): exact
 * for strings, booleans, nulls and small integers. For the rest, ask:
 * `written(name)` is a top-level field's text as written (exact numbers:
 * `integer(name)`), `count(name)` how often the record gives it.
 *
 * Decoding refuses what serde_json refuses when it reads such a record
 * into a struct (the Rust SDK's `decode_event`): a record that is not
 * UTF-8 (`event is not UTF-8`), not one JSON value, nested deeper than 128
 * levels, a top-level string or object key with a lone surrogate escape,
 * or a top-level number out of a double's range (`event is not valid
 * JSON`). Nested values are kept as `JSON.parse` reads them: a lone
 * surrogate escape in a field's value is the plugin's to judge.
 */
export class JsonEvent {
  /** Decodes `bytes` (a record's value); throws `Reject` as above. The
   * host's record (`partition`, `offset`, `timestampMs`, `key`) rides along. */
  static decode(bytes, record = undefined) {
    return JsonEvent.parse(utf8Decode(bytes), record);
  }

  /** `decode` of a record's text (the bytes read as UTF-8): for a
   * `decodeEvent` that looks at the text first. */
  static parse(text, record = undefined) {
    // Nesting past MAX_DEPTH takes more than 2 * MAX_DEPTH brackets (ASCII).
    if (text.length > 2 * MAX_DEPTH && tooDeep(text)) throw new Reject("event is not valid JSON");
    let value;
    try {
      value = JSON.parse(text);
    } catch {
      throw new Reject("event is not valid JSON");
    }
    const event = new JsonEvent(text, value, record);
    // What serde_json reads strictly at the top level: the record itself
    // (a number as a double, a string as text) and an object's field names.
    if (event.escaped) {
      if (typeof value === "string" && !isWellFormed(value)) throw new Reject("event is not valid JSON");
      if (event.isObject()) {
        for (const [name] of event.members()) if (!isWellFormed(name)) throw new Reject("event is not valid JSON");
      }
    } else if (typeof value === "number" && !new JsonNumber(text.replace(SPACES, "")).isFinite()) {
      throw new Reject("event is not valid JSON");
    }
    return event;
  }

  constructor(text, value, record) {
    /** The record as text. */
    this.text = text;
    /** The record as `JSON.parse` reads it. */
    this.value = value;
    /** Whether the text has any escape (`\`): without one, a field name
     * is written exactly one way, and no string holds a lone surrogate. */
    this.escaped = text.indexOf("\\") >= 0;
    /** The host's record: partition, offset, timestampMs, key. */
    this.partition = record?.partition;
    this.offset = record?.offset;
    this.timestampMs = record?.timestampMs ?? null;
    this.key = record?.key ?? null;
    this._members = undefined;
  }

  /** Whether the record is a JSON object. */
  isObject() {
    return this.value !== null && typeof this.value === "object" && !Array.isArray(this.value);
  }

  /** How many times the record (an object) gives field `name`: 0, 1 or more. */
  count(name) {
    if (!this.isObject()) return 0;
    if (!this.escaped) {
      const quoted = JSON.stringify(name);
      const first = this.text.indexOf(quoted);
      if (first < 0) return 0;
      if (this.text.indexOf(quoted, first + quoted.length) < 0) return Object.prototype.hasOwnProperty.call(this.value, name) ? 1 : 0;
    }
    let count = 0;
    for (const [member] of this.members()) if (member === name) count++;
    return count;
  }

  /** The text of field `name` (of a field given twice, the last) as
   * written in the record, from its first character to its last; or
   * `undefined` when the record (an object) has no such field. */
  written(name) {
    if (!this.isObject() || !Object.prototype.hasOwnProperty.call(this.value, name)) return undefined;
    if (!this.escaped) {
      const quoted = JSON.stringify(name);
      const first = this.text.indexOf(quoted);
      if (this.text.indexOf(quoted, first + quoted.length) < 0) {
        // The one place the name is written is the field's name.
        FLAT_VALUE.lastIndex = first + quoted.length;
        const flat = FLAT_VALUE.exec(this.text);
        if (flat !== null) return flat[1];
      }
    }
    let written;
    for (const [member, start, end] of this.members()) if (member === name) written = this.text.slice(start, end);
    return written;
  }

  /** Field `name` as an exact integer (BigInt) when it is written as one
   * (no fraction, no exponent); otherwise `undefined`. */
  integer(name) {
    const written = this.written(name);
    return written !== undefined && INTEGER.test(written) ? BigInt(written) : undefined;
  }

  /** The record's top-level fields, in order, each as written:
   * `[name, start, end]` (the value is `text.slice(start, end)`). */
  members() {
    if (this._members === undefined) this._members = this.isObject() ? scanMembers(this.text) : [];
    return this._members;
  }
}

/** What an event says about itself: a `describe` returns one.
 * - `id`: the producer's id of the event (a retry carries the same one);
 * - `time`: when it happened: an RFC 3339 string with its offset, or Unix
 *   milliseconds (a Number or BigInt, or a `Date`);
 * - `key`: the aggregation key's fields in order, `[[name, value], ...]`;
 * - `customer`: whose time zone decides the event's period;
 * - `addend`: what the event adds to its period, in the plugin's terms
 *   (`encodeAddend` writes it; the host hands it back to `add`). */
export class Facts {
  constructor({ id, time, key, customer, addend }) {
    this.id = id;
    this.time = time;
    this.key = key;
    this.customer = customer;
    this.addend = addend;
  }
}

/**
 * The aggregation of a period job: extend it, and export the class with
 * `exportPeriods`. Override:
 * - `constructor(config)`: the job's `[plugin_config]` (decoded JSON,
 *   integers as BigInt); throw to refuse the job, with the error's message;
 * - `describe(event)`: a `JsonEvent`'s facts (a `Facts`, or an object of
 *   the same fields); throw `Reject` for a malformed event;
 * - `add(state, time, addend)`: the period's next state after `addend`
 *   (of an event at `time`, an `Instant`) is added to `state` (`undefined`:
 *   the period's first event); throw `Reject` to refuse the event (it then
 *   counts for nothing). Do not mutate `state` in place if a refusal may
 *   follow in the same call: a refused call counts for nothing (returning a
 *   new state is the safe way);
 * - `value(state)`: the period's value, a BigInt (or Number) from 0 to
 *   2^64 - 1.
 * Addends and states travel as JSON by default (integers as BigInt, as
 * serde_json writes them); override `encodeAddend`/`decodeAddend` and
 * `encodeState`/`decodeState` (text in, text out) for a faster or stricter
 * encoding (`encodeAddend` may return the UTF-8 bytes instead: a
 * `Uint8Array` the plugin may keep and hand out again, as the host copies
 * it), and `decodeEvent(bytes, record)` to read records otherwise (e.g. a
 * pattern for the common shape of a record first, `JsonEvent.parse` of
 * the text for the rest).
 */
export class Periods {
  constructor(config) {
    this.config = config;
  }
  decodeEvent(bytes, record) {
    return JsonEvent.decode(bytes, record);
  }
  describe(_event) {
    throw new Error(`${this.constructor.name} does not implement describe`);
  }
  add(_state, _time, _addend) {
    throw new Error(`${this.constructor.name} does not implement add`);
  }
  value(_state) {
    throw new Error(`${this.constructor.name} does not implement value`);
  }
  encodeAddend(addend) {
    return encodeJsonText(addend === undefined ? null : addend);
  }
  decodeAddend(text) {
    return parseJson(text);
  }
  encodeState(state) {
    return encodeJsonText(state);
  }
  decodeState(text) {
    return parseJson(text);
  }
}

// ---- The WIT plumbing ----------------------------------------------------

/** Why a call of `add` is refused: the addition's index in the call and
 * the reason (the WIT `refusal`). */
class Refusal {
  constructor(addition, reason) {
    this.addition = addition;
    this.reason = reason;
  }
}

/** What a describe result says: its facts (`addend` as bytes) or why not. */
function facts(plugin, event) {
  let decoded;
  let described;
  try {
    decoded = plugin.decodeEvent(event.value, event);
    described = plugin.describe(decoded);
  } catch (err) {
    if (err instanceof Reject) return { tag: "err", val: err.message };
    throw err;
  }
  const { id, time, key, customer, addend } = described;
  const encoded = plugin.encodeAddend(addend);
  return {
    tag: "ok",
    val: { id, time: eventTime(time), key, customer, addend: typeof encoded === "string" ? utf8Encode(encoded) : encoded },
  };
}

/** The WIT `event-time` of a `describe`'s `time`. */
function eventTime(time) {
  if (typeof time === "string") return { tag: "rfc3339", val: time };
  if (typeof time === "bigint" || typeof time === "number") return { tag: "unix-millis", val: Number(time) };
  if (time instanceof Date) return { tag: "unix-millis", val: time.getTime() };
  throw new TypeError(`an event's time is an RFC 3339 string or Unix milliseconds, not ${String(time)}`);
}

/** Describes a batch of host events (`{ partition, offset, timestampMs,
 * key, value }`): one `{ tag: "ok", val: facts }` or `{ tag: "err", val:
 * reason }` per event, in order (the WIT `describe`). */
export function describeAll(plugin, events) {
  const results = new Array(events.length);
  for (let i = 0; i < events.length; i++) results[i] = facts(plugin, events[i]);
  return results;
}

/** Folds `additions` (`{ period, time: { seconds, nanoseconds }, addend }`)
 * in order into `states` (bytes, or null before a period's first event),
 * with `addends` (bytes) as `describe` gave them: each period's state after
 * the fold, as bytes, in order. Throws a `{ addition, reason }` refusal
 * for the first addition refused (the WIT `add`; nothing of the call counts
 * then). As the Rust SDK's `add_all`, reasons included. */
export function addAll(plugin, states, addends, additions) {
  for (let index = 0; index < additions.length; index++) {
    const addend = additions[index].addend;
    if (!(addend >= 0 && addend < addends.length)) throw new Refusal(index, `the addition names addend ${addend}, of ${addends.length}`);
  }
  const decoded = new Array(states.length);
  const seen = new Array(states.length).fill(false);
  for (let i = 0; i < states.length; i++) {
    if (states[i] == null) continue;
    try {
      decoded[i] = plugin.decodeState(utf8Decode(states[i]));
    } catch (err) {
      throw new Refusal(0, `a period's state does not decode: ${err.message}`);
    }
    seen[i] = true;
  }
  for (let index = 0; index < additions.length; index++) {
    const addition = additions[index];
    const period = addition.period;
    if (!(period >= 0 && period < decoded.length)) throw new Refusal(index, `the addition names period ${period}, of ${decoded.length}`);
    let addend;
    try {
      addend = plugin.decodeAddend(utf8Decode(addends[addition.addend]));
    } catch (err) {
      throw new Refusal(index, `the event's addend is not the JSON this plugin makes: ${err.message}`);
    }
    const time = new Instant(addition.time.seconds, addition.time.nanoseconds);
    try {
      decoded[period] = plugin.add(seen[period] ? decoded[period] : undefined, time, addend);
    } catch (err) {
      if (err instanceof Reject) throw new Refusal(index, err.message);
      throw err;
    }
    seen[period] = true;
  }
  const folded = new Array(decoded.length);
  for (let i = 0; i < decoded.length; i++) {
    if (!seen[i]) throw new Refusal(0, `period ${i} has neither a state nor an addition`);
    folded[i] = utf8Encode(plugin.encodeState(decoded[i]));
  }
  return folded;
}

/** The value of a period whose state is `state` (bytes): a BigInt from 0 to
 * 2^64 - 1 (a value out of that range is a bug: it throws). */
export function valueOf(plugin, state) {
  const value = BigInt(plugin.value(plugin.decodeState(utf8Decode(state))));
  if (value < 0n || value > U64_MAX) throw new RangeError(`a period's value must be 0 to 2^64 - 1, not ${value}`);
  return value;
}

/** `value` as the WIT `u64` result. componentize-qjs 0.4.5 lowers a u64
 * from a double (a BigInt traps), so only values a double holds exactly
 * reach the host as they are, and 2^64 - 1 (its double, 2^64, saturates to
 * it). Any other value past 2^53 would reach the host rounded: a wrong
 * bill. It traps instead, saying why, and the host stops the job. */
export function lowerU64(value) {
  const number = Number(value);
  if (BigInt(number) === value || value === U64_MAX) return number;
  const reason = `a period's value, ${value}, is past 2^53 and not one a double holds exactly; componentize-qjs returns a u64 through a double, so this JavaScript build cannot return it exactly`;
  hostLog("error", reason);
  throw new RangeError(reason);
}

/** Makes the configured plugin of class `Plugin` from `[plugin_config]`
 * JSON text, or throws the message that refuses the job. */
export function configurePlugin(Plugin, json) {
  let config;
  try {
    config = parseJson(json);
  } catch (err) {
    throw `[plugin_config] does not fit this plugin: ${err.message}`;
  }
  try {
    return new Plugin(config);
  } catch (err) {
    throw err instanceof Error ? err.message : String(err);
  }
}

/**
 * The component's exports for a period plugin class: `export const {
 * config, periods } = exportPeriods(MyPlugin)`. `config.configure` makes
 * the instance's plugin; `periods` describes, adds and values with it.
 */
export function exportPeriods(Plugin) {
  let plugin;
  const configured = () => {
    if (plugin === undefined) throw new Error("the host called the plugin before configure");
    return plugin;
  };
  return {
    config: {
      configure(json) {
        plugin = configurePlugin(Plugin, json);
      },
    },
    periods: {
      describe: (events) => describeAll(configured(), events),
      add: (states, addends, additions) => addAll(configured(), states, addends, additions),
      // componentize-qjs lowers a u64 result from a Number.
      value: (state) => lowerU64(valueOf(configured(), state)),
    },
  };
}

// ---- Reading records exactly ----------------------------------------------

/** Whether `text` has no lone surrogate (is valid Unicode). */
export function isWellFormed(text) {
  return !LONE_SURROGATE.test(text);
}

/** Orders strings by their UTF-8 bytes (Unicode code points), as Rust
 * orders `String`s, rather than by UTF-16 units as `<` does. */
export function compareUtf8(a, b) {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  if (i === n) return a.length - b.length;
  let x = a.charCodeAt(i);
  let y = b.charCodeAt(i);
  // Surrogates (U+10000 and up) sort after U+E000..U+FFFF by code point.
  if (x >= 0xd800 && y >= 0xd800) {
    x = x >= 0xe000 ? x - 0x800 : x + 0x2000;
    y = y >= 0xe000 ? y - 0x800 : y + 0x2000;
  }
  return x - y;
}

/** `text` as a JSON string, as serde_json writes it. */
export function quoteJson(text) {
  return JSON.stringify(text);
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const INTEGER = /^-?(0|[1-9][0-9]*)$/;
/** After a field's name: the colon and a value that holds no nesting. */
const FLAT_VALUE = /[ \t\n\r]*:[ \t\n\r]*(-?[0-9][0-9.eE+-]*|"[^"\\]*"|true|false|null)/y;
const SPACE = /[ \t\n\r]*/y;
const SPACES = /[ \t\n\r]/g;
const STRING = /"[^"\\]*(?:\\.[^"\\]*)*"/y;
/** One token of a nested value: a run of scalars, a string or a bracket. */
const TOKEN = /[^"[\]{}]+|"[^"\\]*(?:\\.[^"\\]*)*"|[[\]{}]/y;
const SCALAR = /-?[0-9][0-9.eE+-]*|true|false|null/y;

/** The top-level members of valid JSON object text: `[name, start, end]`. */
function scanMembers(text) {
  const members = [];
  let at = skipSpace(text, text.indexOf("{") + 1);
  while (text[at] !== "}") {
    STRING.lastIndex = at;
    const name = STRING.exec(text)[0];
    const start = skipSpace(text, skipSpace(text, STRING.lastIndex) + 1); // past the colon
    let end;
    const c = text[start];
    if (c === "{" || c === "[") {
      let depth = 0;
      TOKEN.lastIndex = start;
      do {
        const token = TOKEN.exec(text)[0];
        if (token === "{" || token === "[") depth++;
        else if (token === "}" || token === "]") depth--;
      } while (depth > 0);
      end = TOKEN.lastIndex;
    } else {
      const scalar = c === '"' ? STRING : SCALAR;
      scalar.lastIndex = start;
      scalar.test(text);
      end = scalar.lastIndex;
    }
    members.push([name.indexOf("\\") < 0 ? name.slice(1, -1) : JSON.parse(name), start, end]);
    at = skipSpace(text, end);
    if (text[at] === ",") at = skipSpace(text, at + 1);
  }
  return members;
}

function skipSpace(text, at) {
  SPACE.lastIndex = at;
  SPACE.test(text);
  return SPACE.lastIndex;
}

/** Whether `text` nests deeper than `MAX_DEPTH` (as the Rust SDK counts:
 * brackets outside strings). */
function tooDeep(text) {
  const brackets = text.replace(/"[^"\\]*(?:\\.[^"\\]*)*"/g, "").replace(/[^[\]{}]+/g, "");
  if (brackets.length <= MAX_DEPTH) return false;
  let depth = 0;
  for (let i = 0; i < brackets.length; i++) {
    const c = brackets[i];
    if (c === "[" || c === "{") {
      if (++depth > MAX_DEPTH) return true;
    } else if (depth > 0) {
      depth--;
    }
  }
  return false;
}
