// Types of Tally's period SDK (periods.js, the module `tally/periods`):
// period plugins for `tally:plugin@0.2.0`, world `periods-plugin`.
// TypeScript plugins are compiled to JavaScript by the build (tsc), then
// made into a component; see docs/sdk-js.md.

import type { Json } from "./json.js";
export { Reject, JsonNumber, DUPLICATES, MAX_DEPTH, decodeJson, parseJson, encodeJson, encodeJsonText, utf8Encode, utf8Decode } from "./json.js";
export type { Json, JsonOptions } from "./json.js";

/** One record handed to `describe` by the host. */
export interface HostEvent {
  /** Index of the source partition within the job. */
  partition: number;
  /** Position of the record in its partition. */
  offset: number;
  /** Record timestamp in ms since the Unix epoch, when the source has one. */
  timestampMs: number | null;
  /** Record key, when the source has one. */
  key: Uint8Array | null;
  /** The record's bytes, exactly as read. */
  value: Uint8Array;
}

/** Writes one line to the host's log. */
export const log: Record<"trace" | "debug" | "info" | "warn" | "error", (message: string) => void>;

/** The largest value a period may have, 2^64 - 1. */
export const U64_MAX: bigint;

/** An instant as the host read an event's time. */
export class Instant {
  constructor(seconds: number | bigint, nanoseconds?: number);
  /** Seconds since the Unix epoch (exact: the host's instants lie within years 0 to 9999). */
  readonly seconds: number;
  /** Nanoseconds within the second, 0 to 999,999,999. */
  readonly nanoseconds: number;
  /** Negative, zero or positive as this is before, at or after `other`. */
  compare(other: Instant): number;
}

/**
 * A record decoded as JSON: what `describe` gets by default. Decoding
 * refuses (with `Reject`) what serde_json refuses when it reads a record
 * into a struct: not UTF-8, not one JSON value, deeper than 128 levels, a
 * top-level string or field name with a lone surrogate escape, a top-level
 * number out of a double's range. Values inside are `JSON.parse`'s.
 */
export class JsonEvent<Value = unknown> {
  static decode(bytes: Uint8Array, record?: HostEvent): JsonEvent;
  /** `decode` of a record's text (its bytes read as UTF-8, e.g. by `utf8Decode`). */
  static parse(text: string, record?: HostEvent): JsonEvent;
  /** The record as text. */
  readonly text: string;
  /** The record as `JSON.parse` reads it (numbers as Numbers: see `written`, `integer`). */
  readonly value: Value;
  /** Whether the text has an escape (`\`); without one no string holds a lone surrogate. */
  readonly escaped: boolean;
  readonly partition: number | undefined;
  readonly offset: number | undefined;
  readonly timestampMs: number | null;
  readonly key: Uint8Array | null;
  /** Whether the record is a JSON object. */
  isObject(): boolean;
  /** How many times the record (an object) gives field `name`. */
  count(name: string): number;
  /** Field `name`'s text as written (of a field given twice, the last), or `undefined`. */
  written(name: string): string | undefined;
  /** Field `name` as an exact BigInt when written as an integer, else `undefined`. */
  integer(name: string): bigint | undefined;
  /** The top-level fields in order: `[name, start, end]` of each value in `text`. */
  members(): ReadonlyArray<readonly [string, number, number]>;
}

/** When an event happened: an RFC 3339 string with its offset, or Unix milliseconds. */
export type EventTime = string | number | bigint | Date;

/** What an event says about itself, and what it adds to its period. */
export interface FactsFields<Addend> {
  /** The producer's id of the event (a retry carries the same one); at most 256 bytes. */
  id: string;
  /** When it happened. */
  time: EventTime;
  /** The aggregation key's fields, in order (`customer`, `metric`). */
  key: Array<[string, string]>;
  /** The customer whose time zone decides the event's period. */
  customer: string;
  /** What the event adds to its period: kept by the host and handed to `add`. */
  addend: Addend;
}
export class Facts<Addend> implements FactsFields<Addend> {
  constructor(fields: FactsFields<Addend>);
  id: string;
  time: EventTime;
  key: Array<[string, string]>;
  customer: string;
  addend: Addend;
}

/**
 * The aggregation of a period job: extend it and export the class with
 * `exportPeriods`. `State` and `Addend` travel as JSON (integers as
 * BigInt) unless the codecs are overridden (text in, text out).
 */
export abstract class Periods<State, Addend, Config = any, Event = JsonEvent> {
  /** The job's `[plugin_config]`; throw to refuse the job with the error's message. */
  constructor(config: Config);
  readonly config: Config;
  /** Reads a record (default: `JsonEvent.decode`); throw `Reject` for a malformed one. */
  decodeEvent(bytes: Uint8Array, record: HostEvent): Event;
  /** What `event` says about itself and adds to its period; throw `Reject` for a malformed one. */
  abstract describe(event: Event): FactsFields<Addend>;
  /** The period's state after `addend` (of an event at `time`) is added to `state` (`undefined`: its first event); throw `Reject` to refuse the event. */
  abstract add(state: State | undefined, time: Instant, addend: Addend): State;
  /** The period's value, 0 to 2^64 - 1. */
  abstract value(state: State): bigint | number;
  /** The addend as JSON text, or as its UTF-8 bytes (which the plugin may keep and return again: the host copies them). */
  encodeAddend(addend: Addend): string | Uint8Array;
  decodeAddend(text: string): Addend;
  encodeState(state: State): string;
  decodeState(text: string): State;
}

/** A period plugin class: constructed with the job's configuration. */
export type PeriodsClass = new (config: any) => Periods<any, any, any, any>;

/** The WIT `event-facts`, as the component returns them. */
export interface WitFacts {
  id: string;
  time: { tag: "rfc3339"; val: string } | { tag: "unix-millis"; val: number };
  key: Array<[string, string]>;
  customer: string;
  addend: Uint8Array;
}
/** The WIT `addition`. */
export interface Addition {
  period: number;
  time: { seconds: number; nanoseconds: number };
  addend: number;
}
/** The WIT `refusal`: thrown by `add`. */
export interface Refusal {
  addition: number;
  reason: string;
}

/** The component's exports: `export const { config, periods } = exportPeriods(MyPlugin)`. */
export function exportPeriods(Plugin: PeriodsClass): {
  config: { configure(json: string): void };
  periods: {
    describe(events: HostEvent[]): Array<{ tag: "ok"; val: WitFacts } | { tag: "err"; val: string }>;
    add(states: Array<Uint8Array | null>, addends: Uint8Array[], additions: Addition[]): Uint8Array[];
    value(state: Uint8Array): number;
  };
};

/** The plumbing `exportPeriods` uses, for tests and other drivers. */
export function configurePlugin<P extends PeriodsClass>(Plugin: P, json: string): InstanceType<P>;
export function describeAll(plugin: Periods<any, any, any, any>, events: HostEvent[]): Array<{ tag: "ok"; val: WitFacts } | { tag: "err"; val: string }>;
export function addAll(plugin: Periods<any, any, any, any>, states: Array<Uint8Array | null>, addends: Uint8Array[], additions: Addition[]): Uint8Array[];
export function valueOf(plugin: Periods<any, any, any, any>, state: Uint8Array): bigint;
/** A value as the WIT u64 result (componentize-qjs lowers it through a double): throws for one past 2^53 a double does not hold, but 2^64 - 1. */
export function lowerU64(value: bigint): number;

/** Whether `text` holds no lone surrogate. */
export function isWellFormed(text: string): boolean;
/** Orders strings by UTF-8 bytes (code points), as Rust orders `String`s. */
export function compareUtf8(a: string, b: string): number;
/** `text` as a JSON string, as serde_json writes it. */
export function quoteJson(text: string): string;
