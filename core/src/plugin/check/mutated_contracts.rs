//! Property test of the import check: components built from mutated
//! contracts (a function more or less, a parameter or result of another
//! type, a record field or enum case more or changed) are refused by the
//! check exactly when Wasmtime would not link them. Never does a component
//! pass the check and then fail to link (the serve API would answer it
//! with a server error), and never is one refused that would have run.

use proptest::prelude::*;
use wit_parser::{
    Function, FunctionKind, Param, Resolve, Type, TypeDef, TypeDefKind, TypeOwner, WorldId,
};

use super::{check_component, compile};
use crate::limits::Limits;
use crate::plugin::{PluginError, PluginRuntime};

/// The interfaces with functions, and the records, that mutations pick from.
const INTERFACES: [&str; 4] = ["state", "output", "log", "aggregator"];
const RECORDS: [&str; 3] = ["event", "rejection", "output-record"];

/// A type a mutation puts somewhere.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Bool,
    U8,
    U32,
    U64,
    S64,
    Text,
    Bytes,
    MaybeText,
    Pair,
}

#[derive(Debug, Clone)]
enum Mutation {
    ExtraFunction { interface: usize, params: Vec<Shape>, result: Option<Shape> },
    DropFunction { interface: usize, function: usize },
    ParamType { interface: usize, function: usize, param: usize, to: Shape },
    ResultType { interface: usize, function: usize, to: Option<Shape> },
    FieldType { record: usize, field: usize, to: Shape },
    ExtraField { record: usize, ty: Shape },
    RenameField { record: usize, field: usize },
    ExtraLevel,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Bool),
        Just(Shape::U8),
        Just(Shape::U32),
        Just(Shape::U64),
        Just(Shape::S64),
        Just(Shape::Text),
        Just(Shape::Bytes),
        Just(Shape::MaybeText),
        Just(Shape::Pair),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let index = 0usize..8;
    prop_oneof![
        (index.clone(), proptest::collection::vec(shape(), 0..3), proptest::option::of(shape()))
            .prop_map(|(interface, params, result)| Mutation::ExtraFunction {
                interface,
                params,
                result
            }),
        (index.clone(), index.clone())
            .prop_map(|(interface, function)| Mutation::DropFunction { interface, function }),
        (index.clone(), index.clone(), index.clone(), shape()).prop_map(
            |(interface, function, param, to)| Mutation::ParamType {
                interface,
                function,
                param,
                to
            }
        ),
        (index.clone(), index.clone(), proptest::option::of(shape()))
            .prop_map(|(interface, function, to)| Mutation::ResultType { interface, function, to }),
        (index.clone(), index.clone(), shape())
            .prop_map(|(record, field, to)| Mutation::FieldType { record, field, to }),
        (index.clone(), shape()).prop_map(|(record, ty)| Mutation::ExtraField { record, ty }),
        (index.clone(), index).prop_map(|(record, field)| Mutation::RenameField { record, field }),
        Just(Mutation::ExtraLevel),
    ]
}

/// The contract, parsed from the WIT the host's bindings come from.
pub(crate) fn contract() -> (Resolve, WorldId) {
    let mut resolve = Resolve::default();
    let (package, _) = resolve
        .push_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/tally-plugin@0.1.0"))
        .unwrap();
    let world = resolve.select_world(&[package], Some("plugin")).unwrap();
    (resolve, world)
}

fn new_type(resolve: &mut Resolve, kind: TypeDefKind) -> Type {
    Type::Id(resolve.types.alloc(TypeDef {
        name: None,
        kind,
        owner: TypeOwner::None,
        docs: Default::default(),
        stability: Default::default(),
        span: Default::default(),
        external_id: None,
    }))
}

fn make(resolve: &mut Resolve, shape: Shape) -> Type {
    match shape {
        Shape::Bool => Type::Bool,
        Shape::U8 => Type::U8,
        Shape::U32 => Type::U32,
        Shape::U64 => Type::U64,
        Shape::S64 => Type::S64,
        Shape::Text => Type::String,
        Shape::Bytes => new_type(resolve, TypeDefKind::List(Type::U8)),
        Shape::MaybeText => new_type(resolve, TypeDefKind::Option(Type::String)),
        Shape::Pair => new_type(
            resolve,
            TypeDefKind::Tuple(wit_parser::Tuple { types: vec![Type::U32, Type::U64] }),
        ),
    }
}

fn interface(resolve: &Resolve, index: usize) -> wit_parser::InterfaceId {
    let name = INTERFACES[index % INTERFACES.len()];
    resolve
        .interfaces
        .iter()
        .find(|(_, i)| i.name.as_deref() == Some(name))
        .map(|(id, _)| id)
        .unwrap()
}

fn record(resolve: &Resolve, index: usize) -> wit_parser::TypeId {
    let name = RECORDS[index % RECORDS.len()];
    resolve.types.iter().find(|(_, t)| t.name.as_deref() == Some(name)).map(|(id, _)| id).unwrap()
}

fn apply(resolve: &mut Resolve, mutation: &Mutation) {
    match mutation {
        Mutation::ExtraFunction { interface: i, params, result } => {
            let id = interface(resolve, *i);
            let params = params
                .iter()
                .enumerate()
                .map(|(n, shape)| Param {
                    name: format!("p{n}"),
                    ty: make(resolve, *shape),
                    span: Default::default(),
                })
                .collect();
            let result = result.map(|shape| make(resolve, shape));
            let name = format!("extra{}", resolve.interfaces[id].functions.len());
            let function = Function {
                name: name.clone(),
                kind: FunctionKind::Freestanding,
                params,
                result,
                docs: Default::default(),
                stability: Default::default(),
                span: Default::default(),
                external_id: None,
            };
            resolve.interfaces[id].functions.insert(name, function);
        }
        Mutation::DropFunction { interface: i, function } => {
            let id = interface(resolve, *i);
            let functions = &mut resolve.interfaces[id].functions;
            if !functions.is_empty() {
                functions.shift_remove_index(function % functions.len());
            }
        }
        Mutation::ParamType { interface: i, function, param, to } => {
            let ty = make(resolve, *to);
            let id = interface(resolve, *i);
            let functions = &mut resolve.interfaces[id].functions;
            let count = functions.len();
            if let Some((_, f)) = functions.get_index_mut(function % count.max(1)) {
                let params = f.params.len();
                if let Some(p) = f.params.get_mut(param % params.max(1)) {
                    p.ty = ty;
                }
            }
        }
        Mutation::ResultType { interface: i, function, to } => {
            let ty = to.map(|shape| make(resolve, shape));
            let id = interface(resolve, *i);
            let functions = &mut resolve.interfaces[id].functions;
            let count = functions.len();
            if let Some((_, f)) = functions.get_index_mut(function % count.max(1)) {
                f.result = ty;
            }
        }
        Mutation::FieldType { record: r, field, to } => {
            let ty = make(resolve, *to);
            let id = record(resolve, *r);
            if let TypeDefKind::Record(record) = &mut resolve.types[id].kind {
                let count = record.fields.len();
                record.fields[field % count].ty = ty;
            }
        }
        Mutation::ExtraField { record: r, ty } => {
            let ty = make(resolve, *ty);
            let id = record(resolve, *r);
            if let TypeDefKind::Record(record) = &mut resolve.types[id].kind {
                let name = format!("extra{}", record.fields.len());
                record.fields.push(wit_parser::Field {
                    name,
                    ty,
                    docs: Default::default(),
                    span: Default::default(),
                });
            }
        }
        Mutation::RenameField { record: r, field } => {
            let id = record(resolve, *r);
            if let TypeDefKind::Record(record) = &mut resolve.types[id].kind {
                let count = record.fields.len();
                record.fields[field % count].name.push_str("-renamed");
            }
        }
        Mutation::ExtraLevel => {
            let id = resolve
                .types
                .iter()
                .find(|(_, t)| t.name.as_deref() == Some("level"))
                .map(|(id, _)| id)
                .unwrap();
            if let TypeDefKind::Enum(level) = &mut resolve.types[id].kind {
                level.cases.push(wit_parser::EnumCase {
                    name: "fatal".into(),
                    docs: Default::default(),
                    span: Default::default(),
                });
            }
        }
    }
}

/// A component of the world: core functions that trap, the contract's
/// types and names as `resolve` now has them.
fn component(resolve: &Resolve, world: WorldId) -> Result<Vec<u8>, String> {
    let module =
        wit_component::dummy_module(resolve, world, wit_parser::ManglingAndAbi::Standard32);
    component_of_module(resolve, world, module)
}

/// The core `module` as a component of `world` in `resolve`.
pub(crate) fn component_of_module(
    resolve: &Resolve,
    world: WorldId,
    mut module: Vec<u8>,
) -> Result<Vec<u8>, String> {
    wit_component::embed_component_metadata(
        &mut module,
        resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .map_err(|err| format!("{err:#}"))?;
    wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|err| format!("{err:#}"))
}

/// Whether Wasmtime links `bytes` with the host's imports and
/// instantiates it with its entry point (the types of exported functions
/// are checked then), without the import check.
fn links(runtime: &PluginRuntime, bytes: &[u8]) -> Result<(), PluginError> {
    let component = compile(&runtime.engine, "mutated.wasm", bytes)?;
    runtime
        .prepare("mutated.wasm", "sha256:0", bytes.len(), &component)?
        .instantiate(Limits::default())
        .map(drop)
}

#[test]
fn the_contract_itself_passes_and_links() {
    let runtime = PluginRuntime::new().unwrap();
    let (resolve, world) = contract();
    let bytes = component(&resolve, world).unwrap();
    check_component("contract.wasm", &bytes).unwrap();
    links(&runtime, &bytes).unwrap();
}

#[test]
fn a_state_import_with_a_function_more_is_refused_naming_both() {
    let (mut resolve, world) = contract();
    apply(
        &mut resolve,
        &Mutation::ExtraFunction { interface: 0, params: vec![Shape::Bytes], result: None },
    );
    let bytes = component(&resolve, world).unwrap();
    let err = check_component("extra.wasm", &bytes).unwrap_err().to_string();
    assert!(
        err.starts_with("plugin `extra.wasm` imports `tally:plugin/state@0.1.0`, which has no item `extra6` in this host (it has: get, "),
        "{err}"
    );
    assert!(
        links(&PluginRuntime::new().unwrap(), &bytes).is_err(),
        "Wasmtime would not have linked it either"
    );
}

#[test]
fn an_entry_point_of_another_type_is_refused() {
    let (mut resolve, world) = contract();
    apply(&mut resolve, &Mutation::ResultType { interface: 3, function: 0, to: Some(Shape::U32) });
    let bytes = component(&resolve, world).unwrap();
    let err = check_component("entry.wasm", &bytes).unwrap_err().to_string();
    assert_eq!(
        err,
        "plugin `entry.wasm` exports `tally:plugin/aggregator@0.1.0`, which has `process` with another type than this host's \
         `func(events: list<event>) -> list<rejection>`: at the result, the host has `list<rejection>`, the plugin `u32`; \
         rebuild it against tally:plugin@0.1.0's WIT (wit/tally-plugin@0.1.0) with a tally-sdk for 0.1.0"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_check_refuses_exactly_what_would_not_link(mutations in proptest::collection::vec(mutation(), 1..4)) {
        thread_local! {
            static RUNTIME: PluginRuntime = PluginRuntime::new().unwrap();
        }
        let (mut resolve, world) = contract();
        for mutation in &mutations {
            apply(&mut resolve, mutation);
        }
        // A mutation wit-component cannot encode (none known) is no case.
        let Ok(bytes) = component(&resolve, world) else { return Ok(()) };
        let verdict = check_component("mutated.wasm", &bytes);
        let linked = RUNTIME.with(|runtime| links(runtime, &bytes));
        match (&verdict, &linked) {
            (Ok(_), Ok(())) => {}
            (Err(PluginError::Mismatch { .. } | PluginError::MissingEntryPoint { .. }), Err(_)) => {}
            _ => prop_assert!(false, "{mutations:?}: the check said {verdict:?}, linking said {linked:?}"),
        }
    }
}
