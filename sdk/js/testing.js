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

// ---- Period plugins (tally:plugin@0.2.0) ----------------------------------

/**
 * A period plugin loaded for testing: its module's `config` and `periods`
 * exports, called as the host calls them (bytes in, bytes out), with the
 * results as text. `fold` plays the host's part for one period per key.
 *
 *   const plugin = await PeriodsTest.load(new URL("./billing.js", import.meta.url), { meters: { calls: "sum" } });
 *   const [facts] = plugin.describe(['{"id":"1","customer":"acme","metric":"calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}']);
 *   assert.equal(facts.addend, '{"sum":3}');
 */
export class PeriodsTest {
  /** Loads the plugin module at `url` (it exports `config` and `periods`)
   * and configures it with `config` (a value, encoded as JSON; default
   * `{}`). Throws the plugin's message when it refuses the configuration. */
  static async load(url, config = {}) {
    const module = await import(url);
    if (typeof module.config?.configure !== "function" || typeof module.periods?.describe !== "function") {
      throw new Error(`${url} exports no period plugin (\`config\` and \`periods\`; see exportPeriods)`);
    }
    module.config.configure(typeof config === "string" ? config : encodeJsonText(config));
    return new PeriodsTest(module);
  }

  constructor(module) {
    this.module = module;
    this.offset = 0;
  }

  /** Describes a batch of records (strings or bytes) on partition 0: per
   * record, its facts (`{ id, time, key, customer, addend }`, the time as
   * `{ rfc3339 }` or `{ unixMillis }` and the addend as text) or
   * `{ error }`, the reason it is malformed. */
  describe(records) {
    const events = records.map((record) => ({
      partition: 0,
      offset: this.offset++,
      timestampMs: null,
      key: null,
      value: typeof record === "string" ? encoder.encode(record) : Uint8Array.from(record),
    }));
    return this.module.periods.describe(events).map((result) => {
      if (result.tag === "err") return { error: result.val };
      const { id, time, key, customer, addend } = result.val;
      const at = time.tag === "rfc3339" ? { rfc3339: time.val } : { unixMillis: time.val };
      return { id, time: at, key, customer, addend: decoder.decode(addend) };
    });
  }

  /** The WIT `add`, with text: `states` (text or null), `addends` (text),
   * `additions` (`{ period, time: { seconds, nanoseconds }, addend }`; a
   * time may be given as seconds alone). Returns `{ states }` (text) or
   * `{ refusal: { addition, reason } }`. */
  add(states, addends, additions) {
    try {
      const folded = this.module.periods.add(
        states.map((state) => (state == null ? null : encoder.encode(state))),
        addends.map((addend) => encoder.encode(addend)),
        additions.map(({ period = 0, time = 0, addend }) => ({ period, time: typeof time === "object" ? time : { seconds: time, nanoseconds: 0 }, addend })),
      );
      return { states: folded.map((state) => decoder.decode(state)) };
    } catch (refusal) {
      if (typeof refusal?.reason !== "string") throw refusal;
      return { refusal: { addition: refusal.addition, reason: refusal.reason } };
    }
  }

  /** The value of a period whose state is `state` (text), as the host reads it. */
  value(state) {
    return this.module.periods.value(encoder.encode(state));
  }

  /** Plays the host for events `[record, seconds]`: describes them, folds
   * each accepted one (alone, as the host does after a refusal) into its
   * key's one period, and returns `{ states, values, errors }`: per key
   * (`customer/metric/...` of its key values joined by "/"), the state
   * text and value, and per refused or malformed event its index and
   * reason. */
  fold(events) {
    const states = new Map();
    const errors = [];
    const described = this.describe(events.map(([record]) => record));
    described.forEach((facts, index) => {
      if (facts.error !== undefined) return errors.push({ index, reason: `malformed: ${facts.error}` });
      const key = facts.key.map(([, value]) => value).join("/");
      const added = this.add([states.get(key) ?? null], [facts.addend], [{ period: 0, time: events[index][1], addend: 0 }]);
      if (added.refusal) return errors.push({ index, reason: `refused: ${added.refusal.reason}` });
      states.set(key, added.states[0]);
    });
    const values = new Map([...states].map(([key, state]) => [key, this.value(state)]));
    return { states, values, errors };
  }
}
