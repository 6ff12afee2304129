//! A job file as a tenant deploys it to `tally serve`: the same TOML as
//! for `tally run`, except that the host decides where files go. The
//! plugin comes with the upload, state and outputs live in the job's
//! directory, and a local job's inputs must be inside its tenant's
//! `input_dir`.

use std::path::{Component, Path};

use crate::config::JobConfig;

use super::config::TenantConfig;
use super::registry::JobDir;

/// Fields the host sets itself, and why a tenant may not.
const HOST_OWNED: &[(&[&str], &str)] = &[
    (&["plugin"], "the plugin is uploaded with the job (`tally jobs deploy <job.toml> --plugin <file>`)"),
    (&["local", "state_dir"], "the host keeps each job's state in its data directory"),
    (&["local", "output_dir"], "the host keeps a local job's outputs in its data directory"),
    (&["kafka", "state_dir"], "the host keeps each job's state in its data directory"),
];

/// Parses `text` as `tenant`'s job and places its files in `dir`; returns
/// the job's name as the tenant calls it and the config the host runs.
/// The host runs it as `<tenant>.<name>`, so Kafka groups, transactional
/// ids and changelogs of two tenants' same-named jobs never meet.
pub fn parse(text: &str, tenant_name: &str, tenant: &TenantConfig, data_dir: &Path) -> Result<(String, JobConfig), String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|err| format!("the job file is not valid TOML: {err}"))?;
    for (path, why) in HOST_OWNED {
        if lookup(&table, path) {
            return Err(format!("remove `{}` from the job file: {why}", path.join(".")));
        }
    }
    let name = match table.get("name") {
        Some(toml::Value::String(name)) => name.clone(),
        _ => return Err("the job file needs a name (name = \"billing\")".into()),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("job name {name:?} must be non-empty and use only letters, digits, `-` and `_`"));
    }
    let dir = JobDir::new(data_dir, tenant_name, &name);
    let path_value = |path: &Path| toml::Value::String(path.display().to_string());
    table.insert("name".into(), toml::Value::String(format!("{tenant_name}.{name}")));
    table.insert("plugin".into(), path_value(&dir.path().join("plugins")));
    if let Some(toml::Value::Table(local)) = table.get_mut("local") {
        local.insert("state_dir".into(), path_value(&dir.state_dir()));
        local.insert("output_dir".into(), path_value(&dir.output_dir()));
        if let Some(toml::Value::Array(inputs)) = local.get_mut("inputs") {
            let Some(input_dir) = &tenant.input_dir else {
                return Err(format!(
                    "tenant `{tenant_name}` has no input_dir in the host configuration, so it cannot run local jobs; use a [kafka] job, or ask the operator for an input_dir"
                ));
            };
            for input in inputs.iter_mut() {
                let toml::Value::String(relative) = input else { continue };
                *input = path_value(&inside(input_dir, relative)?);
            }
        }
    }
    if let Some(toml::Value::Table(kafka)) = table.get_mut("kafka") {
        kafka.insert("state_dir".into(), path_value(&dir.state_dir()));
    }
    let config: JobConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|err: toml::de::Error| format!("the job file is invalid: {}", err.message()))?;
    config.validate().map_err(|err| err.to_string().replacen(&format!("job `{tenant_name}.{name}`"), &format!("job `{name}`"), 1))?;
    Ok((name, config))
}

fn lookup(table: &toml::Table, path: &[&str]) -> bool {
    match path {
        [] => true,
        [key] => table.contains_key(*key),
        [key, rest @ ..] => matches!(table.get(*key), Some(toml::Value::Table(inner)) if lookup(inner, rest)),
    }
}

/// `relative` under `input_dir`, refusing anything that could leave it.
fn inside(input_dir: &Path, relative: &str) -> Result<std::path::PathBuf, String> {
    let path = Path::new(relative);
    if !path.components().all(|component| matches!(component, Component::Normal(_))) {
        return Err(format!(
            "input {relative:?} must be a path inside the tenant's input directory, without `..` or a leading `/` (like \"usage-0.ndjson\")"
        ));
    }
    let joined = input_dir.join(path);
    // A symbolic link must not lead out either.
    if let (Ok(real), Ok(root)) = (joined.canonicalize(), input_dir.canonicalize()) {
        if !real.starts_with(&root) {
            return Err(format!("input {relative:?} leads outside the tenant's input directory"));
        }
    }
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(input_dir: Option<&Path>) -> TenantConfig {
        TenantConfig { token: "0123456789abcdef".into(), input_dir: input_dir.map(Path::to_path_buf) }
    }

    const LOCAL: &str = "name = \"billing\"\noutputs = [\"totals\"]\n[local]\ninputs = [\"usage-0.ndjson\"]\n";

    #[test]
    fn the_host_places_files_and_qualifies_the_name() {
        let inputs = tempfile::tempdir().unwrap();
        let (name, config) = parse(LOCAL, "acme", &tenant(Some(inputs.path())), Path::new("/data")).unwrap();
        assert_eq!(name, "billing");
        assert_eq!(config.name, "acme.billing");
        let local = config.local.unwrap();
        assert_eq!(local.inputs, [inputs.path().join("usage-0.ndjson")]);
        assert_eq!(local.state_dir, Path::new("/data/jobs/acme/billing/state"));
    }

    #[test]
    fn host_owned_fields_escapes_and_unknown_fields_are_refused() {
        let inputs = tempfile::tempdir().unwrap();
        let tenant = tenant(Some(inputs.path()));
        let data = Path::new("/data");
        let err = parse(&format!("plugin = \"x.wasm\"\n{LOCAL}"), "acme", &tenant, data).unwrap_err();
        assert!(err.contains("remove `plugin`"), "{err}");
        let err = parse(&LOCAL.replace("usage-0", "../../etc/passwd"), "acme", &tenant, data).unwrap_err();
        assert!(err.contains("without `..`"), "{err}");
        let err = parse(&format!("{LOCAL}colour = \"red\"\n"), "acme", &tenant, data).unwrap_err();
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = parse("name = [", "acme", &tenant, data).unwrap_err();
        assert!(err.contains("not valid TOML"), "{err}");
        let err = parse(LOCAL, "acme", &super::tests::tenant(None), data).unwrap_err();
        assert!(err.contains("no input_dir"), "{err}");
    }
}
