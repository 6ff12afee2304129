//! Hostile uploads: components that import what the host does not give,
//! that take the compiler too long, that grow tables without end; pushes
//! without end; more memory than the tenant may have. Each is refused or
//! stopped naming its bound, and the API answers others meanwhile.

use std::time::{Duration, Instant};

use tally_tests::components;
use tally_tests::serve::{ACME, GLOBEX, ServeHost, local_job, number, wait_for};
use tally_tests::usage_lines;

use crate::plugins;
use crate::serve::{plugin, refused, wait_caught_up, write_input};

#[test]
fn uploads_are_checked_before_they_compile_and_compile_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(
        dir.path(),
        "max_compile_seconds = 2",
        "",
        "max_total_memory_bytes = 2147483648",
    );
    let (acme, globex) = (host.client(ACME), host.client(GLOBEX));
    let lines = usage_lines(71, 500, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let job = local_job("billing", &["usage.ndjson"], "");

    // An import the host does not link is refused before anything compiles.
    let (status, message) = refused(acme.deploy(&job, &plugin(plugins::IMPORTS_SOCKETS)));
    assert_eq!(status, 422, "{message}");
    assert!(message.contains("wasi:sockets"), "{message}");
    assert!(
        !host.log().contains("compiled an upload in a worker"),
        "refused before its compile:\n{}",
        host.log()
    );

    // A function more in an allowed interface is refused too, naming both:
    // the compile worker compares every imported function with the host's
    // before it compiles (within its bounds), never a failure to link.
    let (status, message) =
        refused(acme.deploy(&job, &components::importing_an_unknown_state_function()));
    assert_eq!(status, 422, "{message}");
    assert!(
        message.contains(
            "imports `tally:plugin/state@0.1.0`, which has no item `frobnicate` in this host"
        ) && !message.contains("is not a valid component"),
        "the refusal names the import and the function, in the check's words: {message}"
    );

    // A component that takes the compiler too long is stopped at the
    // bound; the other tenant is served meanwhile.
    let slow = components::slow_to_compile(3_000, 400_000);
    let watcher = {
        let globex = host.client(GLOBEX);
        std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            for _ in 0..20 {
                let started = Instant::now();
                globex.list().unwrap();
                slowest = slowest.max(started.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
            slowest
        })
    };
    let started = Instant::now();
    let (status, message) = refused(acme.deploy(&job, &slow));
    assert_eq!(status, 422, "{message}");
    assert!(
        message.contains("max_compile_seconds") && message.contains("2 s"),
        "the refusal names the bound: {message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the compile was cut off at its bound, after {:?}",
        started.elapsed()
    );
    let slowest = watcher.join().unwrap();
    assert!(slowest < Duration::from_secs(5), "another tenant waited {slowest:?} for its list");
    assert!(acme.list().unwrap().as_array().unwrap().is_empty(), "nothing was deployed");

    // Tables count in the memory limit: a plugin growing them is stopped.
    let tables = components::table_grower(60, 1_000_000);
    std::fs::write(host.inputs("acme").join("tables.ndjson"), "{}\n{}\n").unwrap();
    let tables_job = "name = \"tables\"\noutputs = [\"counts\"]\n[limits]\nmemory_bytes = 1048576\n[local]\ninputs = [\"tables.ndjson\"]\n";
    acme.deploy(tables_job, &tables).unwrap();
    wait_for("the table grower's events to be dead-lettered", Duration::from_secs(60), || {
        number(&acme.status("tables").unwrap(), "records") >= 2
    });
    let dead = tally_tests::read_dead_letters(&host.output("acme", "tables", "dead-letters"));
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter().all(|(_, _, reason)| reason.contains("memory limit of 1 MiB")
            && reason.contains("tables count")),
        "{dead:?}"
    );

    // The cap on a tenant's plugin memory.
    write_input(&host, "globex", "usage.ndjson", &lines);
    let big = "[limits]\nmemory_bytes = 1073741824";
    for name in ["g1", "g2", "g3"] {
        let result = globex
            .deploy(&local_job(name, &["usage.ndjson"], big), &plugin(plugins::USAGE_BILLING));
        if name == "g3" {
            let (status, message) = refused(result);
            assert_eq!(status, 409, "{message}");
            assert!(
                message.contains("max_total_memory_bytes") && message.contains("2147483648"),
                "the refusal names the cap: {message}"
            );
        } else {
            result.unwrap();
        }
    }
}

#[test]
fn pushed_versions_are_kept_within_bounds_and_compiled_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start_with(dir.path(), "plugin_versions_kept = 3", "", "");
    let acme = host.client(ACME);
    let lines = usage_lines(72, 2_000, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    let billing = plugin(plugins::USAGE_BILLING);
    acme.deploy(&local_job("billing", &["usage.ndjson"], ""), &billing).unwrap();
    wait_caught_up(&acme, "billing", lines.len() as u64, &host);

    // Eight builds of the same logic, each its own digest, pushed in turn.
    let mut digests = Vec::new();
    for build in 0..8u8 {
        let variant = components::with_custom_section(&billing, "build", &[build]);
        let pushed = acme.push("billing", &variant).unwrap();
        let digest = pushed["digest"].as_str().unwrap().to_string();
        // Its trial transaction needs events.
        write_input(&host, "acme", "usage.ndjson", &usage_lines(100 + u64::from(build), 10, 0));
        wait_for("the pushed build to become active", Duration::from_secs(30), || {
            acme.status("billing").unwrap()["plugin"] == digest.as_str()
        });
        digests.push(digest);
    }
    // Pushing the active build again changes nothing; so does pushing a
    // waiting build a second time.
    let again =
        acme.push("billing", &components::with_custom_section(&billing, "build", &[7])).unwrap();
    assert_eq!(again["status"], "active", "{again}");
    let waiting = components::with_custom_section(&billing, "build", &[8]);
    let first = acme.push("billing", &waiting).unwrap();
    let second = acme.push("billing", &waiting).unwrap();
    assert_eq!(
        (first["digest"].clone(), first["status"].as_str()),
        (second["digest"].clone(), Some("pending")),
        "{first} {second}"
    );
    write_input(&host, "acme", "usage.ndjson", &usage_lines(120, 10, 0));
    wait_for("the twice-pushed build to become active", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["plugin"] == first["digest"]
    });
    digests.push(first["digest"].as_str().unwrap().to_string());
    let history = acme.history("billing").unwrap();
    let versions = history.as_array().unwrap();
    assert_eq!(versions.len(), 10, "one entry per push, none for the repeats: {history}");
    assert!(
        !history.to_string().contains("superseded"),
        "no version was superseded, least of all by itself: {history}"
    );
    let kept: Vec<&str> = versions
        .iter()
        .filter(|v| v["removed"] != true)
        .map(|v| v["digest"].as_str().unwrap())
        .collect();
    assert_eq!(
        kept,
        digests[6..].iter().map(String::as_str).collect::<Vec<_>>(),
        "the newest three are kept: {history}"
    );
    let files =
        std::fs::read_dir(dir.path().join("data/jobs/acme/billing/plugins")).unwrap().count();
    assert_eq!(files, 3, "only the kept versions' components stay on disk");
    let compiled = std::fs::read_dir(dir.path().join("data/compiled"))
        .unwrap()
        .filter(|entry| {
            entry.as_ref().unwrap().path().extension().is_some_and(|ext| ext == "cwasm")
        })
        .count();
    assert_eq!(compiled, 3, "nor their compiled forms");

    // A rollback goes to a kept version; the restarted host compiles nothing.
    acme.rollback("billing").unwrap();
    let compiles_before = host.log().matches("compiled an upload in a worker").count();
    assert!(host.terminate());
    host.launch();
    let acme = host.client(ACME);
    wait_for("the job to run again", Duration::from_secs(30), || {
        acme.status("billing").unwrap()["state"] == "running"
    });
    assert_eq!(
        host.log().matches("compiled an upload in a worker").count(),
        compiles_before,
        "a restart loads compiled versions from the cache"
    );
    assert!(host.terminate());
}
