// Tally's JavaScript SDK: write an aggregation plugin as a plain object,
// build it with `tally plugin build <dir>` into a component that imports
// nothing but `tally:plugin` (state, output, log).
//
//   import { aggregate, Reject } from "tally";
//   export const aggregator = aggregate({
//     output: "totals",
//     key: (event) => event.customer,
//     initial: () => 0n,
//     apply: (total, event) => total + BigInt(event.n),
//     emit: (total) => total,
//   });
//
// The semantics are the Rust SDK's (`sdk/rust/src/aggregate.rs`), so a
// plugin ported between them computes the same bytes: one state read and
// one write per batch, keys and states stored as JSON, an emitted record
// keyed by its state key, rejections in event order. See docs/sdk-js.md.

import { getMany, putMany } from "tally:plugin/state@0.1.0";
import { emitMany } from "tally:plugin/output@0.1.0";
import { log as hostLog } from "tally:plugin/log@0.1.0";
import { loggerFor } from "./logger.js";
import { Reject, decodeJson, encodeJson, encodeJsonText, utf8Encode } from "./json.js";

// The codecs and `Reject` live in json.js (shared with `tally/periods`).
export { Reject, JsonNumber, MAX_DEPTH, DUPLICATES, decodeJson, parseJson, encodeJson, encodeJsonText, utf8Encode, utf8Decode } from "./json.js";

/** Writes one line to the host's log (the host rate-limits and labels it). */
export const log = loggerFor(hostLog);

/** The raw batch interface: `process(events)` gets the host's events
 * (`{ partition, offset, timestampMs, key, value }`, bytes as Uint8Array)
 * and returns `[{ index, reason }]`. Use `state` and `output` for effects. */
export function raw(process) {
  return { process };
}

export { getMany, putMany, emitMany };

/** A keyed aggregation. `spec`:
 * - `output`: the output emitted records go to (the job declares it);
 * - `decode(bytes)`: the event from a record's value (default: JSON, with
 *   integers as BigInt; see `decodeJson`); throw `Reject` to refuse it;
 * - `key(event)`: the state key, any JSON-encodable value;
 * - `initial()`: the state of a key never written;
 * - `apply(state, event, key)`: the next state (never mutate `state`);
 * - `emit(state, key)`: what to emit after an update (`undefined`: nothing).
 */
export function aggregate(spec) {
  const decode = spec.decode ?? ((bytes) => decodeJson(bytes));
  const emit = spec.emit ?? (() => undefined);
  return {
    process(events) {
      const rejections = [];
      const slotOf = new Map(); // encoded key (a string) -> slot index
      const slots = [];
      const accepted = [];
      for (let index = 0; index < events.length; index++) {
        let event;
        let key;
        let encoded;
        try {
          event = decode(events[index].value);
          key = spec.key(event);
          encoded = encodeJsonText(key);
        } catch (err) {
          if (!(err instanceof Reject)) throw err;
          rejections.push({ index, reason: err.message });
          continue;
        }
        let slot = slotOf.get(encoded);
        if (slot === undefined) {
          slot = slots.length;
          slotOf.set(encoded, slot);
          slots.push({ keyBytes: utf8Encode(encoded), key, state: undefined, dirty: false });
        }
        accepted.push([index, slot, event]);
      }
      if (accepted.length === 0) return rejections;
      const stored = getMany(slots.map((slot) => slot.keyBytes));
      for (let i = 0; i < slots.length; i++) {
        const slot = slots[i];
        slot.state = stored[i] == null ? spec.initial() : decodeJson(stored[i]);
      }
      const records = [];
      for (const [index, slotIndex, event] of accepted) {
        const slot = slots[slotIndex];
        let next;
        try {
          next = spec.apply(slot.state, event, slot.key);
        } catch (err) {
          if (!(err instanceof Reject)) throw err;
          rejections.push({ index, reason: err.message });
          continue;
        }
        slot.state = next;
        slot.dirty = true;
        const out = emit(slot.state, slot.key);
        if (out !== undefined) records.push({ event: index, key: slot.keyBytes, value: encodeJson(out) });
      }
      const written = slots.filter((slot) => slot.dirty).map((slot) => [slot.keyBytes, encodeJson(slot.state)]);
      if (written.length > 0) putMany(written);
      if (records.length > 0) emitMany(spec.output, records);
      rejections.sort((a, b) => a.index - b.index);
      return rejections;
    },
  };
}
