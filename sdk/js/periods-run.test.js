// PeriodsRun (testing.js) under node's test runner: a period plugin run
// through the real host. First against a stand-in `tally` (a script that
// does to the files what the host's `plugin build` and `run` do, so the
// driver's own part is checked in milliseconds: the job it writes, what
// each send adds, exact integers, errors holding stderr, clean-up), then
// through the real `tally` with plugins/billing-periods-js (failing when
// there is no `tally`: $TALLY_BIN or on PATH).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { PeriodsRun, tallyBinary } from "./testing.js";

const MAX = 2n ** 64n - 1n;

// The stand-in host: `plugin build <dir> --out <file>` writes the file;
// `run job.toml` answers each input line it has not read yet: "final N" or
// "adjust N PREVIOUS" gives a record, anything else a dead letter; "fail"
// makes the run fail.
const FAKE_TALLY = `#!${process.execPath}
const fs = require("node:fs");
const args = process.argv.slice(2);
fs.appendFileSync(process.env.FAKE_TALLY_LOG, JSON.stringify([process.cwd(), ...args]) + "\\n");
if (args[0] === "plugin" && args[1] === "build") {
  if (process.env.FAKE_TALLY_BUILD_FAILS) { console.error("error: the build broke"); process.exit(1); }
  fs.writeFileSync(args[args.indexOf("--out") + 1], "\\0asm");
  process.exit(0);
}
if (args.join(" ") !== "run job.toml") throw new Error(args.join(" "));
fs.mkdirSync("out", { recursive: true });
fs.mkdirSync("state", { recursive: true });
const done = fs.existsSync("state/read") ? Number(fs.readFileSync("state/read", "utf8")) : 0;
const lines = fs.readFileSync("events.ndjson", "utf8").split("\\n").slice(0, -1);
lines.slice(done).forEach((line, index) => {
  const offset = done + index;
  const words = line.split(" ");
  if (line === "fail") { console.error("error: line " + offset + " broke the run"); process.exit(1); }
  let value;
  if (words[0] === "final") {
    value = '{"type":"final","customer":"acme","metric":"calls","period":"2026-11","time_zone":"America/New_York","start":"2026-11-01T04:00:00Z","end":"2026-12-01T05:00:00Z","value":' + words[1] + ',"version":1,"tzdata":"2026f"}';
  } else if (words[0] === "adjust") {
    const delta = (BigInt(words[1]) - BigInt(words[2])).toString();
    value = '{"type":"adjustment","period":"2026-11","start":"s","end":"e","value":' + words[1] + ',"previous":' + words[2] + ',"delta":' + delta + ',"version":2}';
  } else {
    fs.appendFileSync("out/dead-letters.ndjson", JSON.stringify({ reason: "malformed: nope", record: line, source: { partition: "events.ndjson", offset } }) + "\\n");
    return;
  }
  fs.appendFileSync("out/periods.ndjson", '{"key":{},"value":' + value + ',"source":{"partition":"events.ndjson","offset":' + offset + "}}\\n");
});
fs.writeFileSync("state/read", String(lines.length));
`;

/** Puts the environment back as it was when this was called, after the test. */
function restoreEnvAfter(t) {
  const saved = { ...process.env };
  t.after(() => {
    for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
    Object.assign(process.env, saved);
  });
}

/** Sets $TALLY_BIN to the stand-in for the test; returns a reader of the calls it got. */
function fakeTally(t, env = {}) {
  const dir = mkdtempSync(join(tmpdir(), "fake-tally-"));
  restoreEnvAfter(t);
  writeFileSync(join(dir, "tally"), FAKE_TALLY, { mode: 0o755 });
  Object.assign(process.env, { TALLY_BIN: join(dir, "tally"), FAKE_TALLY_LOG: join(dir, "calls.log") }, env);
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return {
    dir,
    calls: () => readFileSync(join(dir, "calls.log"), "utf8").trim().split("\n").map((line) => JSON.parse(line)),
  };
}

test("it builds once, writes the job and runs it per send", async (t) => {
  const fake = fakeTally(t);
  const run = await PeriodsRun.start(new URL(`file://${fake.dir}/project`), { periods: 'grace = "48h"', pluginConfig: 'meters = { calls = "sum" }' });
  assert.deepEqual(readFileSync(join(run.dir, "plugin.wasm")), Buffer.from("\0asm"));
  assert.equal(
    readFileSync(join(run.dir, "job.toml"), "utf8"),
    `name = "test"
plugin = "plugin.wasm"
outputs = ["periods"]

[local]
inputs = ["events.ndjson"]
output_dir = "out"
state_dir = "state"

[periods]
grace = "48h"

[plugin_config]
meters = { calls = "sum" }
`,
  );
  run.send(["x"]);
  run.send([]);
  assert.equal(readFileSync(join(run.dir, "events.ndjson"), "utf8"), "x\n");
  run.close();
  assert.equal(existsSync(run.dir), false);
  assert.deepEqual(fake.calls(), [
    [run.dir, "plugin", "build", join(fake.dir, "project"), "--out", join(run.dir, "plugin.wasm")],
    [run.dir, "run", "job.toml"],
    [run.dir, "run", "job.toml"],
  ]);
  assert.throws(() => run.send(["final 1"]), /closed/);
});

test("each send returns only what its run added, with exact integers", async (t) => {
  fakeTally(t);
  const run = await PeriodsRun.start(".");
  t.after(() => run.close());
  const first = run.send(["final 12", "not an event", Buffer.from("final 7")]);
  assert.deepEqual(first.deadLetters, [{ offset: 1, reason: "malformed: nope" }]);
  assert.deepEqual(
    first.records.map(({ fields, ...record }) => record),
    [
      { type: "final", customer: "acme", period: "2026-11", start: "2026-11-01T04:00:00Z", end: "2026-12-01T05:00:00Z", value: 12n, version: 1, previous: null, delta: null },
      { type: "final", customer: "acme", period: "2026-11", start: "2026-11-01T04:00:00Z", end: "2026-12-01T05:00:00Z", value: 7n, version: 1, previous: null, delta: null },
    ],
  );
  assert.equal(first.records[0].fields.tzdata, "2026f");
  assert.equal(first.records[0].fields.metric, "calls");
  const second = run.send([`adjust ${MAX} 12`, "adjust 3 12", "junk"]);
  assert.deepEqual(
    second.records.map(({ fields, ...record }) => record),
    [
      { type: "adjustment", customer: null, period: "2026-11", start: "s", end: "e", value: MAX, version: 2, previous: 12n, delta: MAX - 12n },
      { type: "adjustment", customer: null, period: "2026-11", start: "s", end: "e", value: 3n, version: 2, previous: 12n, delta: -9n },
    ],
  );
  assert.deepEqual(second.deadLetters, [{ offset: 5, reason: "malformed: nope" }]);
  assert.deepEqual(run.send([]), { records: [], deadLetters: [] });
});

test("a failing run throws with its stderr; a line break is refused", async (t) => {
  fakeTally(t);
  const run = await PeriodsRun.start(".");
  t.after(() => run.close());
  assert.throws(() => run.send(["fail"]), /run job\.toml` .*failed with exit status 1:\nerror: line 0 broke the run/);
  assert.throws(() => run.send(["a\nb"]), /line break/);
});

test("a failing build throws with its stderr and leaves nothing behind", async (t) => {
  const fake = fakeTally(t, { FAKE_TALLY_BUILD_FAILS: "1" });
  await assert.rejects(PeriodsRun.start("."), /plugin build .*failed with exit status 1:\nerror: the build broke/);
  const [[dir]] = fake.calls();
  assert.equal(existsSync(dir), false);
});

test("without tally it names $TALLY_BIN, PATH and how to get it", (t) => {
  restoreEnvAfter(t);
  delete process.env.TALLY_BIN;
  process.env.PATH = "/nonexistent";
  assert.throws(() => tallyBinary(), (err) => err.code === "TALLY_NOT_FOUND" && /\$TALLY_BIN/.test(err.message) && /PATH/.test(err.message) && /cargo install --path host/.test(err.message));
  process.env.TALLY_BIN = "/nowhere/tally";
  assert.throws(() => tallyBinary(), /nowhere/);
});

// ---- Through the real host -------------------------------------------------


test("the real host emits FINAL, ADJUSTMENT and dead letters", async (t) => {
  const run = await PeriodsRun.start(new URL("../../plugins/billing-periods-js/", import.meta.url), {
    periods: 'time_zones = { acme = "America/New_York" }',
    pluginConfig: 'meters = { calls = "sum" }',
  });
  t.after(() => run.close());
  const event = (id, quantity, ts) => `{"id":"${id}","customer":"acme","metric":"calls","quantity":${quantity},"ts":"${ts}"}`;
  let sent = run.send([
    event("a", 5, "2026-11-10T12:00:00Z"),
    event("b", 7, "2026-12-01T00:00:00Z"), // 19:00 on 30 November in New York
    event("c", 1, "2026-12-03T00:00:00Z"), // past November's end plus the default grace (24h)
  ]);
  assert.deepEqual(sent.deadLetters, []);
  assert.equal(sent.records.length, 1);
  const [final] = sent.records;
  assert.deepEqual(
    { ...final, fields: undefined },
    { type: "final", customer: "acme", period: "2026-11", start: "2026-11-01T04:00:00Z", end: "2026-12-01T05:00:00Z", value: 12n, version: 1, previous: null, delta: null, fields: undefined },
  );
  assert.equal(final.fields.time_zone, "America/New_York");

  sent = run.send([event("d", MAX - 12n, "2026-11-20T00:00:00Z"), "not json", event("a", 5, "2026-11-10T12:00:00Z")]);
  assert.deepEqual(
    sent.records.map(({ type, period, value, previous, delta, version }) => ({ type, period, value, previous, delta, version })),
    [{ type: "adjustment", period: "2026-11", value: MAX, previous: 12n, delta: MAX - 12n, version: 2 }],
  );
  assert.deepEqual(sent.deadLetters, [
    { offset: 4, reason: "malformed: event is not valid JSON" },
    { offset: 5, reason: 'duplicate: event id "a" was counted already' },
  ]);
});

// The package dir may be given as a path, too.
test("a package dir given as a path is built from there", async (t) => {
  const fake = fakeTally(t);
  const run = await PeriodsRun.start(fileURLToPath(new URL("./", import.meta.url)));
  run.close();
  assert.equal(fake.calls()[0][3], fileURLToPath(new URL("./", import.meta.url)).replace(/\/$/, ""));
});
