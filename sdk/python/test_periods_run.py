"""tally.testing.PeriodsRun under pytest: a period plugin run through the
real host. First against a stand-in `tally` (a script that does what the
host's `plugin build` and `run` do to the files, so the driver's own part
is checked in milliseconds: the job it writes, what each send adds, exact
integers, errors naming stderr, clean-up), then through the real `tally`
with plugins/billing-periods-python (`tally` is $TALLY_BIN or on PATH:
without one, that test fails saying so)."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tally.testing import DeadLetter, PeriodRecord, PeriodsRun, PeriodsSent, tally_binary

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent.parent / "plugins" / "billing-periods-python"
MAX = 2**64 - 1

# The stand-in host: `plugin build <dir> --out <file>` writes the file;
# `run job.toml` answers each input line it has not read yet: a line
# "final N" or "adjust N PREVIOUS" gives a record, anything else a dead
# letter; "fail" makes the run fail.
FAKE_TALLY = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_TALLY_LOG"], "a") as log:
    log.write(json.dumps([os.getcwd()] + args) + "\\n")
if args[:2] == ["plugin", "build"]:
    if os.environ.get("FAKE_TALLY_BUILD_FAILS"):
        sys.exit("error: the build broke")
    open(args[args.index("--out") + 1], "wb").write(b"\\0asm")
    sys.exit(0)
assert args == ["run", "job.toml"], args
os.makedirs("out", exist_ok=True)
os.makedirs("state", exist_ok=True)
done = int(open("state/read").read()) if os.path.exists("state/read") else 0
lines = open("events.ndjson", "rb").read().split(b"\\n")[:-1]
for offset, line in enumerate(lines[done:], done):
    words = line.split()
    if words == [b"fail"]:
        sys.exit(f"error: line {offset} broke the run")
    if words[:1] == [b"final"]:
        value = {"type": "final", "customer": "acme", "metric": "calls", "period": "2026-11", "time_zone": "America/New_York",
                 "start": "2026-11-01T04:00:00Z", "end": "2026-12-01T05:00:00Z", "value": int(words[1]), "version": 1, "tzdata": "2026f"}
    elif words[:1] == [b"adjust"]:
        value = {"type": "adjustment", "period": "2026-11", "start": "s", "end": "e", "value": int(words[1]),
                 "previous": int(words[2]), "delta": int(words[1]) - int(words[2]), "version": 2}
    else:
        with open("out/dead-letters.ndjson", "a") as out:
            out.write(json.dumps({"reason": "malformed: nope", "record": line.decode(errors="replace"), "source": {"partition": "events.ndjson", "offset": offset}}) + "\\n")
        continue
    with open("out/periods.ndjson", "a") as out:
        out.write(json.dumps({"key": {}, "value": value, "source": {"partition": "events.ndjson", "offset": offset}}) + "\\n")
open("state/read", "w").write(str(len(lines)))
"""


@pytest.fixture
def fake_tally(tmp_path, monkeypatch):
    script = tmp_path / "tally"
    script.write_text(f"#!{sys.executable}\n{FAKE_TALLY}")
    script.chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("TALLY_BIN", str(script))
    monkeypatch.setenv("FAKE_TALLY_LOG", str(log))
    return log


def calls(log) -> list:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_it_builds_once_writes_the_job_and_runs_it_per_send(fake_tally, tmp_path):
    with PeriodsRun(tmp_path / "project", periods='grace = "48h"', plugin_config='meters = { calls = "sum" }') as run:
        directory = run.dir
        assert Path(directory, "plugin.wasm").read_bytes() == b"\0asm"
        assert Path(directory, "job.toml").read_text() == textwrap.dedent("""\
            name = "test"
            plugin = "plugin.wasm"
            outputs = ["periods"]

            [local]
            inputs = ["events.ndjson"]
            output_dir = "out"
            state_dir = "state"

            [periods]
            grace = "48h"

            [plugin_config]
            meters = { calls = "sum" }
            """)
        run.send(["x"])
        run.send([])
        assert Path(directory, "events.ndjson").read_text() == "x\n"
    assert calls(fake_tally) == [
        [directory, "plugin", "build", str(tmp_path / "project"), "--out", os.path.join(directory, "plugin.wasm")],
        [directory, "run", "job.toml"],
        [directory, "run", "job.toml"],
    ]
    assert not os.path.exists(directory)


def test_each_send_returns_only_what_its_run_added_with_exact_integers(fake_tally, tmp_path):
    with PeriodsRun(tmp_path) as run:
        first = run.send(["final 12", "not an event", b"final 7"])
        assert first.dead_letters == [DeadLetter(1, "malformed: nope")]
        assert [(record.type, record.value, record.version, record.previous, record.delta) for record in first.records] == [
            ("final", 12, 1, None, None),
            ("final", 7, 1, None, None),
        ]
        assert first.records[0] == PeriodRecord(
            "final", "acme", "2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", 12, 1, None, None, first.records[0].fields
        )
        assert first.records[0].fields["tzdata"] == "2026f" and first.records[0].fields["metric"] == "calls"
        second = run.send([f"adjust {MAX} 12", "adjust 3 12", "junk"])
        assert second == PeriodsSent(
            records=[
                PeriodRecord("adjustment", None, "2026-11", "s", "e", MAX, 2, 12, MAX - 12, second.records[0].fields),
                PeriodRecord("adjustment", None, "2026-11", "s", "e", 3, 2, 12, -9, second.records[1].fields),
            ],
            dead_letters=[DeadLetter(5, "malformed: nope")],
        )
        assert hash(second.records[0]) == hash(second.records[0])  # frozen, `fields` left out of the hash
        assert run.send([]) == PeriodsSent([], [])


def test_a_failing_run_raises_with_its_stderr_and_a_line_break_is_refused(fake_tally, tmp_path):
    with PeriodsRun(tmp_path) as run:
        with pytest.raises(RuntimeError, match=r"run job\.toml` .*failed with exit status 1:\nerror: line 0 broke the run"):
            run.send(["fail"])
        with pytest.raises(ValueError, match="line break"):
            run.send(["a\nb"])


def test_a_failing_build_raises_with_its_stderr_and_leaves_nothing(fake_tally, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TALLY_BUILD_FAILS", "1")
    with pytest.raises(RuntimeError, match=r"plugin build .*failed with exit status 1:\nerror: the build broke"):
        PeriodsRun(tmp_path)
    (build,) = calls(fake_tally)
    assert not os.path.exists(build[0])


def test_close_removes_the_directory_and_a_closed_run_says_so(fake_tally, tmp_path):
    run = PeriodsRun(tmp_path)
    run.close()
    assert not os.path.exists(run.dir)
    run.close()
    with pytest.raises(RuntimeError, match="closed"):
        run.send(["final 1"])


def test_without_tally_it_names_tally_bin_path_and_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.delenv("TALLY_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError) as missing:
        PeriodsRun(tmp_path)
    message = str(missing.value)
    assert "$TALLY_BIN" in message and "PATH" in message and "cargo install --path host" in message
    monkeypatch.setenv("TALLY_BIN", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        tally_binary()


# ---- Through the real host ---------------------------------------------------


def test_the_real_host_emits_final_adjustment_and_dead_letters():
    event = '{{"id":"{}","customer":"acme","metric":"calls","quantity":{},"ts":"{}"}}'.format
    periods = 'time_zones = { acme = "America/New_York" }'
    with PeriodsRun(PLUGIN, periods=periods, plugin_config='meters = { calls = "sum" }') as run:
        sent = run.send([
            event("a", 5, "2026-11-10T12:00:00Z"),
            event("b", 7, "2026-12-01T00:00:00Z"),  # 19:00 on 30 November in New York
            event("c", 1, "2026-12-03T00:00:00Z"),  # past November's end plus the default grace (24h)
        ])
        assert sent.dead_letters == []
        (final,) = sent.records
        assert (final.type, final.customer, final.period, final.value, final.version) == ("final", "acme", "2026-11", 12, 1)
        assert (final.start, final.end, final.previous, final.delta) == ("2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", None, None)
        assert final.fields["time_zone"] == "America/New_York" and final.fields["metric"] == "calls"

        sent = run.send([event("d", MAX - 12, "2026-11-20T00:00:00Z"), "not json", event("a", 5, "2026-11-10T12:00:00Z")])
        (adjustment,) = sent.records
        assert (adjustment.type, adjustment.period, adjustment.version) == ("adjustment", "2026-11", 2)
        assert (adjustment.value, adjustment.previous, adjustment.delta) == (MAX, 12, MAX - 12)
        assert sent.dead_letters == [
            DeadLetter(4, "malformed: event is not valid JSON"),
            DeadLetter(5, 'duplicate: event id "a" was counted already'),
        ]
