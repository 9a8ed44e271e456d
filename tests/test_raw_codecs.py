"""What existing shippers put on the raw topic -> RawLine (pure: no broker needed).

The record shapes are the shippers' own documented output: Fluent Bit's Kafka output
(``Format json``: the tail input's ``log`` key, ``@timestamp`` as a double, the file
under ``Path_Key``, the host added by a ``record_modifier`` filter), Vector's ``file``
source through its Kafka sink (``file``, ``host``, ``message``, ``source_type``,
``timestamp``), the rsyslog ``omkafka`` template of connectors/README.md, and kcat's
plain lines with headers (``-H path=... -H host=...``).
"""
import json

import pytest

from firstfault.rules.errors import RecordError
from firstfault.streams.codecs import bundle_path, decode_raw

XID = ("Nov  2 10:03:11 node-02 kernel: [887881.545061] NVRM: Xid (PCI:0000:1b:00): 149, pid=89695, "
       "name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 "
       "0x00000000 0x00000000)")
APP = "3: [rank3]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout"


def test_fluent_bit_tail_record_with_path_key_and_hostname():
    rec = {"@timestamp": 1793613791.123456, "log": XID, "path": "/var/log/syslog", "hostname": "node-02"}
    line = decode_raw(json.dumps(rec).encode(), b"node-02", offset=41)
    assert (line.host, line.path, line.source, line.line, line.text) == \
        ("node-02", "logs/syslog/node-02.log", "syslog", 42, XID)


def test_vector_file_source_record():
    rec = {"file": "/var/log/kern.log", "host": "node-02.cluster.local", "message": XID,
           "source_type": "file", "timestamp": "2026-11-02T10:03:11.402Z"}
    line = decode_raw(json.dumps(rec).encode(), None, offset=0)
    assert (line.path, line.source, line.line) == ("logs/syslog/node-02.cluster.local.log", "syslog", 1)


def test_rsyslog_template_record_names_source_and_workload():
    rec = {"host": "node-03", "path": "/scratch/jobs/4471823/train.log", "source": "app", "message": APP,
           "workload_id": "slurm-4471823"}
    line = decode_raw(json.dumps(rec).encode(), b"node-03", offset=9)
    assert (line.path, line.source, line.workload_id, line.line) == \
        ("logs/app/node-03.train.log", "app", "slurm-4471823", 10)


def test_kcat_plain_line_with_headers():
    headers = [("host", b"node-02"), ("path", b"/var/log/nvidia-fabricmanager/fabricmanager.log")]
    line = decode_raw(b"[Nov 02 2026 10:03:11] [ERROR] [tid 1203] detected NVSwitch fatal error\n", None,
                      headers, offset=7)
    assert (line.path, line.source, line.line) == ("logs/fabricmanager/node-02.log", "fabricmanager", 8)
    assert line.text.endswith("fatal error")


def test_plain_line_keyed_by_host_is_that_hosts_syslog():
    line = decode_raw(XID.encode(), b"node-02", offset=None)
    assert (line.path, line.source, line.line) == ("logs/syslog/node-02.log", "syslog", 1)


def test_a_shippers_own_line_number_wins_over_the_offset():
    rec = {"log": APP, "host": "node-01", "path": "logs/app/node-01.log", "line": 118}
    assert decode_raw(json.dumps(rec).encode(), None, offset=5000).line == 118
    headers = [("host", b"node-01"), ("path", b"logs/app/node-01.log"), ("line", b"77")]
    assert decode_raw(APP.encode(), None, headers, offset=5000).line == 77


@pytest.mark.parametrize("host,path,source,want", [
    ("node-02", "logs/syslog/node-02.log", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/messages", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/syslog.1", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/messages-20261102", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/kern.log.2.gz", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/journal/abc/system.journal", None, ("logs/syslog/node-02.log", "syslog")),
    ("node-02", "/var/log/nv-fabricmanager.log", None, ("logs/fabricmanager/node-02.log", "fabricmanager")),
    ("node-02", "/home/u/run/node-02.log", None, ("logs/app/node-02.log", "app")),
    ("node-02", "/home/u/run/rank-11.out", None, ("logs/app/node-02.rank-11.log", "app")),
    ("node-02", "/srv/remote/node-02.log", "syslog", ("logs/syslog/node-02.log", "syslog")),
    (None, "/home/u/run/node-05.log", None, ("logs/app/node-05.log", "app")),
])
def test_bundle_path(host, path, source, want):
    assert bundle_path(host, path, source) == want


@pytest.mark.parametrize("value,key,headers,says", [
    (b'{"log": "x"}', None, None, "neither a host nor a path"),
    (b'{"text": "x", "host": "h"}', None, None, "none of the text fields"),
    (b'{"log": "x", "path": "/var/log/syslog"}', None, None, "syslog line with no host"),
    (b'{"log": "x", "host": "h", "source": "kernel"}', None, None, "unknown source 'kernel'"),
    (b'{"log": 1, "host": "h"}', None, None, "none of the text fields"),
    (b'{"log": ', None, None, "invalid JSON"),
    (b"a line", None, None, "no host"),
    (b"", b"h", None, "empty message"),
])
def test_what_cannot_be_placed_is_refused_with_the_reason(value, key, headers, says):
    with pytest.raises(RecordError, match=says):
        decode_raw(value, key, headers)
