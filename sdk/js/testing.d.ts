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
