//! Local mode's section of a job file, `[local]`, and its checks.

use std::path::PathBuf;

use serde::Deserialize;

use tally_core::settings::{InvalidJob, JobSettings};

/// Local mode's inputs, outputs and state.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// NDJSON input files, one partition each.
    pub inputs: Vec<PathBuf>,
    /// Directory of the output files (`<output>.ndjson`).
    pub output_dir: PathBuf,
    /// Directory of the job's state (RocksDB) and its lock.
    pub state_dir: PathBuf,
    /// Set by `tally serve`: every input file opened must be a regular file
    /// inside this directory (the tenant's `input_dir`).
    #[serde(skip)]
    pub confine_to: Option<PathBuf>,
    /// Set for a replayed version (`.v2`): each output's file is
    /// `<output><suffix>.ndjson`, so a file says whose it is.
    #[serde(skip)]
    pub output_suffix: String,
}

impl LocalConfig {
    /// Checks the section within job `job`; the message says what to change.
    pub fn validate(&self, job: &JobSettings) -> Result<(), InvalidJob> {
        let local = self;
        let invalid = |message: String| Err(InvalidJob { job: job.name.clone(), message });
        if local.inputs.is_empty() {
            return invalid("local.inputs must name at least one NDJSON file".into());
        }
        let mut file_names: Vec<_> = local.inputs.iter().map(|path| path.file_name()).collect();
        file_names.sort_unstable();
        if let Some(pair) = file_names.windows(2).find(|pair| pair[0] == pair[1]) {
            return invalid(format!(
                "two inputs share the file name {:?}; input file names name partitions in lineage, so they must differ",
                pair[0].unwrap_or_default()
            ));
        }
        Ok(())
    }
}
