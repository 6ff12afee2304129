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
//
// A period plugin is tested natively with `PeriodsTest`, or through the
// real host (`tally plugin build`, then `tally run`) with `PeriodsRun`, to
// see its FINAL and ADJUSTMENT records exactly as the host emits them.

import { register } from "node:module";
import { execFile, execFileSync } from "node:child_process";
import { accessSync, appendFileSync, closeSync, constants, mkdtempSync, openSync, readSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

register("./testing/hooks.js", import.meta.url);
const { host } = await import("./testing/host.js");
const { encodeJsonText } = await import("./tally.js");
const { parseJson } = await import("./json.js");
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

// ---- Period plugins through the real host ---------------------------------

const TALLY_MISSING =
  "the host-run test driver needs the `tally` binary: set $TALLY_BIN to its path, or put `tally` on PATH. " +
  "Build it from the Tally tree with `cargo install --path host`, or put the built " +
  "`tally` (target/release/tally) on PATH";

const executable = (file) => {
  try {
    accessSync(file, constants.X_OK);
    return statSync(file).isFile();
  } catch {
    return false;
  }
};

const notFound = (message) => Object.assign(new Error(message), { code: "TALLY_NOT_FOUND" });

/** The `tally` that `PeriodsRun` uses: `$TALLY_BIN`, else `tally` on PATH.
 * Throws, naming both and how to get it, when there is neither (an error
 * whose `code` is "TALLY_NOT_FOUND"). */
export function tallyBinary() {
  const explicit = process.env.TALLY_BIN;
  if (explicit) {
    if (!executable(explicit)) throw notFound(`$TALLY_BIN is ${JSON.stringify(explicit)}, which is not an executable file; ${TALLY_MISSING}`);
    return explicit;
  }
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir && executable(join(dir, "tally"))) return join(dir, "tally");
  }
  throw notFound(`$TALLY_BIN is not set and there is no \`tally\` on PATH; ${TALLY_MISSING}`);
}

const toPath = (where) => {
  if (where instanceof URL) return fileURLToPath(where);
  if (typeof where === "object" && where !== null && typeof where.href === "string") return fileURLToPath(where.href);
  if (typeof where === "string" && where.startsWith("file:")) return fileURLToPath(where);
  return resolve(String(where));
};

const failed = (command, what, dir, err) => {
  const stderr = err.stderr == null ? "" : Buffer.from(err.stderr).toString().trim();
  if (err.code === "ENOENT") return new Error(`could not start \`${command[0]}\`: ${err.message}; ${TALLY_MISSING}`);
  const status = err.status ?? err.code ?? err.signal;
  return new Error(`\`${command.join(" ")}\` (the ${what}, in ${dir}) failed with exit status ${status}:\n${stderr}`);
};

const OUTPUTS = ["periods.ndjson", "dead-letters.ndjson"];

/**
 * A period plugin run through the real host (`tally run`, local mode), so a
 * test sees its FINAL and ADJUSTMENT records exactly as the host emits them
 * (time zones, DST, grace, versions, de-duplication):
 *
 *   const run = await PeriodsRun.start(new URL(".", import.meta.url), {
 *     periods: 'time_zones = { acme = "America/New_York" }',
 *     pluginConfig: 'meters = { calls = "sum" }',
 *   });
 *   t.after(() => run.close());
 *   const { records, deadLetters } = run.send(['{"id":"a","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-10T12:00:00Z"}']);
 *
 * `start` builds the package once (`tally plugin build`) into a temporary
 * directory with a job of one input file, `[periods]` and `[plugin_config]`
 * holding the TOML text given. Each `send` appends its lines to the input
 * and runs the job again (its state kept: a later send is a later run of
 * the same job, which closes, at its end, every period the watermark
 * passed) and returns what that run added: `records` (each `{ type,
 * customer, period, start, end, value, version, previous, delta, fields }`,
 * value/previous/delta BigInt, previous/delta null on a final, customer
 * null when the key has none, `fields` the whole record) and `deadLetters`
 * (`{ offset, reason }`, the offset the line's in the one input file, so
 * offsets go on across sends). The `tally` is `$TALLY_BIN`, else `tally`
 * on PATH. A build or run that fails throws an error holding its stderr.
 * `close()` removes the temporary directory.
 */
export class PeriodsRun {
  #read;
  #closed;

  /** Builds the package at `packageDir` (a path or a file URL) and writes the job. */
  static async start(packageDir, { periods = "", pluginConfig = "" } = {}) {
    const tally = tallyBinary();
    const project = toPath(packageDir);
    const dir = mkdtempSync(join(tmpdir(), "tally-js-periods-run-"));
    const run = new PeriodsRun(tally, dir);
    try {
      const command = [tally, "plugin", "build", project, "--out", join(dir, "plugin.wasm")];
      await new Promise((done, fail) => {
        execFile(command[0], command.slice(1), { cwd: dir, maxBuffer: 64 << 20 }, (err, _stdout, stderr) =>
          err ? fail(failed(command, "build", dir, Object.assign(err, { stderr }))) : done(),
        );
      });
      writeFileSync(
        join(dir, "job.toml"),
        'name = "test"\nplugin = "plugin.wasm"\noutputs = ["periods"]\n\n' +
          '[local]\ninputs = ["events.ndjson"]\noutput_dir = "out"\nstate_dir = "state"\n\n' +
          `[periods]\n${periods}\n\n[plugin_config]\n${pluginConfig}\n`,
      );
      writeFileSync(join(dir, "events.ndjson"), "");
    } catch (err) {
      run.close();
      throw err;
    }
    return run;
  }

  constructor(tally, dir) {
    /** The `tally` binary it runs. */
    this.tally = tally;
    /** The temporary directory: plugin.wasm, job.toml, events.ndjson, out/, state/. */
    this.dir = dir;
    this.#read = new Map(OUTPUTS.map((name) => [name, 0]));
    this.#closed = false;
  }

  /** Appends `lines` (strings or bytes, one NDJSON line each, without its
   * newline) to the input, runs the job, and returns what the run added. */
  send(lines) {
    if (this.#closed) throw new Error("this PeriodsRun is closed");
    const data = lines.map((line) => (typeof line === "string" ? encoder.encode(line) : Uint8Array.from(line)));
    for (const line of data) {
      if (line.includes(0x0a)) throw new Error(`a line sent may not hold a line break: ${JSON.stringify(decoder.decode(line))}`);
    }
    appendFileSync(join(this.dir, "events.ndjson"), Buffer.concat(data.flatMap((line) => [line, Uint8Array.of(0x0a)])));
    const command = [this.tally, "run", "job.toml"];
    try {
      execFileSync(command[0], command.slice(1), { cwd: this.dir, stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 << 20 });
    } catch (err) {
      throw failed(command, "run", this.dir, err);
    }
    const records = this.#newLines("periods.ndjson").map(({ value: fields }) => ({
      type: fields.type,
      customer: fields.customer ?? null,
      period: fields.period,
      start: fields.start,
      end: fields.end,
      value: fields.value,
      version: Number(fields.version),
      previous: fields.previous ?? null,
      delta: fields.delta ?? null,
      fields,
    }));
    const deadLetters = this.#newLines("dead-letters.ndjson").map((letter) => ({ offset: Number(letter.source.offset), reason: letter.reason }));
    return { records, deadLetters };
  }

  /** Removes the temporary directory (the build, job, input, outputs and state). */
  close() {
    this.#closed = true;
    rmSync(this.dir, { recursive: true, force: true });
  }

  #newLines(name) {
    let file;
    try {
      file = openSync(join(this.dir, "out", name), "r");
    } catch (err) {
      if (err.code === "ENOENT") return [];
      throw err;
    }
    const chunks = [];
    try {
      const chunk = Buffer.alloc(1 << 16);
      let at = this.#read.get(name);
      for (let got; (got = readSync(file, chunk, 0, chunk.length, at)) > 0; at += got) chunks.push(Buffer.from(chunk.subarray(0, got)));
    } finally {
      closeSync(file);
    }
    const data = Buffer.concat(chunks);
    const end = data.lastIndexOf(0x0a) + 1;
    this.#read.set(name, this.#read.get(name) + end);
    return decoder
      .decode(data.subarray(0, end))
      .split("\n")
      .filter((line) => line !== "")
      .map((line) => parseJson(line, { numbers: "bigint", loneSurrogates: true }));
  }
}
