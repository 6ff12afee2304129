// The in-memory host that `tally/testing` runs plugins against: what the
// `tally:plugin` state, output and log imports do, minus durability.
export const host = (globalThis.__tallyTestHost ??= {
  state: new Map(), // key (latin1 string of its bytes) -> Uint8Array
  outputs: [], // { output, event, key, value } of the batch being sent
  declared: new Set(),
  logs: [],
});

const name = (bytes) => String.fromCharCode(...bytes);

export function get(key) {
  return host.state.get(name(key)) ?? null;
}
export function getMany(keys) {
  return keys.map(get);
}
export function put(key, value) {
  host.state.set(name(key), Uint8Array.from(value));
}
export function putMany(entries) {
  for (const [key, value] of entries) put(key, value);
}
export function delete_(key) {
  host.state.delete(name(key));
}
export { delete_ as delete };
export function deleteMany(keys) {
  for (const key of keys) delete_(key);
}
export function emit(output, record) {
  if (!host.declared.has(output)) {
    throw new Error(`the plugin emitted to output \`${output}\`, which the job does not declare (declared: ${[...host.declared].join(", ")})`);
  }
  host.outputs.push({ output, event: record.event, key: record.key == null ? null : Uint8Array.from(record.key), value: Uint8Array.from(record.value) });
}
export function emitMany(output, records) {
  for (const record of records) emit(output, record);
}
export function log(level, message) {
  host.logs.push({ level, message });
}
