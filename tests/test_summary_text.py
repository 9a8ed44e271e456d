"""The plain-text summary reads right (issue 13's small items): the read counts add up to
the lines read, and counts agree with their nouns."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _summary(sample: str) -> str:
    done = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(ROOT / "samples" / sample)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_read_counts_add_up_and_nouns_agree():
    text = _summary("unattributed-straggler")
    read = " ".join(text[text.index("\nRead "):text.index("\nRules ")].split())
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", read)]
    total, _files, parts = numbers[0], numbers[1], numbers[2:]
    # Matched, anchor but no pattern, no anchor; "0 unreadable" is left out: a part that is none says nothing.
    assert len(parts) == 3 and sum(parts) == total and 0 not in parts, read
    assert "hit an anchor but no pattern" in read and "unreadable" not in read
    assert " 1 hosts" not in text and " 1 host " in text


def test_percent_says_all_only_when_all():
    from firstfault.render import percent

    assert [percent(x) for x in (0, 0.001, 0.5, 0.994, 0.9987, 1)] == ["0%", "<1%", "50%", "99%", "99.8%", "100%"]


def test_page_percent_matches_the_summary():
    from jinja2 import Environment, FileSystemLoader

    from firstfault.render import percent

    env = Environment(loader=FileSystemLoader(str(ROOT / "connectors" / "api" / "templates")))
    macro = env.get_template("_percent.html").module.pct
    for x in (0, 0.001, 0.5, 0.994, 0.9987, 1):
        assert str(macro(x)).replace("&lt;", "<") == percent(x), x


def test_a_cut_evidence_line_ends_in_an_ellipsis():
    from firstfault.rules.engine import analyze_files

    wl = {"workload_id": "cut", "attempt": 0, "scheduler": "slurm", "nodes": ["n1"], "state": "FAILED",
          "start_time": "2026-11-03T10:00:00Z", "end_time": "2026-11-03T10:30:00Z"}
    line = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
            "capacity of 31.47 GiB of which 12.73 GiB is free. " + "x" * 5000)
    d = analyze_files(wl, {"logs/app/rank0.log": line + "\n"}).diagnosis
    assert d.root_cause is not None and d.root_cause.text.endswith("…") and len(d.root_cause.text) == 2000


def test_every_command_help_says_what_it_does():
    from firstfault.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    assert "contract section" not in top and "examples:" in top
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    for name, cmd in sub.choices.items():
        if name == "serve":                 # parses its own flags: `firstfault serve --help`
            continue
        assert cmd.description, f"'firstfault {name} --help' says nothing about what it does"


def test_page_shows_times_as_people_read_them():
    from firstfault.connectors.api.ui import _when, templates

    assert templates.env.filters["when"] is _when
    assert _when("2026-11-05T11:00:02.123456Z") == "2026-11-05 11:00:02.123 UTC"
    assert _when(None) == "no time"
    page = (ROOT / "connectors" / "api" / "templates" / "diagnosis.html").read_text()
    assert "|when }}</time>" in page


def test_responsible_means_at_fault_on_every_text_surface():
    """One word, one meaning: 'responsible' only for a node at fault; an application fault names the
    node it happened on as not at fault, in the CLI text, `diagnoses`' line and the chat alert."""
    from firstfault.connectors.sinks.alerts import AlertConfig, payload_slack
    from firstfault.connectors.enrich import enrich
    from firstfault.rules.engine import analyze_path
    from firstfault.streams.follow import summary_line

    app = analyze_path(ROOT / "samples" / "cuda-oom-one-rank").diagnosis
    hw = analyze_path(ROOT / "samples" / "worked-example").diagnosis
    assert app.domain == "application" and app.responsible_nodes == ["a100-01"]
    assert hw.domain == "interconnect" and hw.responsible_nodes == ["node-02"]
    text = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(ROOT / "samples" / "cuda-oom-one-rank")],
                          capture_output=True, text=True, check=True).stdout
    assert "a100-01 (an application fault: the node is not at fault)" in text and "responsible a100-01" not in text
    assert "responsible a100-01" not in summary_line(app) and "on a100-01 (not at fault)" in summary_line(app)
    assert "responsible node-02" in summary_line(hw)
    cfg = AlertConfig(webhooks=[{"name": "chat", "format": "slack", "url": "http://127.0.0.1:9/hook"}])
    slack = str(payload_slack(enrich(app, None), cfg))
    assert "*on* a100-01 (not at fault)" in slack and "responsible* a100-01" not in slack
    assert "*responsible* node-02" in str(payload_slack(enrich(hw, None), cfg))


def _analyze(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(path), *extra],
                          capture_output=True, text=True, timeout=120)


XID79 = ("Nov  2 10:03:11 node-02 kernel: [887881.545061] NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=python3, "
         "GPU has fallen off the bus." + " padding" * 30 + "\n")
WEAK = "2026-11-02 10:00:00 starting\n[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"


def test_bare_file_text_has_no_empty_coverage_no_zero_counts_and_cut_lines_end_in_an_ellipsis(tmp_path):
    """Issue 25: "100% of symptom lines explained (0 symptom lines)", "(1 symptom lines)", "0 hosts", a
    raw line cut mid-word with no mark, and a `workload.json:1` that names no file."""
    (tmp_path / "dmesg.txt").write_text(XID79)
    done = _analyze(tmp_path / "dmesg.txt")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "  coverage    no symptom lines\n" in text and "100%" not in text
    raw = next(line for line in text.splitlines() if line.lstrip().startswith("| Nov  2"))
    assert raw.endswith("…") and len(raw.split("| ", 1)[1]) == 160
    assert not re.search(r"workload\.json:\d", text)
    assert "Read        1 line in 1 file: 1 matched a pattern\n" in text       # no "0 ..." parts

    (tmp_path / "job.log").write_text(WEAK)
    text = _analyze(tmp_path / "job.log").stdout
    assert "  coverage    no cause proven, so its 1 symptom line is unexplained\n" in text
    assert "symptom lines)" not in text and " 0 host" not in text and "ranks -" not in text
    missing = text[text.index("Missing evidence"):text.index("Recovery")]
    assert not re.search(r": *$", missing.splitlines()[1]), missing               # no dangling ": "

    # JSON is unchanged by any of it: the same object analyze always printed.
    from firstfault.rules.engine import analyze_path

    j = _analyze(tmp_path / "job.log", "--json")
    assert j.returncode == 0 and j.stdout == analyze_path(tmp_path / "job.log").diagnosis.to_json() + "\n"


def test_the_root_sentence_is_printed_once_with_why_it_is_first_under_it():
    text = _summary("worked-example")
    from firstfault.rules.engine import analyze_path

    d = analyze_path(ROOT / "samples" / "worked-example").diagnosis
    assert text.count(d.root_cause.message) == 2           # the root cause line and the timeline's ROOT row
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  root cause  "))
    assert lines[at + 1].strip().startswith("It is the earliest cause")
    assert "  coverage    100% of 224 symptom lines explained" in lines


def test_unattributed_next_step_names_what_to_fetch_in_plain_words():
    text = _summary("unattributed-straggler")
    assert "collect job hosts with no kernel/syslog log" not in text
    flat = " ".join(text.split())
    assert "next: collect the kernel log (syslog, journalctl -k or dmesg -T) of node-02 and node-03" in flat


def test_help_gives_exit_codes_and_every_flag_says_what_it_does():
    from firstfault.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    commands = dict(sub.choices)
    rules_sub = next(a for a in commands["rules"]._actions if isinstance(a, type(sub)))
    commands.update({f"rules {n}": c for n, c in rules_sub.choices.items()})
    silent = [f"firstfault {name} {flag}" for name, cmd in commands.items() if name != "serve"
              for action in cmd._actions for flag in action.option_strings[:1]
              if flag not in ("-h",) and not action.help]
    assert not silent, f"flags with no help: {silent}"
    helptext = commands["analyze"].format_help()
    assert "exit codes:" in helptext and re.search(r"^  0 +a diagnosis", helptext, re.M)
    assert re.search(r"^  2 +no diagnosis: an unusable input", helptext, re.M) and "130" in helptext
    for name in ("rules test", "rules lint"):
        assert "exit codes: 0" in " ".join(commands[name].format_help().split())
    serve = subprocess.run([sys.executable, "-m", "firstfault", "serve", "--help"], capture_output=True, text=True,
                           timeout=60)
    assert serve.returncode == 0 and "Attribution" not in serve.stdout and "exit codes" in serve.stdout


def test_analyze_exits_as_its_help_says(tmp_path):
    (tmp_path / "dmesg.txt").write_text(XID79)
    (tmp_path / "blank.log").write_text("  \n\n")
    (tmp_path / "broken.tar.gz").write_bytes(b"not a tar")
    assert _analyze(tmp_path / "dmesg.txt").returncode == 0
    for bad in ("blank.log", "broken.tar.gz", "absent.log"):
        done = _analyze(tmp_path / bad)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (bad, done.stderr)
    assert _analyze(tmp_path / "dmesg.txt", "--no-such-flag").returncode == 2
    done = _analyze(tmp_path / "dmesg.txt", "--rules", str(tmp_path / "no-rules"))
    assert done.returncode == 2 and "rule catalog error" in done.stderr
