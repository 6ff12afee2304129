//! Hostile requests against the admin API: lying `Content-Length`s, bodies
//! that never come, headers that never end, connection floods, garbage,
//! host-owned settings in every TOML form. The API answers everyone else
//! throughout, and nothing is written.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tally_tests::serve::{ACME, GLOBEX, JsonApi, ServeHost, local_job};
use tally_tests::usage_lines;

use crate::plugins;
use crate::serve::{plugin, refused, write_input};

/// Sends `request` on a new connection and reads the answer's status line
/// (or `None` if the host closed the connection without one).
fn send(host: &ServeHost, request: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect(host.address()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|window| window == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().filter(|line| line.starts_with("HTTP/1.1")).map(str::to_string)
}

/// The API answers a plain request at once.
fn answers(host: &ServeHost) {
    let started = Instant::now();
    let client = JsonApi::new(&host.server, None);
    client
        .request("GET", "/healthz", None)
        .unwrap_or_else(|err| panic!("the API stopped answering: {err}\n{}", host.log()));
    host.client(ACME)
        .list()
        .unwrap_or_else(|err| panic!("the API stopped answering a tenant: {err}\n{}", host.log()));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the API took {:?} to answer",
        started.elapsed()
    );
}

#[test]
fn lying_stalling_and_flooding_clients_cannot_take_the_api_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = ServeHost::start_with(dir.path(), "max_upload_bytes = 1048576", "", "");
    let lines = usage_lines(61, 1_000, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    host.client(ACME)
        .deploy(&local_job("billing", &["usage.ndjson"], ""), &plugin(plugins::USAGE_BILLING))
        .unwrap();
    let token = format!("Authorization: Bearer {ACME}\r\n");

    // Bodies announced larger than any memory, with and without a token:
    // refused from the headers, nothing allocated.
    for length in ["4611686018427387904", "9223372036854775809", "18446744073709551615"] {
        for auth in ["", token.as_str()] {
            let request = format!(
                "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
            );
            let status = send(&host, request.as_bytes())
                .unwrap_or_else(|| panic!("no answer to Content-Length {length}"));
            // hyper itself refuses a length it cannot hold as a body length.
            let expected = if length == "18446744073709551615" {
                " 4"
            } else if auth.is_empty() {
                " 401 "
            } else {
                " 413 "
            };
            assert!(
                status.contains(expected),
                "Content-Length {length} with{} a token: {status}",
                if auth.is_empty() { "out" } else { "" }
            );
        }
    }
    // The same four at once, as four workers once died of.
    let attackers: Vec<_> = (0..4)
        .map(|_| {
            let address = host.address().to_string();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(address).unwrap();
                let _ = stream.write_all(b"PUT /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775809\r\n\r\n");
                let mut answer = [0u8; 256];
                let _ = stream.read(&mut answer);
            })
        })
        .collect();
    for attacker in attackers {
        attacker.join().unwrap();
    }
    // A length past any number, and a request that is not HTTP.
    assert!(
        send(
            &host,
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"
        )
        .is_none_or(|status| status.contains("400"))
    );
    assert!(
        send(&host, b"\x00\x01\x02 garbage \xff\xfe\r\n\r\n")
            .is_none_or(|status| status.contains("400"))
    );
    answers(&host);

    // Clients that announce a body and never send it, clients that never
    // finish their headers, and a crowd of idle connections: the others
    // are served meanwhile.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut stream = TcpStream::connect(host.address()).unwrap();
        stream.write_all(format!("POST /v1/jobs/billing/plugin HTTP/1.1\r\nHost: x\r\n{token}Content-Length: 2000\r\n\r\n").as_bytes()).unwrap();
        stalled.push(stream);
    }
    let mut slow_headers = Vec::new();
    for _ in 0..8 {
        let mut stream = TcpStream::connect(host.address()).unwrap();
        stream.write_all(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
        slow_headers.push(stream);
    }
    let idle: Vec<TcpStream> =
        (0..100).map(|_| TcpStream::connect(host.address()).unwrap()).collect();
    answers(&host);
    // Headers that never end are cut off by the header timeout.
    let mut slow = slow_headers.pop().unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "a connection whose headers never end is closed (after {:?})",
        started.elapsed()
    );
    drop((stalled, slow_headers, idle));
    answers(&host);

    // A job file's host-owned settings, in forms a check of tables alone
    // would miss: refused, nothing written.
    let acme = host.client(ACME);
    let data = dir.path().join("data/jobs/acme");
    let before: Vec<_> =
        std::fs::read_dir(&data).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    let sneaky = [
        "name = \"k\"\noutputs = [\"totals\"]\nkafka = [\"127.0.0.1:1\", \"tally-acme.k\", [\"acme.in\"], {totals = \"acme.out\"}, \"acme.dead\", \"/any/state\", \"exactly_once\", false, 1, 10000, {\"plugin.library.paths\" = \"/tmp/evil.so\"}]\n",
        "name = \"l\"\noutputs = [\"totals\"]\nlocal = [[\"usage.ndjson\"], \"/tmp/any-out\", \"/tmp/any-state\"]\n",
        "name = \"m\"\noutputs = [\"totals\"]\nlocal.inputs = [\"usage.ndjson\"]\nlocal.state_dir = \"/tmp/any-state\"\n",
        "name = \"n\"\noutputs = [\"totals\"]\n[[local]]\ninputs = [\"usage.ndjson\"]\n",
    ];
    for text in sneaky {
        let (status, message) = refused(acme.deploy(text, &plugin(plugins::USAGE_BILLING)));
        assert_eq!(status, 400, "{text}: {message}");
    }
    let after: Vec<_> =
        std::fs::read_dir(&data).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(before, after, "no job directory was made");
    assert!(
        !std::path::Path::new("/tmp/any-state").exists()
            && !std::path::Path::new("/tmp/any-out").exists()
    );

    assert!(host.is_running(), "the host is up:\n{}", host.log());
    assert!(host.terminate(), "SIGTERM stops the host cleanly:\n{}", host.log());
}

#[test]
fn a_tenant_stalling_its_uploads_leaves_other_tenants_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let host = ServeHost::start_with(dir.path(), "max_upload_bytes = 1048576", "", "");
    let lines = usage_lines(62, 100, 0);
    write_input(&host, "acme", "usage.ndjson", &lines);
    write_input(&host, "globex", "usage.ndjson", &lines);
    let component = plugin(plugins::USAGE_BILLING);
    host.client(ACME).deploy(&local_job("billing", &["usage.ndjson"], ""), &component).unwrap();

    // acme announces more bodies than the host reads at once and sends
    // none of them.
    let token = format!("Authorization: Bearer {ACME}\r\n");
    let stalled: Vec<TcpStream> = (0..2 * tally_host::serve::api::MAX_UPLOADS_IN_FLIGHT)
        .map(|_| {
            let mut stream = TcpStream::connect(host.address()).unwrap();
            stream.write_all(format!("POST /v1/jobs/billing/plugin HTTP/1.1\r\nHost: x\r\n{token}Content-Length: 2000\r\n\r\n").as_bytes()).unwrap();
            stream
        })
        .collect();
    // Let the stalled requests take their turns at reading first.
    std::thread::sleep(Duration::from_millis(500));

    // globex's upload is read and its job deployed while acme's uploads
    // still wait for their bodies (unanswered: they would be answered 408
    // once their body timeout ran out, and only then would globex's turn
    // come if acme could hold every turn).
    host.client(GLOBEX)
        .deploy(&local_job("billing", &["usage.ndjson"], ""), &component)
        .unwrap_or_else(|err| panic!("globex's deploy: {err}\n{}", host.log()));
    for mut stream in stalled {
        stream.set_nonblocking(true).unwrap();
        let mut answer = [0u8; 64];
        match stream.read(&mut answer) {
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!(
                "acme's stalled upload was answered before globex's deploy was: {other:?} {:?}",
                String::from_utf8_lossy(&answer)
            ),
        }
    }
    answers(&host);
}
