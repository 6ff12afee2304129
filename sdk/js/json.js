// Tally's JSON and UTF-8 codecs, exactly as the Rust SDK's serde_json
// reads and writes them. This module imports nothing from the host, so
// both contracts' SDK modules share it: `tally` (tally.js, the 0.1
// `process` contract) and `tally/periods` (periods.js, the 0.2.0 period
// contract) re-export what is here.

/** Why an event is refused: throw it from the plugin's code. Its message
 * reaches the dead-letter output as is. Any other exception is a bug: the
 * plugin traps, and the host dead-letters the event alone. */
export class Reject extends Error {
  constructor(reason) {
    super(reason);
    this.name = "Reject";
  }
}

// ---- JSON, exactly -------------------------------------------------------

/** A JSON number kept as its source text (`decodeJson(bytes, { numbers: "raw" })`). */
export class JsonNumber {
  constructor(text) {
    this.text = text;
  }
  /** Whether it is written as an integer (no fraction, no exponent). */
  isInteger() {
    return /^-?[0-9]+$/.test(this.text);
  }
  /** Whether it reads as a finite double (`1e400` does not), decided
   * exactly: the least number that rounds to infinity is 2^1024 - 2^970
   * (QuickJS's own parsing rounds that tie the other way). */
  isFinite() {
    const [, int, fraction = "", exp = "0"] = /^-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?$/.exec(this.text);
    const digits = (int + fraction).replace(/^0+/, "");
    if (digits === "") return true;
    // The power of ten of the first significant digit.
    const power = BigInt(int.length - ((int + fraction).length - digits.length) - 1) + BigInt(exp);
    if (power !== 308n) return power < 308n;
    return digits.padEnd(DOUBLE_OVERFLOW.length, "0") < DOUBLE_OVERFLOW;
  }
  toString() {
    return this.text;
  }
}

const DOUBLE_OVERFLOW = "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792";

/** Most nesting a decoded value may have (as serde_json's limit). */
export const MAX_DEPTH = 128;

/**
 * Decodes UTF-8 JSON bytes as strictly as RFC 8259 (and serde_json): no
 * comments, trailing commas, leading zeros or lone surrogate escapes
 * (unless `loneSurrogates`: then they are kept as they are); at most
 * `MAX_DEPTH` levels. Numbers: `"bigint"` (default) gives integers as
 * BigInt and the rest as Number; `"raw"` gives every number as a
 * `JsonNumber`; `"number"` gives Numbers. Throws `Reject` with
 * "event is not UTF-8" or "event is not valid JSON".
 */
export function decodeJson(bytes, options) {
  return parseJson(utf8Decode(bytes), options);
}

/** `decodeJson` of a text (a JavaScript string) rather than bytes. */
export function parseJson(text, { numbers = "bigint", loneSurrogates = false } = {}) {
  const parser = new Parser(text, numbers, loneSurrogates);
  parser.space();
  const value = parser.value(0);
  parser.space();
  if (parser.at < text.length) parser.fail();
  return value;
}

class Parser {
  constructor(text, numbers, loneSurrogates) {
    this.text = text;
    this.at = 0;
    this.numbers = numbers;
    this.loneSurrogates = loneSurrogates;
  }
  fail() {
    throw new Reject("event is not valid JSON");
  }
  space() {
    // Sticky expressions scan in one native call: the interpreter's loop
    // per character was most of a batch's time.
    SPACE.lastIndex = this.at;
    SPACE.test(this.text);
    this.at = SPACE.lastIndex;
  }
  value(depth) {
    const c = this.text[this.at];
    if (c === "{") return this.object(depth + 1);
    if (c === "[") return this.array(depth + 1);
    if (c === '"') return this.string();
    if (c === "t") return this.word("true", true);
    if (c === "f") return this.word("false", false);
    if (c === "n") return this.word("null", null);
    return this.number();
  }
  word(word, value) {
    if (this.text.startsWith(word, this.at)) {
      this.at += word.length;
      return value;
    }
    this.fail();
  }
  object(depth) {
    if (depth > MAX_DEPTH) this.fail();
    this.at++;
    const object = {};
    this.space();
    if (this.text[this.at] === "}") {
      this.at++;
      return object;
    }
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') this.fail();
      const key = this.string();
      this.space();
      if (this.text[this.at] !== ":") this.fail();
      this.at++;
      this.space();
      const value = this.value(depth);
      if (Object.prototype.hasOwnProperty.call(object, key)) {
        // Kept as a list, so a decoder can refuse a field given twice.
        (object[DUPLICATES] ??= new Set()).add(key);
      }
      Object.defineProperty(object, key, { value, enumerable: true, writable: true, configurable: true });
      this.space();
      const next = this.text[this.at++];
      if (next === "}") return object;
      if (next !== ",") this.fail();
    }
  }
  array(depth) {
    if (depth > MAX_DEPTH) this.fail();
    this.at++;
    const array = [];
    this.space();
    if (this.text[this.at] === "]") {
      this.at++;
      return array;
    }
    for (;;) {
      this.space();
      array.push(this.value(depth));
      this.space();
      const next = this.text[this.at++];
      if (next === "]") return array;
      if (next !== ",") this.fail();
    }
  }
  string() {
    const text = this.text;
    this.at++;
    let out = "";
    let start = this.at;
    for (;;) {
      PLAIN.lastIndex = this.at;
      PLAIN.test(text);
      this.at = PLAIN.lastIndex;
      if (this.at >= text.length) this.fail();
      const c = text.charCodeAt(this.at);
      if (c === 0x22) {
        out += text.slice(start, this.at);
        this.at++;
        return out;
      }
      if (c < 0x20) this.fail();
      out += text.slice(start, this.at);
      const escape = text[this.at + 1];
      this.at += 2;
      const simple = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" }[escape];
      if (simple !== undefined) {
        out += simple;
      } else if (escape === "u") {
        const unit = this.hex();
        const paired = unit >= 0xd800 && unit <= 0xdbff && text[this.at] === "\\" && text[this.at + 1] === "u";
        const low = paired ? parseInt(text.slice(this.at + 2, this.at + 6), 16) : NaN;
        if (paired && low >= 0xdc00 && low <= 0xdfff) {
          this.at += 2;
          this.hex();
          out += String.fromCharCode(unit, low);
        } else if (unit >= 0xd800 && unit <= 0xdfff && !this.loneSurrogates) {
          this.fail();
        } else {
          out += String.fromCharCode(unit);
        }
      } else {
        this.fail();
      }
      start = this.at;
    }
  }
  hex() {
    const digits = this.text.slice(this.at, this.at + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) this.fail();
    this.at += 4;
    return parseInt(digits, 16);
  }
  number() {
    NUMBER.lastIndex = this.at;
    const match = NUMBER.exec(this.text);
    if (match === null || match[0].length === 0) this.fail();
    const source = match[0];
    this.at += source.length;
    if (this.numbers === "raw") return new JsonNumber(source);
    const integer = match[2] === undefined && match[3] === undefined;
    if (this.numbers === "bigint" && integer) return BigInt(source);
    const value = Number(source);
    if (!Number.isFinite(value)) this.fail(); // as serde_json: out of range
    return value;
  }
}

const SPACE = /[ \t\n\r]*/y;
const NOT_ASCII = /[\u0080-\u00ff]/;
const NOT_ASCII_TEXT = /[^\u0000-\u007f]/;
/** A run of string characters that need no escape handling. */
const PLAIN = /[^"\\\u0000-\u001f]*/y;
const NUMBER = /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;

/** Fields an object decoded by `decodeJson` was given more than once. */
export const DUPLICATES = Symbol("duplicate fields");

/** JSON text of `value`, as serde_json writes it: BigInt as an integer,
 * no spaces, `/` and non-ASCII as they are, object fields in their order. */
export function encodeJsonText(value) {
  switch (typeof value) {
    case "bigint":
      return value.toString();
    case "string":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) throw new TypeError("JSON has no " + value);
      return JSON.stringify(value);
    case "boolean":
      return value ? "true" : "false";
    case "object": {
      if (value === null) return "null";
      if (value instanceof JsonNumber) return value.text;
      if (Array.isArray(value)) return "[" + value.map((item) => (item === undefined ? "null" : encodeJsonText(item))).join(",") + "]";
      const fields = [];
      for (const name of Object.keys(value)) {
        if (value[name] !== undefined) fields.push(JSON.stringify(name) + ":" + encodeJsonText(value[name]));
      }
      return "{" + fields.join(",") + "}";
    }
    default:
      throw new TypeError("cannot encode a " + typeof value + " as JSON");
  }
}

/** `encodeJsonText` as UTF-8 bytes. */
export function encodeJson(value) {
  return utf8Encode(encodeJsonText(value));
}

// ---- UTF-8 (QuickJS has no TextEncoder) ----------------------------------

/** UTF-8 bytes of `text` (lone surrogates become U+FFFD). */
export function utf8Encode(text) {
  if (!NOT_ASCII_TEXT.test(text)) {
    // ASCII (most keys, addends and states): one byte per unit.
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }
  const out = [];
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const low = text.charCodeAt(i + 1);
      if (low >= 0xdc00 && low <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (low - 0xdc00);
        i++;
      }
    }
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 0x3f));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 0x3f), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
  }
  return new Uint8Array(out);
}

/** The text of UTF-8 `bytes`; throws `Reject("event is not UTF-8")` on
 * anything Rust's `str::from_utf8` refuses (overlongs, surrogates, > U+10FFFF). */
export function utf8Decode(bytes) {
  // ASCII (most records) is its own text: the bytes read as Latin-1, then
  // checked by one native regex instead of an interpreted loop per byte.
  let latin1 = "";
  if (bytes.length <= 4096) latin1 = String.fromCharCode.apply(null, bytes);
  else for (let i = 0; i < bytes.length; i += 4096) latin1 += String.fromCharCode.apply(null, bytes.subarray(i, i + 4096));
  if (!NOT_ASCII.test(latin1)) return latin1;
  let out = "";
  let chunk = [];
  const bad = () => {
    throw new Reject("event is not UTF-8");
  };
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i];
    let c;
    if (b < 0x80) {
      c = b;
      i += 1;
    } else if (b >= 0xc2 && b <= 0xdf) {
      const b1 = bytes[i + 1];
      if ((b1 & 0xc0) !== 0x80) bad();
      c = ((b & 0x1f) << 6) | (b1 & 0x3f);
      i += 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      const b1 = bytes[i + 1];
      const b2 = bytes[i + 2];
      if ((b1 & 0xc0) !== 0x80 || (b2 & 0xc0) !== 0x80) bad();
      if ((b === 0xe0 && b1 < 0xa0) || (b === 0xed && b1 > 0x9f)) bad();
      c = ((b & 0x0f) << 12) | ((b1 & 0x3f) << 6) | (b2 & 0x3f);
      i += 3;
    } else if (b >= 0xf0 && b <= 0xf4) {
      const b1 = bytes[i + 1];
      const b2 = bytes[i + 2];
      const b3 = bytes[i + 3];
      if ((b1 & 0xc0) !== 0x80 || (b2 & 0xc0) !== 0x80 || (b3 & 0xc0) !== 0x80) bad();
      if ((b === 0xf0 && b1 < 0x90) || (b === 0xf4 && b1 > 0x8f)) bad();
      c = ((b & 0x07) << 18) | ((b1 & 0x3f) << 12) | ((b2 & 0x3f) << 6) | (b3 & 0x3f);
      i += 4;
    } else {
      bad();
    }
    if (c >= 0x10000) {
      c -= 0x10000;
      chunk.push(0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
    } else {
      chunk.push(c);
    }
    if (chunk.length >= 4096) {
      out += String.fromCharCode.apply(null, chunk);
      chunk = [];
    }
  }
  return out + String.fromCharCode.apply(null, chunk);
}
