// The plugin log of either contract: `log.info(...)` and friends, and,
// inside a component, `console` writing to the same log.

/**
 * The `log` object for the host's `log` import (0.1's or 0.2's). Inside a
 * component (QuickJS: no `process`), `console` writes to the host's log
 * too: the build stubs WASI out, so there is no other stdout.
 */
export function loggerFor(hostLog) {
  if (typeof process === "undefined") {
    const line = (level) => (...args) => hostLog(level, args.map(String).join(" "));
    globalThis.console = { log: line("info"), info: line("info"), debug: line("debug"), warn: line("warn"), error: line("error") };
  }
  return {
    trace: (message) => hostLog("trace", String(message)),
    debug: (message) => hostLog("debug", String(message)),
    info: (message) => hostLog("info", String(message)),
    warn: (message) => hostLog("warn", String(message)),
    error: (message) => hostLog("error", String(message)),
  };
}
