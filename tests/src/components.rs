//! Components for `tally:plugin@0.1.0` made by the tests from a core module
//! in WAT: hostile shapes no plugin SDK would build (tables that grow
//! without end, functions that take the compiler minutes).

use std::fmt::Write as _;
use std::path::Path;

/// The core module's part every component here shares: a memory, a bump
/// allocator for the events the host lowers in, and the `process` export
/// (which runs `body`, then returns no rejections).
fn module(extra: &str, body: &str) -> String {
    module_importing("", extra, body)
}

/// [`module`], with core imports (`imports`) before everything else.
fn module_importing(imports: &str, extra: &str, body: &str) -> String {
    format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $at i32)
    (local.set $at (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
    (global.set $heap (i32.add (local.get $at) (local.get 3)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.shr_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536))) (i32.const 16)) (i32.const 1))))))
    (local.get $at))
  {extra}
  (func (export "tally:plugin/aggregator@0.1.0#process") (param i32 i32) (result i32)
    {body}
    ;; An empty list of rejections, at address 0.
    (i32.store (i32.const 0) (i32.const 0))
    (i32.store (i32.const 4) (i32.const 0))
    (i32.const 0))
)"#
    )
}

/// Encodes core-module WAT as a component of the `plugin` world.
pub fn component(wat: &str) -> Vec<u8> {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/tally-plugin@0.1.0/plugin.wit");
    component_of(&std::fs::read_to_string(wit).unwrap(), wat)
}

/// A component whose `state` import has a function the host does not
/// have (`frobnicate`), as a plugin built against an edited WIT has: it
/// must be refused by the import check, naming the function, not fail
/// later when it is linked.
pub fn importing_an_unknown_state_function() -> Vec<u8> {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/tally-plugin@0.1.0/plugin.wit");
    let wit = std::fs::read_to_string(wit)
        .unwrap()
        .replace("interface state {", "interface state {\n    frobnicate: func(key: list<u8>);");
    let imports =
        r#"(import "tally:plugin/state@0.1.0" "frobnicate" (func $frobnicate (param i32 i32)))"#;
    component_of(
        &wit,
        &module_importing(imports, "", "(call $frobnicate (i32.const 0) (i32.const 0))"),
    )
}

/// Encodes core-module WAT as a component of the `plugin` world of `wit`
/// (the text of a `tally:plugin` package).
fn component_of(wit: &str, wat: &str) -> Vec<u8> {
    let mut module = wat::parse_str(wat).unwrap_or_else(|err| panic!("bad WAT: {err}"));
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve.push_str("plugin.wit", wit).unwrap();
    let world = resolve.select_world(&[package], Some("plugin")).unwrap();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// A plugin whose every call grows `tables` tables by `entries` entries
/// each: memory outside its linear memory, which its limit must count.
pub fn table_grower(tables: usize, entries: u32) -> Vec<u8> {
    let mut extra = String::new();
    let mut body = String::new();
    for table in 0..tables {
        writeln!(extra, "  (table $t{table} 0 funcref)").unwrap();
        writeln!(body, "    (drop (table.grow $t{table} (ref.null func) (i32.const {entries})))")
            .unwrap();
    }
    component(&module(&extra, &body))
}

/// A plugin that does nothing, but has a function that keeps Cranelift
/// busy for a long time: `locals` locals live across `steps` steps of
/// arithmetic and branches.
pub fn slow_to_compile(locals: usize, steps: usize) -> Vec<u8> {
    let mut extra = String::from("  (func $slow (param $x i32) (result i32)\n");
    for _ in 0..locals {
        extra.push_str("    (local i32)\n");
    }
    for step in 0..steps {
        let (a, b, c) = (1 + step * 17 % locals, 1 + step * 31 % locals, 1 + step * 13 % locals);
        writeln!(extra, "    (local.set {c} (i32.add (local.get {a}) (local.get {b})))").unwrap();
        if step % 8 == 0 {
            writeln!(extra, "    (if (local.get {b}) (then (local.set {a} (i32.mul (local.get {c}) (local.get 0)))))").unwrap();
        }
    }
    extra.push_str("    (local.get 1))\n");
    component(&module(&extra, ""))
}

/// `component` with a custom section appended: the same plugin, another
/// digest (as each build of a plugin has).
pub fn with_custom_section(component: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut section = Vec::new();
    leb128(&mut section, name.len() as u64);
    section.extend_from_slice(name.as_bytes());
    section.extend_from_slice(payload);
    let mut bytes = component.to_vec();
    bytes.push(0);
    leb128(&mut bytes, section.len() as u64);
    bytes.extend_from_slice(&section);
    bytes
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}
