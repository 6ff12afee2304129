//! A raw plugin that counts events per key `k` into output `counts`, unless
//! the event's `do` asks it to attack the host instead (with a size or
//! count `n` where one applies):
//!
//! | `do` | what it does |
//! |---|---|
//! | `loop` | loops forever |
//! | `spin` | spins `n` iterations, then counts |
//! | `hog` | allocates memory until there is none |
//! | `recurse` | recurses until the stack runs out |
//! | `panic` | panics |
//! | `emit-flood` | emits 1 KiB records without end |
//! | `emit` | emits `n` bytes in 1 KiB records, then counts |
//! | `state-flood` | writes new 1 KiB state values without end |
//! | `delete-flood` | deletes new keys without end |
//! | `get-amplify` | writes one `n`-byte value, then reads it 100,000 times in one call |
//! | `log-flood` | logs `n` lines, each with a forged host line after a newline |
//! | `write-then-reject` | writes state and emits, then rejects the event |

use std::hint::black_box;

use serde::Deserialize;
use tally_sdk::{Event, Host, Level, OutputRecord, Plugin, Rejection};

#[derive(Deserialize)]
struct Command {
    k: String,
    #[serde(default, rename = "do")]
    action: String,
    #[serde(default)]
    n: u64,
}

#[derive(Default)]
pub struct Hostile;

const RECORD: [u8; 1024] = [b'x'; 1024];

impl Plugin for Hostile {
    fn process(&self, events: Vec<Event>, host: &mut dyn Host) -> Vec<Rejection> {
        let mut rejections = Vec::new();
        for (index, event) in events.iter().enumerate() {
            let index = index as u32;
            let command: Command = match serde_json::from_slice(&event.value) {
                Ok(command) => command,
                Err(err) => {
                    rejections.push(Rejection { index, reason: format!("not a command: {err}") });
                    continue;
                }
            };
            match command.action.as_str() {
                "loop" => loop {
                    black_box(&command);
                },
                "spin" => {
                    let mut spins = 0u64;
                    while spins < command.n {
                        spins = black_box(spins + 1);
                    }
                }
                "hog" => {
                    let mut hog: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hog.push(black_box(vec![1u8; 1 << 20]));
                    }
                }
                "recurse" => {
                    black_box(recurse(black_box(1)));
                }
                "panic" => panic!("asked to panic on key {}", command.k),
                "emit-flood" => loop {
                    host.emit_many(
                        "counts",
                        &[OutputRecord { event: index, key: None, value: &RECORD }],
                    );
                },
                "emit" => {
                    let mut left = command.n as usize;
                    while left > 0 {
                        let len = left.min(RECORD.len());
                        host.emit_many(
                            "counts",
                            &[OutputRecord { event: index, key: None, value: &RECORD[..len] }],
                        );
                        left -= len;
                    }
                }
                "state-flood" => {
                    for n in 0u64.. {
                        host.put_many(&[(format!("flood-{n}").as_bytes(), &RECORD)]);
                    }
                }
                "delete-flood" => {
                    for n in 0u64.. {
                        host.delete_many(&[format!("gone-{n}").as_bytes()]);
                    }
                }
                "get-amplify" => {
                    let value = vec![7u8; command.n as usize];
                    host.put_many(&[(b"big", &value)]);
                    let keys: Vec<&[u8]> = vec![b"big"; 100_000];
                    black_box(host.get_many(&keys));
                }
                "log-flood" => {
                    for line in 0..command.n {
                        host.log(Level::Info, &format!("line {line}\n2026-12-01T00:00:00.000000Z  INFO tally_host::serve: job deleted tenant=victim\r\x1b[2K"));
                    }
                }
                "write-then-reject" => {
                    host.put_many(&[(command.k.as_bytes(), b"999999")]);
                    host.emit_many(
                        "counts",
                        &[OutputRecord {
                            event: index,
                            key: Some(command.k.as_bytes()),
                            value: b"999999",
                        }],
                    );
                    rejections.push(Rejection { index, reason: "rejected after writing".into() });
                    continue;
                }
                _ => {}
            }
            let key = serde_json::to_vec(&command.k).expect("a string serializes");
            let count = host
                .get_many(&[&key])
                .pop()
                .flatten()
                .and_then(|value| serde_json::from_slice::<u64>(&value).ok())
                .unwrap_or(0)
                + 1;
            let value = count.to_string();
            host.put_many(&[(&key, value.as_bytes())]);
            host.emit_many(
                "counts",
                &[OutputRecord { event: index, key: Some(&key), value: value.as_bytes() }],
            );
        }
        rejections
    }
}

/// Recurses without end, with small frames: the engine's stack limit,
/// not the plugin's own memory, stops it.
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    recurse(black_box(depth + 1)).wrapping_add(depth)
}

tally_sdk::export!(Hostile);
