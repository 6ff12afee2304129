//! A job file as a tenant deploys it to `tally serve`: the same TOML as
//! for `tally run`, except that the host decides where things go. The
//! plugin comes with the upload; state and outputs live in the job's
//! directory; a local job's inputs must be regular files inside its
//! tenant's `input_dir`; a Kafka job uses the host's brokers, a consumer
//! group and client settings the host chooses, and only topics named
//! `<tenant>.*`; sandbox limits stay under the host's caps.

use std::path::{Component, Path};

use crate::source::{LocalSource, SourceError};
use crate::config::{JobConfig, DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH, DEFAULT_MAX_STATE_BYTES_PER_BATCH};

/// Most partitions a served job may have its topics created with.
const MAX_CREATE_PARTITIONS: u32 = 256;

use super::config::{HostConfig, TenantConfig};
use super::registry::JobDir;

/// Fields the host sets itself, and why a tenant may not.
const HOST_OWNED: &[(&[&str], &str)] = &[
    (&["plugin"], "the plugin is uploaded with the job (`tally jobs deploy <job.toml> --plugin <file>`)"),
    (&["local", "state_dir"], "the host keeps each job's state in its data directory"),
    (&["local", "output_dir"], "the host keeps a local job's outputs in its data directory"),
    (&["kafka", "state_dir"], "the host keeps each job's state in its data directory"),
    (&["kafka", "brokers"], "jobs use the brokers the host is configured with (kafka_brokers in the host file)"),
    (&["kafka", "group"], "the host names each job's consumer group (tally-<tenant>.<job>)"),
    (&["kafka", "client"], "the host owns the Kafka client settings of the jobs it runs"),
];

/// Parses `text` as `tenant`'s job and places its files in `dir`; returns
/// the job's name as the tenant calls it and the config the host runs.
/// The host runs it as `<tenant>.<name>`, so Kafka groups, transactional
/// ids and changelogs of two tenants' same-named jobs never meet.
pub fn parse(text: &str, tenant_name: &str, tenant: &TenantConfig, host: &HostConfig) -> Result<(String, JobConfig), String> {
    let data_dir = &host.data_dir;
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
    if !super::config::valid_name(&name) {
        return Err(format!("job name {name:?} must be non-empty and use only letters, digits and `-`"));
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
        let Some(brokers) = &host.kafka_brokers else {
            return Err("this host runs no Kafka jobs (its host file has no kafka_brokers); use a [local] job".into());
        };
        kafka.insert("brokers".into(), toml::Value::String(brokers.clone()));
    }
    let config: JobConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|err: toml::de::Error| format!("the job file is invalid: {}", err.message()))?;
    config.validate().map_err(|err| err.to_string().replacen(&format!("job `{tenant_name}.{name}`"), &format!("job `{name}`"), 1))?;
    if let Some(kafka) = &config.kafka {
        let prefix = format!("{tenant_name}.");
        let topics = kafka.inputs.iter().chain(kafka.outputs.values()).chain([&kafka.dead_letter_topic]);
        for topic in topics {
            if !topic.starts_with(&prefix) || topic.starts_with("tally-") {
                return Err(format!("topic `{topic}` is not one of tenant `{tenant_name}`'s: a job may only use topics named `{prefix}<name>`"));
            }
        }
    }
    let limits = &config.limits;
    if limits.memory_bytes > host.max_memory_bytes || limits.cpu_budget_ms > host.max_cpu_budget_ms {
        return Err(format!(
            "limits.memory_bytes may be at most {} and limits.cpu_budget_ms at most {} on this host",
            host.max_memory_bytes, host.max_cpu_budget_ms
        ));
    }
    // What one batch may make the host buffer: no more than the defaults.
    if limits.max_output_bytes_per_batch > DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH || limits.max_state_bytes_per_batch > DEFAULT_MAX_STATE_BYTES_PER_BATCH {
        return Err(format!(
            "limits.max_output_bytes_per_batch and limits.max_state_bytes_per_batch may be at most {DEFAULT_MAX_OUTPUT_BYTES_PER_BATCH} and {DEFAULT_MAX_STATE_BYTES_PER_BATCH} on this host"
        ));
    }
    if config.kafka.as_ref().is_some_and(|kafka| kafka.create_partitions > MAX_CREATE_PARTITIONS) {
        return Err(format!("kafka.create_partitions may be at most {MAX_CREATE_PARTITIONS} on this host"));
    }
    let mut config = config;
    if let Some(local) = &mut config.local {
        let Some(input_dir) = tenant.input_dir.as_deref() else {
            return Err(format!("tenant `{tenant_name}` has no input_dir in the host configuration, so it cannot run local jobs"));
        };
        check_inputs(input_dir, &local.inputs)?;
        // Checked again on every file the job opens, after it is open.
        local.confine_to = Some(input_dir.to_path_buf());
    }
    Ok((name, config))
}

/// Opens each input the way the job will ([`LocalSource::open_confined`]):
/// a regular file inside `input_dir` once every link is followed. Said at
/// deploy in the tenant's terms; the job checks again on every open.
fn check_inputs(input_dir: &Path, inputs: &[std::path::PathBuf]) -> Result<(), String> {
    for input in inputs {
        let shown = input.strip_prefix(input_dir).unwrap_or(input).display();
        match LocalSource::open_confined(std::slice::from_ref(input), &[], Some(input_dir)) {
            Ok(_) => {}
            Err(SourceError::Outside { .. }) => {
                return Err(format!("input `{shown}` leads outside the tenant's input directory, or is not a regular file"));
            }
            Err(err) => return Err(format!("input `{shown}` cannot be opened: {err}")),
        }
    }
    Ok(())
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
    Ok(input_dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(input_dir: Option<&Path>) -> TenantConfig {
        TenantConfig { token: "0123456789abcdef".into(), input_dir: input_dir.map(Path::to_path_buf), max_jobs: 16 }
    }

    fn host() -> HostConfig {
        let mut host: HostConfig = toml::from_str("data_dir = \"/data\"\nkafka_brokers = \"127.0.0.1:9092\"\n[tenants]\n").unwrap();
        host.data_dir = "/data".into();
        host
    }

    const LOCAL: &str = "name = \"billing\"\noutputs = [\"totals\"]\n[local]\ninputs = [\"usage-0.ndjson\"]\n";

    #[test]
    fn the_host_places_files_and_qualifies_the_name() {
        let inputs = tempfile::tempdir().unwrap();
        std::fs::write(inputs.path().join("usage-0.ndjson"), "").unwrap();
        let (name, config) = parse(LOCAL, "acme", &tenant(Some(inputs.path())), &host()).unwrap();
        assert_eq!(name, "billing");
        assert_eq!(config.name, "acme.billing");
        let local = config.local.unwrap();
        assert_eq!(local.inputs, [inputs.path().join("usage-0.ndjson")]);
        assert_eq!(local.state_dir, Path::new("/data/jobs/acme/billing/state"));
    }

    #[test]
    fn host_owned_fields_escapes_and_unknown_fields_are_refused() {
        let inputs = tempfile::tempdir().unwrap();
        std::fs::write(inputs.path().join("usage-0.ndjson"), "").unwrap();
        let tenant = tenant(Some(inputs.path()));
        let data = &host();
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
        std::os::unix::fs::symlink("/etc/hostname", inputs.path().join("link.ndjson")).unwrap();
        let err = parse(&LOCAL.replace("usage-0", "link"), "acme", &tenant, data).unwrap_err();
        assert!(err.contains("leads outside"), "{err}");
    }

    #[test]
    fn kafka_jobs_use_the_hosts_brokers_and_only_their_tenants_topics() {
        let kafka = "name = \"billing\"\noutputs = [\"totals\"]\n[kafka]\ninputs = [\"acme.usage\"]\noutputs = { totals = \"acme.totals\" }\ndead_letter_topic = \"acme.dead\"\n";
        let (_, config) = parse(kafka, "acme", &tenant(None), &host()).unwrap();
        assert_eq!(config.kafka.unwrap().brokers, "127.0.0.1:9092");
        let err = parse(&kafka.replace("acme.usage", "globex.usage"), "acme", &tenant(None), &host()).unwrap_err();
        assert!(err.contains("not one of tenant `acme`'s"), "{err}");
        let err = parse(&kafka.replace("[kafka]", "[kafka]\ngroup = \"tally-globex.billing\""), "acme", &tenant(None), &host()).unwrap_err();
        assert!(err.contains("remove `kafka.group`"), "{err}");
        let err = parse(&format!("{kafka}[kafka.client]\n\"plugin.library.paths\" = \"x\"\n"), "acme", &tenant(None), &host()).unwrap_err();
        assert!(err.contains("remove `kafka.client`"), "{err}");
        let err = parse(&format!("{kafka}[limits]\nmemory_bytes = 1099511627776\n"), "acme", &tenant(None), &host()).unwrap_err();
        assert!(err.contains("at most"), "{err}");
    }
}
