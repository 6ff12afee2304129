//! End-to-end tests of Tally: real plugins built from source, real RocksDB,
//! the real `tally` binary.

#[deny(dead_code)]
mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

mod closed_wasi;
mod crash;
mod deliver;
mod deliver_kafka;
mod hostile;
mod hostile_api;
mod hostile_uploads;
mod kafka_committer;
mod kafka_crash;
mod kafka_group;
mod kafka_restore;
mod kafka_run;
mod languages;
mod layering;
mod local_run;
mod periods;
mod periods_hostile;
mod periods_kafka;
mod periods_languages;
mod refusals;
mod sandbox;
mod scaffold;
mod serve;
mod serve_deliver;
mod serve_kafka;
mod serve_promote;
mod serve_shadow;
mod versions;
