// Tally's test driver for JavaScript plugins, for node's own test runner:
//
//   import { test } from "node:test";
//   import assert from "node:assert/strict";
//   import { PluginTest } from "tally/testing";
//
//   test("totals add up", async () => {
//     const plugin = await PluginTest.load(new URL("./billing.js", import.meta.url), ["totals"]);
//     const sent = plugin.send(['{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}']);
//     assert.deepEqual(sent.deadLetters, []);
//   });
//
// It runs the plugin's module under node against an in-memory host (the
// same `tally:plugin` calls a component makes), so a test needs no build.
// `tally plugin build` and the host's own tests check the component.

import { register } from "node:module";

register("./testing/hooks.js", import.meta.url);
const { host } = await import("./testing/host.js");
const { encodeJsonText } = await import("./tally.js");
const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** A plugin loaded for testing, with its state kept across `send`s. */
export class PluginTest {
  /** Loads the plugin module at `url` (it exports `aggregator`) for a job declaring `outputs`. */
  static async load(url, outputs) {
    const module = await import(url);
    if (typeof module.aggregator?.process !== "function") throw new Error(`${url} exports no aggregator with a process function`);
    host.state.clear();
    host.declared = new Set(outputs);
    return new PluginTest(module.aggregator);
  }

  constructor(aggregator) {
    this.aggregator = aggregator;
    this.offset = 0;
  }

  /** Sends one batch (strings or bytes) on partition 0; returns what it emitted
   * (`outputs`: `{ output, event, key, value }`, text) and refused (`deadLetters`:
   * `{ offset, reason }`). */
  send(records) {
    const events = records.map((record) => ({
      partition: 0,
      offset: this.offset++,
      timestampMs: null,
      key: null,
      value: typeof record === "string" ? encoder.encode(record) : Uint8Array.from(record),
    }));
    host.outputs = [];
    const rejections = this.aggregator.process(events);
    const text = (bytes) => (bytes == null ? null : decoder.decode(bytes));
    return {
      outputs: host.outputs.map(({ output, event, key, value }) => ({ output, event, key: text(key), value: text(value) })),
      deadLetters: rejections.map(({ index, reason }) => ({ offset: events[index].offset, reason })),
    };
  }

  /** The stored state of key `key` (any JSON value, as `key` returned it), parsed, or `undefined`. */
  state(key) {
    const stored = host.state.get(String.fromCharCode(...encoder.encode(encodeJsonText(key))));
    return stored === undefined ? undefined : JSON.parse(decoder.decode(stored));
  }

  /** Every stored entry, as `[key text, value text]`, by key. */
  allState() {
    return [...host.state].map(([key, value]) => [decoder.decode(Uint8Array.from(key, (c) => c.charCodeAt(0))), decoder.decode(value)]).sort();
  }
}
