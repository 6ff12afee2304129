// The billing plugin under node's test runner (`npm test`), through
// Tally's JavaScript test driver: the rules of docs/billing.md.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PluginTest } from "tally/testing";

const usage = (customer, quantity, ts) => `{"customer":"${customer}","metric":"api_calls","quantity":${quantity},"ts":"${ts}"}`;
const key = (customer, period) => ({ customer, metric: "api_calls", period });

test("every update emits the running total of its key, by UTC month", async () => {
  const plugin = await PluginTest.load(new URL("./billing.js", import.meta.url), ["totals"]);
  const sent = plugin.send([
    usage("acme", 3, "2026-11-03T10:00:00Z"),
    usage("acme", 4, "2026-12-01T00:30:00+01:00"), // still November in UTC
    usage("acme", 5, "2026-12-01T00:30:00Z"),
  ]);
  assert.deepEqual(sent.deadLetters, []);
  assert.deepEqual(sent.outputs.map((record) => record.value), ["3", "7", "5"]);
  assert.equal(sent.outputs[1].key, JSON.stringify(key("acme", "2026-11")));
  assert.equal(plugin.state(key("acme", "2026-11")), 7);
});

test("bad events are refused with the reasons of docs/billing.md and change nothing", async () => {
  const plugin = await PluginTest.load(new URL("./billing.js", import.meta.url), ["totals"]);
  const sent = plugin.send([
    usage("acme", 2, "2026-11-03T10:00:00Z"),
    '{"customer":"acme"',
    '{"metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}',
    usage("acme", -3, "2026-11-03T10:00:00Z"),
    usage("acme", 2.5, "2026-11-03T10:00:00Z"),
    usage("acme", '"7"', "2026-11-03T10:00:00Z"),
    usage("acme", 1, "last tuesday"),
    usage("acme", "18446744073709551615", "2026-11-03T10:00:00Z"),
    new Uint8Array([0xff]),
    usage("acme", 5, "2026-11-03T10:00:00Z"),
  ]);
  assert.deepEqual(sent.deadLetters, [
    { offset: 1, reason: "event is not valid JSON" },
    { offset: 2, reason: "field `customer` is missing" },
    { offset: 3, reason: "quantity must be a non-negative integer, got -3" },
    { offset: 4, reason: "quantity must be a non-negative integer, got 2.5" },
    { offset: 5, reason: "field `quantity` must be a number" },
    { offset: 6, reason: 'ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got "last tuesday"' },
    { offset: 7, reason: "total would overflow adding 18446744073709551615" },
    { offset: 8, reason: "event is not UTF-8" },
  ]);
  assert.deepEqual(sent.outputs.map((record) => record.value), ["2", "7"]);
  assert.equal(plugin.allState().length, 1);
});

test("totals past 2^53 stay exact", async () => {
  const plugin = await PluginTest.load(new URL("./billing.js", import.meta.url), ["totals"]);
  plugin.send([usage("big", "9007199254740993", "2026-11-03T10:00:00Z")]);
  const sent = plugin.send([usage("big", 2, "2026-11-03T10:00:00Z")]);
  assert.equal(sent.outputs[0].value, "9007199254740995");
});
