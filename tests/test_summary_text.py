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
    assert len(parts) == 4 and sum(parts) == total, read
    assert parts[1] > 0                       # lines that hit an anchor but no pattern are counted
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
