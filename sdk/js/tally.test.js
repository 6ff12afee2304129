// The SDK's JSON and UTF-8 codecs under node's test runner (`node --test`):
// they must agree with node's own where both are defined, and refuse what
// serde_json refuses.
import { test } from "node:test";
import assert from "node:assert/strict";
import "./testing.js"; // resolves the host imports
const { decodeJson, encodeJsonText, utf8Decode, utf8Encode, JsonNumber, Reject } = await import("./tally.js");

const bytes = (text) => new TextEncoder().encode(text);

/** A random JSON value, with strings over a mixed alphabet. */
function randomValue(random, depth = 0) {
  const pick = (n) => Math.floor(random() * n);
  const string = () => Array.from({ length: pick(8) }, () => ["a", "é", "☃", "𝄞", '"', "\\", "\n", "\u0001", "/", "\u2028"][pick(10)]).join("");
  switch (depth > 3 ? pick(4) : pick(6)) {
    case 0: return null;
    case 1: return random() < 0.5;
    case 2: return pick(2) ? pick(1e6) - 5e5 : (random() - 0.5) * 1e6;
    case 3: return string();
    case 4: return Array.from({ length: pick(4) }, () => randomValue(random, depth + 1));
    default: return Object.fromEntries(Array.from({ length: pick(4) }, () => [string(), randomValue(random, depth + 1)]));
  }
}

test("decoding agrees with JSON.parse, and encoding with JSON.stringify", () => {
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let i = 0; i < 2000; i++) {
    const value = randomValue(random);
    const text = JSON.stringify(value);
    assert.deepEqual(decodeJson(bytes(text), { numbers: "number" }), JSON.parse(text), text);
    assert.equal(encodeJsonText(JSON.parse(text)), text);
  }
});

test("integers decode exactly, as BigInt or as written", () => {
  assert.equal(decodeJson(bytes("18446744073709551615")), 18446744073709551615n);
  assert.equal(decodeJson(bytes("2.5")), 2.5);
  const raw = decodeJson(bytes('{"q":1E400}'), { numbers: "raw" }).q;
  assert.ok(raw instanceof JsonNumber && raw.text === "1E400" && !raw.isInteger());
  assert.equal(encodeJsonText({ total: 2n ** 64n - 1n }), '{"total":18446744073709551615}');
});

test("a number is finite exactly when it rounds to a finite double", () => {
  const least = (2n ** 1024n - 2n ** 970n).toString(); // the least that rounds to infinity
  for (const text of ["0", "-0.0e99999", "1e-400", "1.7976931348623157e308", (2n ** 1024n - 2n ** 970n - 1n).toString(), "0.1e309", `${least.slice(0, 5)}.${least.slice(5)}e-1`]) {
    assert.ok(new JsonNumber(text).isFinite(), text);
  }
  for (const text of ["1e309", "-1e400", least, `0.${least}e309`, "1.7976931348623159e308", "1e99999999999999999999"]) {
    assert.ok(!new JsonNumber(text).isFinite(), text);
  }
});

test("what serde_json refuses is refused", () => {
  const refused = ["", " ", "{", "[1,]", '{"a":1,}', "01", "+1", "1.", ".5", "1e", "NaN", "'a'", '"\\x"', '"\\ud800"', '"\\udc00"', '"a\tb"',
    "[1] 2", "tru", "nul", "1e400", "[".repeat(129) + "]".repeat(129), "// c\n1"];
  for (const text of refused) {
    assert.throws(() => decodeJson(bytes(text), { numbers: "number" }), (err) => err instanceof Reject && err.message === "event is not valid JSON", JSON.stringify(text));
  }
  assert.deepEqual(decodeJson(bytes(" [".repeat(128) + "]".repeat(128) + "\r\n\t")).length, 1);
  assert.equal(decodeJson(bytes('"\\ud800"'), { loneSurrogates: true }), "\ud800");
});

test("UTF-8 is decoded as strictly as Rust's str::from_utf8", () => {
  for (const text of ["", "ascii", "é☃𝄞", "\u0000\u007f\u0080\u07ff\u0800\uffff", "\ud83d\ude00"]) {
    assert.equal(utf8Decode(utf8Encode(text)), text);
    assert.deepEqual(utf8Encode(text), bytes(text));
  }
  const invalid = [[0xff], [0x80], [0xc0, 0x80], [0xc2], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xf0, 0x80, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80, 0x80, 0x80], [0xe2, 0x82]];
  for (const sequence of invalid) {
    assert.throws(() => utf8Decode(new Uint8Array(sequence)), (err) => err instanceof Reject && err.message === "event is not UTF-8", String(sequence));
  }
});
