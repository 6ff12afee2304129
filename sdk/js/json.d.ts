// Types of Tally's JSON and UTF-8 codecs (json.js), shared by `tally`
// (the 0.1 contract) and `tally/periods` (the period contract).

/** Why an event is refused: throw it; its message is the dead letter's reason. */
export class Reject extends Error {
  constructor(reason: string);
}

/** A value `encodeJson` can write (BigInt as an integer). */
export type Json = null | boolean | number | bigint | string | JsonNumber | Json[] | { [field: string]: Json | undefined };

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
export interface JsonOptions {
  /** `"bigint"` (default): integers as BigInt, the rest as Number; `"raw"`: every number a `JsonNumber`; `"number"`: Numbers. */
  numbers?: "bigint" | "raw" | "number";
  /** Keep lone surrogate escapes instead of refusing them. */
  loneSurrogates?: boolean;
}
export function decodeJson(bytes: Uint8Array, options?: JsonOptions): any;
/** `decodeJson` of a string. */
export function parseJson(text: string, options?: JsonOptions): any;
export function encodeJson(value: Json): Uint8Array;
export function encodeJsonText(value: Json): string;
export function utf8Encode(text: string): Uint8Array;
export function utf8Decode(bytes: Uint8Array): string;
