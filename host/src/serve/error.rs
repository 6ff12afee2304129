//! What can go wrong in `tally serve` outside a request's own answer: the
//! data directory, a job's record and plugin files, resuming a job, and
//! starting the admin API. Each variant names the thing and the fix.

use std::net::SocketAddr;
use std::path::PathBuf;

use tally_core::plugin::PluginError;
use tally_core::plugin::compiler::CompileError;

use super::job_spec::JobSpecError;
use tally_core::lock::LockError;

/// A failure of the serve layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A file or directory of the data directory could not be used.
    #[error("cannot {action} `{}`: {source}", path.display())]
    File {
        /// What the host tried (`read`, `write`, `create`, `remove`, `list`).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A job's record is not what the host wrote.
    #[error("`{}` is damaged: {source}; restore it from a backup, or delete the job's directory to forget the job", path.display())]
    DamagedRecord {
        /// The record.
        path: PathBuf,
        /// What the parser found.
        source: serde_json::Error,
    },
    /// The data directory is used by another host.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The Wasm engine could not start, or a kept plugin version is refused.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// A kept plugin version could not be compiled.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A kept job file is refused now (the host's caps changed).
    #[error(transparent)]
    Spec(#[from] JobSpecError),
    /// A job's tenant was removed from the host file.
    #[error(
        "tenant `{tenant}` is no longer in the host configuration; add it back, or delete the job's directory"
    )]
    TenantGone {
        /// The tenant.
        tenant: String,
    },
    /// A job's shadow cannot be resumed or started.
    #[error("its shadow cannot run: {reason}")]
    Shadow {
        /// Why.
        reason: String,
    },
    /// A promotion of the job's shadow cannot be finished.
    #[error("the promotion of its shadow cannot be finished: {reason}")]
    Promotion {
        /// Why.
        reason: String,
    },
    /// A job's record names no active plugin version.
    #[error("its record names no active plugin version; delete the job and deploy it again")]
    NoActiveVersion,
    /// A kept plugin version's file could not be read.
    #[error("cannot read plugin version {digest}: {source}")]
    ReadVersion {
        /// The version.
        digest: String,
        /// Why.
        source: std::io::Error,
    },
    /// A kept plugin version's file holds other bytes than its name says.
    #[error(
        "the job's file of plugin version {digest} holds other bytes now (its digest is {found}); delete the job and deploy it again"
    )]
    VersionChanged {
        /// The version the file is named after.
        digest: String,
        /// The digest of what it holds.
        found: String,
    },
    /// The job's active version is not loaded in this process.
    #[error(
        "plugin version {digest} is not loaded in this host; restart the host to load it from the data directory"
    )]
    NotLoaded {
        /// The version.
        digest: String,
    },
    /// The job is being deleted: nothing of it changes any more.
    #[error("job `{job}` is being deleted")]
    Deleted {
        /// The job.
        job: String,
    },
    /// The job is being promoted: it starts again in a moment.
    #[error("job `{job}` is being promoted to its shadow's version; try again once it runs again")]
    Promoting {
        /// The job.
        job: String,
    },
    /// The admin API's runtime could not start.
    #[error("cannot start the admin API's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The admin API's address is taken or not this machine's.
    #[error("cannot listen on {addr}: {source}; set `listen` in the host file to a free address")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl ServeError {
    /// A file error: `action` on `path` failed with `source`.
    pub(crate) fn file(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ServeError {
        let path = path.into();
        move |source| ServeError::File { action, path, source }
    }
}
