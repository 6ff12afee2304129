// Module hooks for `tally/testing`: the host's `tally:plugin/*` imports
// resolve to the in-memory host (host.js), so a plugin runs under node.
const HOST = new URL("./host.js", import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if (specifier.startsWith("tally:plugin/")) {
    return { url: HOST, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
