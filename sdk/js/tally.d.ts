// Types of Tally's JavaScript SDK (tally.js). TypeScript plugins compile
// to JavaScript first; `tally plugin build` builds the .js.

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

/** Why an event is refused: throw it; its message is the dead letter's reason. */
export class Reject extends Error {
  constructor(reason: string);
}

/** A value `encodeJson` can write (BigInt as an integer). */
export type Json = null | boolean | number | bigint | string | JsonNumber | Json[] | { [field: string]: Json | undefined };

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

/** A JSON number kept as it was written (`decodeJson(bytes, { numbers: "raw" })`). */
export class JsonNumber {
  readonly text: string;
  isInteger(): boolean;
  /** Whether it reads as a finite double (`1e400` does not). */
  isFinite(): boolean;
}

/** Fields an object decoded by `decodeJson` was given more than once. */
export const DUPLICATES: unique symbol;
export const MAX_DEPTH: number;

/** Strict JSON from UTF-8 bytes; throws `Reject` ("event is not UTF-8", "event is not valid JSON"). */
export function decodeJson(bytes: Uint8Array, options?: { numbers?: "bigint" | "raw" | "number"; loneSurrogates?: boolean }): any;
export function encodeJson(value: Json): Uint8Array;
export function encodeJsonText(value: Json): string;
export function utf8Encode(text: string): Uint8Array;
export function utf8Decode(bytes: Uint8Array): string;

export const log: Record<"trace" | "debug" | "info" | "warn" | "error", (message: string) => void>;

export function getMany(keys: Uint8Array[]): (Uint8Array | null)[];
export function putMany(entries: [Uint8Array, Uint8Array][]): void;
export function emitMany(output: string, records: { event: number; key?: Uint8Array | null; value: Uint8Array }[]): void;
