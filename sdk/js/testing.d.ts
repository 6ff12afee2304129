// Types of Tally's test driver (testing.js, the module `tally/testing`).

/** A 0.1 plugin (exports `aggregator`) loaded against an in-memory host. */
export class PluginTest {
  static load(url: string | { readonly href: string }, outputs: string[]): Promise<PluginTest>;
  send(records: Array<string | Uint8Array | number[]>): {
    outputs: Array<{ output: string; event: number; key: string | null; value: string | null }>;
    deadLetters: Array<{ offset: number; reason: string }>;
  };
  state(key: unknown): unknown;
  allState(): Array<[string, string]>;
}

/** What `PeriodsTest.describe` gives per record: its facts (the addend as
 * text), or `error`, why it is malformed. */
export interface Described {
  id?: string;
  time?: { rfc3339: string } | { unixMillis: number };
  key?: Array<[string, string]>;
  customer?: string;
  addend?: string;
  error?: string;
}

/** What `PeriodsTest.add` gives: the states after the fold, or the refusal. */
export interface Added {
  states?: string[];
  refusal?: { addition: number; reason: string };
}

/** A period plugin (exports `config` and `periods`) called as the host calls it. */
export class PeriodsTest {
  static load(url: string | { readonly href: string }, config?: unknown): Promise<PeriodsTest>;
  describe(records: Array<string | Uint8Array | number[]>): Described[];
  add(
    states: Array<string | null>,
    addends: string[],
    additions: Array<{ period?: number; time?: number | { seconds: number; nanoseconds: number }; addend: number }>,
  ): Added;
  value(state: string): number;
  fold(events: Array<[string | Uint8Array, number]>): {
    states: Map<string, string>;
    values: Map<string, number>;
    errors: Array<{ index: number; reason: string }>;
  };
}

/** One FINAL or ADJUSTMENT record as the host wrote it (the `value` of its
 * line in `out/periods.ndjson`). */
export interface PeriodRecord {
  type: "final" | "adjustment";
  /** The key's `customer` field; null when the key has none. */
  customer: string | null;
  /** The period's label: `2026-11`, or `2026-11-03` for a day. */
  period: string;
  /** The period's first instant, UTC (RFC 3339). */
  start: string;
  /** The next period's first instant, UTC (RFC 3339). */
  end: string;
  value: bigint;
  version: number;
  /** The value the last version gave; null on a final. */
  previous: bigint | null;
  /** `value - previous` (negative when the value fell); null on a final. */
  delta: bigint | null;
  /** The whole record (`metric`, `time_zone`, `tzdata`, ...), integers as BigInt. */
  fields: Record<string, unknown>;
}

/** What one `PeriodsRun.send` added. */
export interface PeriodsSent {
  records: PeriodRecord[];
  /** Each refused line's offset (0-based, in the one input file every send appends to) and the host's reason. */
  deadLetters: Array<{ offset: number; reason: string }>;
}

/** The `tally` binary `PeriodsRun` uses: `$TALLY_BIN`, else `tally` on PATH
 * (throws when there is neither: an error whose `code` is "TALLY_NOT_FOUND"). */
export function tallyBinary(): string;

/** A period plugin built by `tally plugin build` and run by `tally run`,
 * its state kept across `send`s. */
export class PeriodsRun {
  static start(packageDir: string | { readonly href: string }, options?: { periods?: string; pluginConfig?: string }): Promise<PeriodsRun>;
  /** The `tally` binary it runs. */
  readonly tally: string;
  /** Its temporary directory (plugin.wasm, job.toml, events.ndjson, out/, state/). */
  readonly dir: string;
  send(lines: Array<string | Uint8Array | number[]>): PeriodsSent;
  close(): void;
}
