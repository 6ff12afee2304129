// Types of Tally's JavaScript SDK (tally.js). TypeScript plugins compile
// to JavaScript first; `tally plugin build` builds the .js.

import type { Json } from "./json.js";
export { Reject, JsonNumber, DUPLICATES, MAX_DEPTH, decodeJson, parseJson, encodeJson, encodeJsonText, utf8Encode, utf8Decode } from "./json.js";
export type { Json, JsonOptions } from "./json.js";

/** One record handed to the plugin by the host. */
export interface HostEvent {
  /** Index of the source partition within the job. */
  partition: number;
  /** Position of the record in its partition; `(partition, offset)` names it for good. */
  offset: number;
  /** Record timestamp in ms since the Unix epoch, when the source has one. */
  timestampMs: number | null;
  /** Record key, when the source has one. */
  key: Uint8Array | null;
  /** The record's bytes, exactly as read. */
  value: Uint8Array;
}

/** An event the plugin refuses, by its index in the batch. */
export interface Rejection {
  index: number;
  reason: string;
}

/** A keyed aggregation, folded per key; see `aggregate`. */
export interface AggregateSpec<Event, Key extends Json, State extends Json, Output extends Json = State> {
  /** The output emitted records go to; the job must declare it. */
  output: string;
  /** The event from a record's bytes (default: `decodeJson`); throw `Reject` to refuse it. */
  decode?: (bytes: Uint8Array) => Event;
  /** The key an event belongs to (stored as JSON). */
  key: (event: Event) => Key;
  /** The state of a key never written. */
  initial: () => State;
  /** The key's next state after `event` (do not mutate `state`); throw `Reject` to refuse it. */
  apply: (state: State, event: Event, key: Key) => State;
  /** What to emit after an update; `undefined` emits nothing. */
  emit?: (state: State, key: Key) => Output | undefined;
}

/** What a plugin module exports as `aggregator`. */
export interface Aggregator {
  process(events: HostEvent[]): Rejection[];
}

export function aggregate<Event, Key extends Json, State extends Json, Output extends Json = State>(
  spec: AggregateSpec<Event, Key, State, Output>,
): Aggregator;

/** The raw batch interface: bytes in, rejections out, effects through the host calls. */
export function raw(process: (events: HostEvent[]) => Rejection[]): Aggregator;

export const log: Record<"trace" | "debug" | "info" | "warn" | "error", (message: string) => void>;

export function getMany(keys: Uint8Array[]): (Uint8Array | null)[];
export function putMany(entries: [Uint8Array, Uint8Array][]): void;
export function emitMany(output: string, records: { event: number; key?: Uint8Array | null; value: Uint8Array }[]): void;
