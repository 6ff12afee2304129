//! The contract as types: what the host links for `tally:plugin@0.1.0`
//! (read from the same WIT file its bindings are generated from) and the
//! comparison of a component's imported and exported items with it.
//!
//! Wasmtime links a component only if every function it imports has
//! exactly the type the host defines, and calls the entry point only if it
//! has exactly the type the host expects. Both are decided here, from the
//! component's own type section, before anything is compiled: a component
//! that passes [`check_item`] for each of its imports and its entry point
//! links, and one that would not link is refused with the item, the
//! interface and the difference. (The check is a little stricter than
//! Wasmtime in one place: a type an imported interface exports must be
//! one the contract names, where Wasmtime ignores types it is not asked
//! for.)

use std::sync::OnceLock;

use wasmparser::PrimitiveValType;
use wasmparser::component_types::{
    ComponentAnyTypeId, ComponentDefinedType, ComponentEntityType, ComponentFuncType,
    ComponentValType,
};
use wasmparser::types::TypesRef;
use wit_parser::{Function, InterfaceId, Resolve, Type, TypeDefKind};

use super::bindings::{PERIODS_WIT_VERSION, WIT_PACKAGE, WIT_VERSION};

/// The WIT of each contract version the host's bindings are generated
/// from (`bindings.rs`).
const WIT: &str = include_str!("../../../wit/tally-plugin@0.1.0/plugin.wit");
const PERIODS_WIT: &str = include_str!("../../../wit/tally-plugin@0.2.0/plugin.wit");

/// How deep a component's type is shown in a refusal, and how long the
/// text may grow: a hostile type can nest as deep as the validator allows.
const SHOWN_DEPTH: usize = 4;
const SHOWN_BYTES: usize = 240;

/// One contract version's interfaces, by their unversioned names.
struct Contract {
    resolve: Resolve,
    interfaces: Vec<(String, InterfaceId)>,
}

impl Contract {
    fn parse(wit: &str) -> Contract {
        let mut resolve = Resolve::default();
        // The WIT is part of this binary; `the_contract_parses` tests it.
        let package = resolve.push_str("plugin.wit", wit).expect("the contract's WIT parses");
        let interfaces = resolve.packages[package]
            .interfaces
            .iter()
            .map(|(name, id)| (name.clone(), *id))
            .collect();
        Contract { resolve, interfaces }
    }
}

/// The contract of `version` (`0.1.0` or `0.2.0`); `None` for a version
/// this host does not link.
fn contract(version: &str) -> Option<&'static Contract> {
    static PROCESS: OnceLock<Contract> = OnceLock::new();
    static PERIODS: OnceLock<Contract> = OnceLock::new();
    match version {
        WIT_VERSION => Some(PROCESS.get_or_init(|| Contract::parse(WIT))),
        PERIODS_WIT_VERSION => Some(PERIODS.get_or_init(|| Contract::parse(PERIODS_WIT))),
        _ => None,
    }
}

/// Which side of the contract an item is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The plugin imports it; the host provides it.
    Import,
    /// The plugin exports it; the host calls it.
    Export,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Import => "imports",
            Side::Export => "exports",
        })
    }
}

/// What is wrong with one item of an interface the plugin uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The interface is imported or exported as something else than an
    /// instance (a bare function, a type, a module).
    NotAnInterface {
        /// What it is instead.
        found: &'static str,
    },
    /// The interface has no item of that name.
    NoSuchItem {
        /// The item, as the component names it.
        item: String,
        /// What the interface has.
        available: String,
    },
    /// The item exists but the component gives it another type.
    WrongType {
        /// The item.
        item: String,
        /// Its type in the contract.
        expected: String,
        /// Where the component's type first differs, and how.
        difference: Difference,
    },
    /// The exported interface lacks an item the host calls.
    Missing {
        /// The item.
        item: String,
        /// Its type in the contract.
        expected: String,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::NotAnInterface { found } => {
                write!(f, "is {found}, not an interface (an instance)")
            }
            Mismatch::NoSuchItem { item, available } => {
                write!(f, "has no item `{item}` in this host (it has: {available})")
            }
            Mismatch::WrongType { item, expected, difference } => {
                write!(
                    f,
                    "has `{item}` with another type than this host's `{expected}`: {difference}"
                )
            }
            Mismatch::Missing { item, expected } => {
                write!(f, "lacks `{item}` (`{expected}`), which the host calls")
            }
        }
    }
}

/// Where two types first differ: a path into the type and what each side has there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The path, such as `parameter \`value\`` or `result, field \`key\``.
    pub at: String,
    /// The contract's type there.
    pub expected: String,
    /// The component's type there (shortened when it is large).
    pub found: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.at.is_empty() { String::new() } else { format!("at {}, ", self.at) };
        write!(f, "{at}the host has `{}`, the plugin `{}`", self.expected, self.found)
    }
}

/// Compares the type of the component's import or export `name` (an
/// interface of the contract of `version`, by its unversioned name
/// `interface`) with what the host links. Items the host does not use in
/// an export are allowed; everything imported must be provided exactly.
pub fn check_item(
    types: TypesRef<'_>,
    side: Side,
    version: &str,
    interface: &str,
    entity: &ComponentEntityType,
) -> Result<(), Mismatch> {
    let Some(contract) = contract(version) else {
        return Err(Mismatch::NoSuchItem { item: interface.to_string(), available: String::new() });
    };
    let Some(&(_, id)) = contract.interfaces.iter().find(|(name, _)| name == interface) else {
        // Callers check names first; an unknown interface provides nothing.
        return Err(Mismatch::NoSuchItem { item: interface.to_string(), available: String::new() });
    };
    let ComponentEntityType::Instance(instance) = entity else {
        return Err(Mismatch::NotAnInterface { found: entity_kind(entity) });
    };
    let expected = &contract.resolve.interfaces[id];
    let compare = Compare { types, resolve: &contract.resolve };
    let exports = &types[*instance].exports;
    match side {
        Side::Import => {
            for (item, found) in exports {
                compare.item(item, &found.ty, expected)?;
            }
        }
        Side::Export => {
            for (item, function) in &expected.functions {
                match exports.get(item.as_str()) {
                    Some(found) => compare.item(item, &found.ty, expected)?,
                    None => {
                        return Err(Mismatch::Missing {
                            item: item.clone(),
                            expected: compare.show_function(function),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// The interfaces of the contract of `version` (none for a version this
/// host does not link).
pub fn interface_names(version: &str) -> impl Iterator<Item = &'static str> {
    contract(version).into_iter().flat_map(|c| c.interfaces.iter().map(|(name, _)| name.as_str()))
}

/// The versioned name of a contract interface: `tally:plugin/state@0.1.0`.
pub fn versioned(interface: &str, version: &str) -> String {
    format!("{WIT_PACKAGE}/{interface}@{version}")
}

fn entity_kind(entity: &ComponentEntityType) -> &'static str {
    match entity {
        ComponentEntityType::Module(_) => "a core module",
        ComponentEntityType::Func(_) => "a function",
        ComponentEntityType::Value(_) => "a value",
        ComponentEntityType::Type { .. } => "a type",
        ComponentEntityType::Instance(_) => "an instance",
        ComponentEntityType::Component(_) => "a component",
    }
}

/// Compares the component's types (`types`) with the contract's (`resolve`).
struct Compare<'a> {
    types: TypesRef<'a>,
    resolve: &'a Resolve,
}

impl Compare<'_> {
    /// One item of an interface instance: a function or a named type.
    fn item(
        &self,
        item: &str,
        found: &ComponentEntityType,
        interface: &wit_parser::Interface,
    ) -> Result<(), Mismatch> {
        let available = || {
            let names: Vec<&str> = interface
                .functions
                .keys()
                .chain(interface.types.keys())
                .map(String::as_str)
                .collect();
            if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
        };
        let no_such_item = || Mismatch::NoSuchItem { item: shorten(item), available: available() };
        match found {
            ComponentEntityType::Func(id) => {
                let function = interface.functions.get(item).ok_or_else(no_such_item)?;
                self.function(&self.types[*id], function).map_err(|difference| {
                    Mismatch::WrongType {
                        item: item.to_string(),
                        expected: self.show_function(function),
                        difference,
                    }
                })
            }
            ComponentEntityType::Type { referenced, .. } => {
                let id = *interface.types.get(item).ok_or_else(no_such_item)?;
                let wrong = |difference| Mismatch::WrongType {
                    item: item.to_string(),
                    expected: self.show(&Type::Id(id), 1),
                    difference,
                };
                match referenced {
                    ComponentAnyTypeId::Defined(defined) => self
                        .value(ComponentValType::Type(*defined), &Type::Id(id), "")
                        .map_err(wrong),
                    other => Err(wrong(Difference {
                        at: String::new(),
                        expected: self.show(&Type::Id(id), 1),
                        found: match other {
                            ComponentAnyTypeId::Resource(_) => "a resource".into(),
                            ComponentAnyTypeId::Func(_) => "a function type".into(),
                            ComponentAnyTypeId::Instance(_) => "an instance type".into(),
                            ComponentAnyTypeId::Component(_) => "a component type".into(),
                            ComponentAnyTypeId::Defined(_) => unreachable!("matched above"),
                        },
                    })),
                }
            }
            other => Err(Mismatch::WrongType {
                item: shorten(item),
                expected: interface
                    .functions
                    .get(item)
                    .map_or_else(|| "nothing".to_string(), |f| self.show_function(f)),
                difference: Difference {
                    at: String::new(),
                    expected: "a function or a type".into(),
                    found: entity_kind(other).into(),
                },
            }),
        }
    }

    fn function(&self, found: &ComponentFuncType, expected: &Function) -> Result<(), Difference> {
        if found.async_ {
            return Err(Difference {
                at: String::new(),
                expected: "a synchronous function".into(),
                found: "an async function".into(),
            });
        }
        if found.params.len() != expected.params.len() {
            return Err(Difference {
                at: "its parameters".into(),
                expected: format!("{} parameters", expected.params.len()),
                found: format!("{} parameters", found.params.len()),
            });
        }
        // Parameter names are not part of the type Wasmtime links by
        // (field and case names are).
        for ((_, ty), param) in found.params.iter().zip(&expected.params) {
            self.value(*ty, &param.ty, &format!("parameter `{}`", param.name))?;
        }
        match (&found.result, &expected.result) {
            (None, None) => Ok(()),
            (Some(found), Some(expected)) => self.value(*found, expected, "the result"),
            (found, expected) => Err(Difference {
                at: "the result".into(),
                expected: expected.as_ref().map_or_else(|| "none".into(), |ty| self.show(ty, 1)),
                found: found.map_or_else(|| "none".into(), |ty| self.show_found(ty)),
            }),
        }
    }

    /// Compares a value type. The walk follows the contract's type, which
    /// is small and finite, so a hostile type cannot make it deep.
    fn value(&self, found: ComponentValType, expected: &Type, at: &str) -> Result<(), Difference> {
        let expected = self.unalias(expected);
        let differ = || Difference {
            at: at.to_string(),
            expected: self.show(&expected, 1),
            found: self.show_found(found),
        };
        let defined = match found {
            ComponentValType::Primitive(primitive) => {
                return if primitive_matches(primitive, &expected) {
                    Ok(())
                } else {
                    Err(differ())
                };
            }
            ComponentValType::Type(id) => &self.types[id],
        };
        let kind = match expected {
            Type::Id(id) => &self.resolve.types[id].kind,
            _ => {
                return match defined {
                    ComponentDefinedType::Primitive(primitive)
                        if primitive_matches(*primitive, &expected) =>
                    {
                        Ok(())
                    }
                    _ => Err(differ()),
                };
            }
        };
        let inner = |what: String| if at.is_empty() { what } else { format!("{at}, {what}") };
        match (defined, kind) {
            (ComponentDefinedType::Record(record), TypeDefKind::Record(wit)) => {
                if record.fields.len() != wit.fields.len() {
                    return Err(differ());
                }
                for ((name, ty), field) in record.fields.iter().zip(&wit.fields) {
                    if name.as_str() != field.name {
                        return Err(differ());
                    }
                    self.value(*ty, &field.ty, &inner(format!("field `{}`", field.name)))?;
                }
                Ok(())
            }
            (ComponentDefinedType::Variant(variant), TypeDefKind::Variant(wit)) => {
                if variant.cases.len() != wit.cases.len() {
                    return Err(differ());
                }
                for ((name, case), wit_case) in variant.cases.iter().zip(&wit.cases) {
                    if name.as_str() != wit_case.name {
                        return Err(differ());
                    }
                    match (case.ty, &wit_case.ty) {
                        (None, None) => {}
                        (Some(ty), Some(wit_ty)) => {
                            self.value(ty, wit_ty, &inner(format!("case `{}`", wit_case.name)))?
                        }
                        _ => return Err(differ()),
                    }
                }
                Ok(())
            }
            (ComponentDefinedType::Enum(names), TypeDefKind::Enum(wit)) => {
                same_names(names, wit.cases.iter().map(|case| case.name.as_str()))
                    .ok_or_else(differ)
            }
            (ComponentDefinedType::Flags(names), TypeDefKind::Flags(wit)) => {
                same_names(names, wit.flags.iter().map(|flag| flag.name.as_str()))
                    .ok_or_else(differ)
            }
            (ComponentDefinedType::Tuple(tuple), TypeDefKind::Tuple(wit)) => {
                if tuple.types.len() != wit.types.len() {
                    return Err(differ());
                }
                for (index, (ty, wit_ty)) in tuple.types.iter().zip(&wit.types).enumerate() {
                    self.value(*ty, wit_ty, &inner(format!("tuple element {index}")))?;
                }
                Ok(())
            }
            (ComponentDefinedType::List { element, .. }, TypeDefKind::List(wit)) => {
                self.value(*element, wit, &inner("list element".into()))
            }
            (
                ComponentDefinedType::FixedLengthList { element, length, .. },
                TypeDefKind::FixedLengthList(wit, wit_length),
            ) => {
                if length != wit_length {
                    return Err(differ());
                }
                self.value(*element, wit, &inner("list element".into()))
            }
            (
                ComponentDefinedType::Map { key, value, .. },
                TypeDefKind::Map(wit_key, wit_value),
            ) => {
                self.value(*key, wit_key, &inner("map key".into()))?;
                self.value(*value, wit_value, &inner("map value".into()))
            }
            (ComponentDefinedType::Option { ty, .. }, TypeDefKind::Option(wit)) => {
                self.value(*ty, wit, &inner("option".into()))
            }
            (ComponentDefinedType::Result { ok, err, .. }, TypeDefKind::Result(wit)) => {
                for (side, found, wit) in [("ok", ok, &wit.ok), ("error", err, &wit.err)] {
                    match (found, wit) {
                        (None, None) => {}
                        (Some(ty), Some(wit_ty)) => {
                            self.value(*ty, wit_ty, &inner(format!("result's {side}")))?
                        }
                        _ => return Err(differ()),
                    }
                }
                Ok(())
            }
            // Resources, handles, futures and streams: the contract has
            // none, so any of them (or any other pairing) differs.
            _ => Err(differ()),
        }
    }

    /// Follows `type x = y` aliases in the contract to the type they name.
    fn unalias(&self, ty: &Type) -> Type {
        let mut ty = *ty;
        while let Type::Id(id) = ty {
            match &self.resolve.types[id].kind {
                TypeDefKind::Type(inner) => ty = *inner,
                _ => break,
            }
        }
        ty
    }

    fn show_function(&self, function: &Function) -> String {
        let params: Vec<String> = function
            .params
            .iter()
            .map(|param| format!("{}: {}", param.name, self.show(&param.ty, 1)))
            .collect();
        let result = function
            .result
            .as_ref()
            .map_or_else(String::new, |ty| format!(" -> {}", self.show(ty, 1)));
        format!("func({}){result}", params.join(", "))
    }

    /// The contract's type in WIT syntax; named types by name, below the top.
    fn show(&self, ty: &Type, depth: usize) -> String {
        let id = match ty {
            Type::Id(id) => *id,
            primitive => return primitive_name(primitive).to_string(),
        };
        let def = &self.resolve.types[id];
        if let (Some(name), true) = (&def.name, depth > 1) {
            return name.clone();
        }
        let nested = |ty: &Type| self.show(ty, depth + 1);
        match &def.kind {
            TypeDefKind::Record(record) => {
                let fields: Vec<String> = record
                    .fields
                    .iter()
                    .map(|f| format!("{}: {}", f.name, nested(&f.ty)))
                    .collect();
                format!("record {{ {} }}", fields.join(", "))
            }
            TypeDefKind::Enum(cases) => format!(
                "enum {{ {} }}",
                cases.cases.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
            TypeDefKind::List(inner) => format!("list<{}>", nested(inner)),
            TypeDefKind::Option(inner) => format!("option<{}>", nested(inner)),
            TypeDefKind::Tuple(tuple) => {
                format!("tuple<{}>", tuple.types.iter().map(nested).collect::<Vec<_>>().join(", "))
            }
            TypeDefKind::Type(inner) => self.show(inner, depth),
            other => def.name.clone().unwrap_or_else(|| other.as_str().to_string()),
        }
    }

    /// The component's type in WIT syntax, cut at [`SHOWN_DEPTH`] and [`SHOWN_BYTES`].
    fn show_found(&self, ty: ComponentValType) -> String {
        let mut text = String::new();
        self.write_found(ty, 0, &mut text);
        shorten(&text)
    }

    fn write_found(&self, ty: ComponentValType, depth: usize, out: &mut String) {
        use std::fmt::Write as _;
        if out.len() > SHOWN_BYTES {
            return;
        }
        let id = match ty {
            ComponentValType::Primitive(primitive) => {
                return out.push_str(primitive_val_name(primitive));
            }
            ComponentValType::Type(id) => id,
        };
        if depth >= SHOWN_DEPTH {
            return out.push('…');
        }
        let list = |out: &mut String, open: &str, items: &mut dyn Iterator<Item = (Option<&str>, Option<ComponentValType>)>| {
            out.push_str(open);
            for (index, (name, ty)) in items.enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                if out.len() > SHOWN_BYTES {
                    return;
                }
                if let Some(name) = name {
                    out.push_str(name);
                }
                if let Some(ty) = ty {
                    if name.is_some() {
                        out.push_str(": ");
                    }
                    self.write_found(ty, depth + 1, out);
                }
            }
        };
        match &self.types[id] {
            ComponentDefinedType::Primitive(primitive) => {
                out.push_str(primitive_val_name(*primitive))
            }
            ComponentDefinedType::Record(record) => {
                list(
                    out,
                    "record { ",
                    &mut record.fields.iter().map(|(n, t)| (Some(n.as_str()), Some(*t))),
                );
                out.push_str(" }");
            }
            ComponentDefinedType::Variant(variant) => {
                list(
                    out,
                    "variant { ",
                    &mut variant.cases.iter().map(|(n, c)| (Some(n.as_str()), c.ty)),
                );
                out.push_str(" }");
            }
            ComponentDefinedType::Tuple(tuple) => {
                list(out, "tuple<", &mut tuple.types.iter().map(|t| (None, Some(*t))));
                out.push('>');
            }
            ComponentDefinedType::Enum(names) => {
                list(out, "enum { ", &mut names.iter().map(|n| (Some(n.as_str()), None)));
                out.push_str(" }");
            }
            ComponentDefinedType::Flags(names) => {
                list(out, "flags { ", &mut names.iter().map(|n| (Some(n.as_str()), None)));
                out.push_str(" }");
            }
            ComponentDefinedType::List { element, .. } => {
                list(out, "list<", &mut std::iter::once((None, Some(*element))));
                out.push('>');
            }
            ComponentDefinedType::FixedLengthList { element, length, .. } => {
                list(out, "list<", &mut std::iter::once((None, Some(*element))));
                let _ = write!(out, ", {length}>");
            }
            ComponentDefinedType::Map { key, value, .. } => {
                list(out, "map<", &mut [(None, Some(*key)), (None, Some(*value))].into_iter());
                out.push('>');
            }
            ComponentDefinedType::Option { ty, .. } => {
                list(out, "option<", &mut std::iter::once((None, Some(*ty))));
                out.push('>');
            }
            ComponentDefinedType::Result { ok, err, .. } => {
                out.push_str("result<");
                for (index, side) in [ok, err].into_iter().enumerate() {
                    if index > 0 {
                        out.push_str(", ");
                    }
                    match side {
                        Some(ty) => self.write_found(*ty, depth + 1, out),
                        None => out.push('_'),
                    }
                }
                out.push('>');
            }
            ComponentDefinedType::Own(_) => out.push_str("own<resource>"),
            ComponentDefinedType::Borrow(_) => out.push_str("borrow<resource>"),
            ComponentDefinedType::Future { .. } => out.push_str("future"),
            ComponentDefinedType::Stream { .. } => out.push_str("stream"),
        }
    }
}

/// `Some` when the component's `names` are the contract's, in its order.
fn same_names<'a>(
    names: &wasmparser::collections::IndexSet<wasmparser::names::KebabString>,
    contract: impl ExactSizeIterator<Item = &'a str>,
) -> Option<()> {
    (names.len() == contract.len() && names.iter().zip(contract).all(|(a, b)| a.as_str() == b))
        .then_some(())
}

/// `text`, cut to [`SHOWN_BYTES`] on a character boundary.
fn shorten(text: &str) -> String {
    let kept = crate::text::prefix(text, SHOWN_BYTES);
    if kept.len() == text.len() { text.to_string() } else { format!("{kept}…") }
}

fn primitive_matches(found: PrimitiveValType, expected: &Type) -> bool {
    primitive_val_name(found) == primitive_name(expected)
}

fn primitive_name(ty: &Type) -> &'static str {
    match ty {
        Type::Bool => "bool",
        Type::U8 => "u8",
        Type::U16 => "u16",
        Type::U32 => "u32",
        Type::U64 => "u64",
        Type::S8 => "s8",
        Type::S16 => "s16",
        Type::S32 => "s32",
        Type::S64 => "s64",
        Type::F32 => "f32",
        Type::F64 => "f64",
        Type::Char => "char",
        Type::String => "string",
        Type::ErrorContext => "error-context",
        // Never equal to a primitive's name.
        Type::Id(_) => "a defined type",
    }
}

fn primitive_val_name(ty: PrimitiveValType) -> &'static str {
    match ty {
        PrimitiveValType::Bool => "bool",
        PrimitiveValType::U8 => "u8",
        PrimitiveValType::U16 => "u16",
        PrimitiveValType::U32 => "u32",
        PrimitiveValType::U64 => "u64",
        PrimitiveValType::S8 => "s8",
        PrimitiveValType::S16 => "s16",
        PrimitiveValType::S32 => "s32",
        PrimitiveValType::S64 => "s64",
        PrimitiveValType::F32 => "f32",
        PrimitiveValType::F64 => "f64",
        PrimitiveValType::Char => "char",
        PrimitiveValType::String => "string",
        PrimitiveValType::ErrorContext => "error-context",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_parses() {
        let names: Vec<&str> = interface_names(WIT_VERSION).collect();
        assert_eq!(names, ["types", "state", "output", "log", "aggregator"]);
        assert_eq!(versioned("state", WIT_VERSION), "tally:plugin/state@0.1.0");
        let names: Vec<&str> = interface_names(PERIODS_WIT_VERSION).collect();
        assert_eq!(names, ["types", "log", "config", "periods"]);
        assert_eq!(interface_names("0.3.0").count(), 0);
    }

    /// The types of a component written in WAT, and its import `name`.
    fn import_of(wat: &str, name: &str, check: impl FnOnce(TypesRef<'_>, &ComponentEntityType)) {
        let bytes = wat::parse_str(wat).unwrap();
        let types = wasmparser::Validator::new().validate_all(&bytes).unwrap();
        let item = types.component_item_for_import(name).unwrap();
        check(types.as_ref(), &item.ty);
    }

    #[test]
    fn an_interface_imported_as_a_function_is_refused() {
        import_of(
            r#"(component (import "tally:plugin/state@0.1.0" (func)))"#,
            "tally:plugin/state@0.1.0",
            |types, entity| {
                let err =
                    check_item(types, Side::Import, WIT_VERSION, "state", entity).unwrap_err();
                assert_eq!(err, Mismatch::NotAnInterface { found: "a function" });
            },
        );
    }

    #[test]
    fn an_extra_function_in_an_allowed_interface_is_named() {
        let wat = r#"(component (import "tally:plugin/state@0.1.0" (instance
            (export "delete" (func (param "key" (list u8))))
            (export "frobnicate" (func (param "key" (list u8))))
        )))"#;
        import_of(wat, "tally:plugin/state@0.1.0", |types, entity| {
            let err = check_item(types, Side::Import, WIT_VERSION, "state", entity).unwrap_err();
            assert_eq!(
                err.to_string(),
                "has no item `frobnicate` in this host (it has: get, get-many, put, put-many, delete, delete-many)"
            );
        });
    }

    #[test]
    fn a_parameter_of_another_type_is_shown_where_it_differs() {
        let wat = r#"(component (import "tally:plugin/state@0.1.0" (instance
            (export "put" (func (param "key" (list u8)) (param "value" (list u32))))
        )))"#;
        import_of(wat, "tally:plugin/state@0.1.0", |types, entity| {
            let err = check_item(types, Side::Import, WIT_VERSION, "state", entity).unwrap_err();
            assert_eq!(
                err.to_string(),
                "has `put` with another type than this host's `func(key: list<u8>, value: list<u8>)`: \
                 at parameter `value`, list element, the host has `u8`, the plugin `u32`"
            );
        });
    }

    #[test]
    fn names_results_and_async_count() {
        let cases = [
            (
                r#"(export "delete" (func (param "k" (list s8))))"#,
                "at parameter `key`, list element, the host has `u8`, the plugin `s8`",
            ),
            (
                r#"(export "delete" (func (param "key" (list u8)) (result u32)))"#,
                "at the result, the host has `none`, the plugin `u32`",
            ),
            (
                r#"(export "delete" (func async (param "key" (list u8))))"#,
                "the host has `a synchronous function`, the plugin `an async function`",
            ),
            (
                r#"(export "delete" (func (param "key" (list u8)) (param "more" u8)))"#,
                "at its parameters, the host has `1 parameters`, the plugin `2 parameters`",
            ),
        ];
        for (export, difference) in cases {
            let wat =
                format!(r#"(component (import "tally:plugin/state@0.1.0" (instance {export})))"#);
            let bytes = match wat::parse_str(&wat) {
                Ok(bytes) => bytes,
                Err(err) => panic!("{wat}: {err}"),
            };
            let mut features = wasmparser::WasmFeatures::default();
            features.insert(wasmparser::WasmFeatures::CM_ASYNC);
            let types =
                wasmparser::Validator::new_with_features(features).validate_all(&bytes).unwrap();
            let item = types.component_item_for_import("tally:plugin/state@0.1.0").unwrap();
            let err = check_item(types.as_ref(), Side::Import, WIT_VERSION, "state", &item.ty)
                .unwrap_err();
            let Mismatch::WrongType { difference: found, .. } = &err else { panic!("{err:?}") };
            assert_eq!(found.to_string(), difference, "{export}");
        }
    }

    #[test]
    fn types_are_compared_by_structure_and_resources_are_refused() {
        let wat = r#"(component (import "tally:plugin/types@0.1.0" (instance
            (type $level (enum "trace" "debug" "info" "warn" "error"))
            (export "level" (type (eq $level)))
        )))"#;
        import_of(wat, "tally:plugin/types@0.1.0", |types, entity| {
            check_item(types, Side::Import, WIT_VERSION, "types", entity).unwrap()
        });
        let wat = r#"(component (import "tally:plugin/types@0.1.0" (instance
            (type $level (enum "trace" "debug" "info" "warn" "error" "fatal"))
            (export "level" (type (eq $level)))
        )))"#;
        import_of(wat, "tally:plugin/types@0.1.0", |types, entity| {
            let err = check_item(types, Side::Import, WIT_VERSION, "types", entity).unwrap_err();
            assert!(
                err.to_string()
                    .contains("the plugin `enum { trace, debug, info, warn, error, fatal }`"),
                "{err}"
            );
        });
        let wat = r#"(component (import "tally:plugin/types@0.1.0" (instance (export "event" (type (sub resource))))))"#;
        import_of(wat, "tally:plugin/types@0.1.0", |types, entity| {
            let err = check_item(types, Side::Import, WIT_VERSION, "types", entity).unwrap_err();
            assert!(err.to_string().ends_with("the plugin `a resource`"), "{err}");
        });
    }

    #[test]
    fn a_hostile_type_is_shown_short() {
        let mut ty = "u8".to_string();
        for _ in 0..40 {
            ty = format!("(list {ty})");
        }
        let wat = format!(
            r#"(component (import "tally:plugin/log@0.1.0" (instance (export "log" (func (param "level" u8) (param "message" {ty}))))))"#
        );
        import_of(&wat, "tally:plugin/log@0.1.0", |types, entity| {
            let err = check_item(types, Side::Import, WIT_VERSION, "log", entity)
                .unwrap_err()
                .to_string();
            assert!(err.len() < 2 * SHOWN_BYTES, "{err}");
        });
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let text = "é".repeat(SHOWN_BYTES);
        let cut = shorten(&text);
        assert!(cut.ends_with('…') && cut.len() <= SHOWN_BYTES + '…'.len_utf8(), "{cut}");
        assert_eq!(shorten("u32"), "u32");
    }
}
