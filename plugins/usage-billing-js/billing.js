// Usage billing in JavaScript: the running total of metered usage per
// customer, metric and billing period (the UTC calendar month of the
// event's timestamp). It computes what plugins/usage-billing (Rust)
// computes, byte for byte, with the same dead-letter reasons: the rules are
// in docs/billing.md, and tests/all/languages.rs holds them to it.
//
// Input: {"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}

import { aggregate, decodeJson, DUPLICATES, JsonNumber, Reject } from "tally";

const FIELDS = ["customer", "metric", "quantity", "ts"];
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const U64_MAX = (1n << 64n) - 1n;

function decode(bytes) {
  const event = decodeJson(bytes, { numbers: "raw", loneSurrogates: true });
  // A number alone is read as a float, so one out of range is not JSON.
  if (event instanceof JsonNumber && !event.isFinite()) throw new Reject("event is not valid JSON");
  if (event === null || typeof event !== "object" || Array.isArray(event) || event instanceof JsonNumber) {
    throw new Reject("event must be a JSON object");
  }
  for (const field of FIELDS) {
    if (event[DUPLICATES]?.has(field)) throw new Reject(`field \`${field}\` is given twice`);
    if (!Object.prototype.hasOwnProperty.call(event, field)) throw new Reject(`field \`${field}\` is missing`);
  }
  for (const field of FIELDS) {
    const value = event[field];
    if (field === "quantity" ? !(value instanceof JsonNumber) : typeof value !== "string") {
      throw new Reject(`field \`${field}\` must be ${field === "quantity" ? "a number" : "a string"}`);
    }
    // A lone surrogate escape is kept by the decoder (other fields may
    // hold one and are ignored), but it is no text: the event is not JSON.
    if (field !== "quantity" && LONE_SURROGATE.test(value)) throw new Reject("event is not valid JSON");
  }
  return event;
}

export const aggregator = aggregate({
  output: "totals",
  decode,
  key: (usage) => ({ customer: usage.customer, metric: usage.metric, period: billingPeriod(usage.ts) }),
  initial: () => 0n,
  apply(total, usage) {
    const text = usage.quantity.text;
    const quantity = /^[0-9]+$/.test(text) ? BigInt(text) : -1n;
    if (quantity < 0n || quantity > U64_MAX) throw new Reject(`quantity must be a non-negative integer, got ${text}`);
    if (total + quantity > U64_MAX) throw new Reject(`total would overflow adding ${quantity}`);
    return total + quantity;
  },
  emit: (total) => total,
});

const TIMESTAMP = /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|([+-])([0-9]{2}):([0-9]{2}))$/;

/** `YYYY-MM` of the UTC month of RFC 3339 timestamp `ts`. */
function billingPeriod(ts) {
  const refuse = () => {
    throw new Reject(`ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got ${JSON.stringify(ts)}`);
  };
  const parts = TIMESTAMP.exec(ts);
  if (parts === null) refuse();
  let [year, month, day, hour, minute, second] = parts.slice(1, 7).map(Number);
  const offset = parts[9] === undefined ? 0 : (parts[9] === "-" ? -1 : 1) * (Number(parts[10]) * 60 + Number(parts[11]));
  if (month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || second > 60) refuse();
  if (parts[9] !== undefined && (Number(parts[10]) > 23 || Number(parts[11]) > 59)) refuse();
  const minutes = hour * 60 + minute - offset;
  if (minutes < 0 && day === 1) {
    month -= 1;
    if (month === 0) [year, month] = [year - 1, 12];
  } else if (minutes >= 24 * 60 && day === daysIn(year, month)) {
    month += 1;
    if (month === 13) [year, month] = [year + 1, 1];
  }
  year = Math.min(Math.max(year, 0), 9999);
  return String(year).padStart(4, "0") + "-" + String(month).padStart(2, "0");
}

function daysIn(year, month) {
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  return [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
}
