//! Output versions: a job's outputs, state and consumer group belong to a
//! version. `v1` is the job as its file describes it; version `N` ≥ 2 is
//! the same job replayed beside it into names of its own, so it can never
//! write another version's outputs or state (see `docs/versions.md`).
//!
//! | | v1 | vN |
//! |---|---|---|
//! | job name (idempotency keys, transactional ids, changelog) | `<name>` | `<name>.vN` |
//! | state directory | `<state_dir>` | `<state_dir>/versions/vN` |
//! | local output files | `<output_dir>/<output>.ndjson` | `<output_dir>/versions/vN/<output>.vN.ndjson` |
//! | Kafka output topics | `<topic>` | `<topic>.vN` |
//! | consumer group | `tally-<name>` (or `group`) | the same with `.vN` |

use std::path::{Path, PathBuf};

use crate::config::{JobConfig, Mode};

/// The most versions a job may have.
pub const MAX_VERSION: u32 = 999;

/// A version of a job's outputs: 1 (the live one, as the job file says)
/// to [`MAX_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(u32);

/// A version that is not one.
#[derive(Debug, thiserror::Error)]
#[error("version {given:?} is not one: give v1 to v{MAX_VERSION} (or 1 to {MAX_VERSION})")]
pub struct BadVersion {
    given: String,
}

impl Version {
    /// The live version: the job as its file describes it.
    pub const LIVE: Version = Version(1);

    /// Parses `v2` or `2`.
    pub fn parse(text: &str) -> Result<Version, BadVersion> {
        let digits = text.strip_prefix('v').unwrap_or(text);
        match digits.parse::<u32>() {
            Ok(number) if (1..=MAX_VERSION).contains(&number) && !digits.starts_with('0') => {
                Ok(Version(number))
            }
            _ => Err(BadVersion { given: text.to_string() }),
        }
    }

    /// Its number.
    pub fn number(self) -> u32 {
        self.0
    }

    /// `job` as this version runs it: every name it writes under is its
    /// own (see the module's table).
    pub fn of(self, job: &JobConfig) -> JobConfig {
        if self == Version::LIVE {
            return job.clone();
        }
        let suffix = format!(".v{}", self.0);
        let mut job = job.clone();
        job.settings.name.push_str(&suffix);
        match &mut job.mode {
            Mode::Local(local) => {
                local.state_dir = self.state_dir(&local.state_dir);
                local.output_dir = local.output_dir.join("versions").join(self.to_string());
                local.output_suffix = suffix;
            }
            Mode::Kafka(kafka) => {
                kafka.state_dir = self.state_dir(&kafka.state_dir);
                for topic in kafka.outputs.values_mut() {
                    topic.push_str(&suffix);
                }
                kafka.dead_letter_topic.push_str(&suffix);
                if let Some(group) = &mut kafka.group {
                    group.push_str(&suffix);
                }
                // A version's output topics are its own: it creates them.
                kafka.create_topics = true;
            }
        }
        job
    }

    /// Where this version keeps its state, given the live version's.
    fn state_dir(self, live: &Path) -> PathBuf {
        live.join("versions").join(self.to_string())
    }

    /// The versions of `job` with state on disk, in order: v1 first (when
    /// it has run), then each replayed one.
    pub fn on_disk(job: &JobConfig) -> Vec<Version> {
        let live = match &job.mode {
            Mode::Local(local) => &local.state_dir,
            Mode::Kafka(kafka) => &kafka.state_dir,
        };
        let mut versions: Vec<Version> = std::fs::read_dir(live.join("versions"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| Version::parse(&entry.file_name().to_string_lossy()).ok())
            .filter(|version| *version != Version::LIVE)
            .collect();
        if live.join("db").exists() {
            versions.push(Version::LIVE);
        }
        versions.sort();
        versions
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_v1_to_the_most() {
        assert_eq!(Version::parse("v2").unwrap().number(), 2);
        assert_eq!(Version::parse("17").unwrap().to_string(), "v17");
        for bad in ["v0", "0", "v", "", "v1000", "v02", "-1", "v2x", "V2"] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
    }
}
