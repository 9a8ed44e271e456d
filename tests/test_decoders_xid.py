"""Xid / SXid decoders, fed the way the extraction patterns feed them, with real lines.

Line sources (see shared/reference/signatures.md): NVIDIA/gpu-operator#1146, leptonai/gpud
(sxid/README.md, xid testdata, kmsg tests), NVIDIA/open-gpu-kernel-modules#1150,
amoghmunikote/cmpunlocker#31, NVIDIA/NVSentinel#516, madMAx43v3r/chia-gigahorse#301.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from firstfault.rules.decoders import DECODERS, Tag, load_builtin_decoders
from firstfault.rules.decoders.xid import decode_sxid, decode_xid, load_xid_table

ROOT = Path(__file__).resolve().parent.parent / "rules" / "catalog"
load_builtin_decoders()


@pytest.fixture(scope="module")
def patterns() -> dict[str, re.Pattern[str]]:
    doc = yaml.safe_load((ROOT / "extract" / "nvidia.yaml").read_text())
    return {p["id"]: re.compile(p["regex"]) for p in doc["patterns"]}


def xid_fields(patterns, line: str) -> dict:
    """What the nvidia.xid pattern captures from ``line`` (xid typed as int, like the engine)."""
    m = patterns["nvidia.xid"].search(line)
    assert m is not None, line
    f = m.groupdict()
    f["xid"] = int(f["xid"])
    return f


def sxid_fields(patterns, line: str) -> dict:
    m = patterns["nvidia.sxid"].search(line)
    assert m is not None, line
    f = m.groupdict()
    f["sxid"] = int(f["sxid"])
    f["link"] = int(f["link"]) if f["link"] is not None else None
    return f


def _scalar_fields(tag: Tag) -> bool:
    return all(v is None or isinstance(v, (str, int, float, bool)) for v in tag.fields.values())


# ---------------------------------------------------------------- registration


def test_decoders_are_registered():
    assert DECODERS["xid"] is decode_xid
    assert DECODERS["sxid"] is decode_sxid


# ---------------------------------------------------------------- roots


def test_xid79_fell_off_the_bus(patterns):
    f = xid_fields(patterns, "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "gpu", "gpu_fell_off_bus", "strong")
    assert tag.fields["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert (tag.fields["immediate"], tag.fields["investigatory"]) == ("RESTART_BM", "CONTACT_SUPPORT")
    assert tag.fields["pid"] is None and tag.fields["pname"] is None      # '<unknown>' normalized
    assert tag.output.startswith("Xid 79 (") and "{gpu}" in tag.output and "{host}" in tag.output
    assert _scalar_fields(tag)


def test_xid48_double_bit_ecc(patterns):
    f = xid_fields(patterns, "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "gpu", "gpu_memory_ecc", "strong")
    assert tag.fields["mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert tag.fields["immediate"] == "WORKFLOW_XID_48"


def test_xid119_gsp_timeout_is_a_weak_hardware_root(patterns):
    f = xid_fields(patterns, "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    tag = decode_xid(f)
    assert (tag.role, tag.sub_domain, tag.strength) == ("root", "gpu_hardware_fault", "weak")
    assert (tag.fields["gsp_function"], tag.fields["gsp_function_name"]) == (103, "GSP_RM_ALLOC")
    assert tag.fields["mnemonic"] == "GSP_RPC_TIMEOUT"


def test_xid62_halt_is_a_strong_hardware_root(patterns):
    f = xid_fields(patterns, "[14370.687545] NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230 20238a3a 2023e8b6 2023eac4 2023ec3c 2023ea86 00000000 00000000")
    tag = decode_xid(f)
    assert (tag.role, tag.sub_domain, tag.strength) == ("root", "gpu_hardware_fault", "strong")


def test_xid31_mmu_fault_is_the_application(patterns):
    f = xid_fields(patterns, "[14328.198504] NVRM: Xid (PCI:0000:0a:00): 31, pid=13332, name=cuda_plot_k32_v, Ch 00000010, intr 00000000. MMU Fault: ENGINE CE2 HUBCLIENT_CE0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PRIV_VIOLATION ACCESS_TYPE_VIRT_READ")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "application", "illegal_memory_access", "strong")
    assert tag.fields["mmu_fault_type"] == "FAULT_PRIV_VIOLATION"
    assert tag.fields["channel"] == "00000010"


def test_xid13_reports_the_sm(patterns):
    f = xid_fields(patterns, "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
    tag = decode_xid(f)
    assert tag.sub_domain == "illegal_memory_access"
    assert (tag.fields["gpc"], tag.fields["tpc"], tag.fields["sm"]) == (7, 7, 0)


def test_xid94_contained_error_flags(patterns):
    f = xid_fields(patterns, "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No")
    assert f["gi"] == "05" and f["pname"] is None
    tag = decode_xid(f)
    assert (tag.sub_domain, tag.strength) == ("gpu_memory_ecc", "strong")
    assert tag.fields["containment"] == "contained" and tag.fields["reset_required"] is False


def test_xid32_is_a_pcie_error(patterns):
    f = xid_fields(patterns, "[31609.615516] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000052 intr 02000000")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain) == ("root", "host", "pcie_error")
    assert tag.fields["channel"] == "00000052"


# ---------------------------------------------------------------- NVLink


def test_xid149_netir_link_down_signal_integrity(patterns):
    f = xid_fields(patterns, "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "interconnect", "nvlink_signal_integrity", "strong")
    assert (tag.fields["immediate"], tag.fields["investigatory"]) == ("RESET_GPU", "INVESTIGATE_LINK_SI")
    assert tag.fields["nvlink_reason_code"] == 4 and tag.fields["nvlink_link"] == 8
    assert "Alignment_loss" in tag.output
    assert _scalar_fields(tag)


def test_xid149_peer_reset_is_weak(patterns):
    f = xid_fields(patterns, "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    tag = decode_xid(f)
    assert (tag.sub_domain, tag.strength) == ("nvlink_error", "weak")


def test_xid145_rxpipe_nonfatal_is_noise(patterns):
    f = xid_fields(patterns, "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")
    tag = decode_xid(f)
    assert tag.role == "noise" and tag.sub_domain is None
    assert tag.fields["nvlink_unit"] == "RLW_RXPIPE"


def test_xid145_redacted_words_and_unstructured_text(patterns):
    f = xid_fields(patterns, "kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)")
    assert f["pci"] is None
    tag = decode_xid(f)
    assert tag.role == "noise"          # the tail parses; no words, "Nonfatal" decides
    tag = decode_xid({"xid": 145, "pci": None, "msg": "something else entirely", "pid": None, "pname": None})
    assert (tag.role, tag.sub_domain, tag.strength) == ("root", "nvlink_error", "weak")


def test_xid74_register_bits(patterns):
    f = xid_fields(patterns, "[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    tag = decode_xid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "interconnect", "nvlink_error", "strong")
    assert tag.fields["nvlink_link"] == 14
    assert tag.fields["nvlink74_reg2"] == "0x10000"
    assert tag.fields["nvlink74_bits"] == "reg2.bit16:fielddiag_if_repeated"


def test_xid74_with_only_sympathetic_bits_is_weak():
    msg = "NVLink: fatal error detected on link 6(0x2, 0x0, 0x0, 0x10000, 0x0, 0x0, 0x0)"
    tag = decode_xid({"xid": 74, "pci": "0000:b9:00", "msg": msg, "pid": None, "pname": None})
    assert (tag.sub_domain, tag.strength) == ("nvlink_error", "weak")
    assert tag.fields["nvlink74_classes"] == "sympathetic"


def test_xid74_with_an_unlisted_bit_stays_strong():
    msg = "NVLink: fatal error detected on link 6(0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x1)"
    tag = decode_xid({"xid": 74, "pci": "0000:b9:00", "msg": msg, "pid": None, "pname": None})
    assert tag.strength == "strong" and "unlisted" in tag.fields["nvlink74_classes"]


# ---------------------------------------------------------------- markers


def test_xid45_caused_by_previous_xid(patterns):
    f = xid_fields(patterns, "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149")
    tag = decode_xid(f)
    assert tag.role == "marker" and tag.domain is None
    assert tag.fields["caused_by_xid"] == 149
    assert tag.fields["channel"] == "00000001"
    assert "Xid 149" in tag.output


def test_xid45_without_cause(patterns):
    f = xid_fields(patterns, "[14370.688139] NVRM: Xid (PCI:0000:0a:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008")
    tag = decode_xid(f)
    assert tag.role == "marker" and tag.fields["caused_by_xid"] is None


@pytest.mark.parametrize("line,code,name,reset", [
    ("Aug 19 11:38:39  NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", 2, "node_reboot", True),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", 2, "node_reboot", True),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", 1, "gpu_reset", True),
    # constructed from the driver's action names (ctrl2080gpu.h): no public log line seen
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", 4, "drain_and_reset", True),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", 0, "none", False),
])
def test_xid154_recovery_action_from_the_hex_value(patterns, line, code, name, reset):
    tag = decode_xid(xid_fields(patterns, line))
    assert tag.role == "marker"
    assert tag.fields["recovery_action_code"] == code
    assert tag.fields["recovery_action"] == name
    assert tag.fields["requests_reset"] is reset


def test_xid154_keys_on_the_value_not_the_name():
    msg = "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"
    tag = decode_xid({"xid": 154, "pci": "0000:0d:00", "msg": msg, "pid": None, "pname": None})
    assert tag.fields["recovery_action"] == "gpu_reset" and tag.fields["recovery_action_text"] == "PF FLR"


# ---------------------------------------------------------------- noise, unknown


@pytest.mark.parametrize("xid", [63, 92, 121, 14, 106, 107, 93])
def test_benign_xids_are_noise(xid):
    tag = decode_xid({"xid": xid, "pci": "0000:10:1c", "msg": "x", "pid": None, "pname": None})
    assert tag.role == "noise"


def test_xid63_row_remap_line_is_noise(patterns):
    tag = decode_xid(xid_fields(patterns, "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."))
    assert tag.role == "noise"


def test_unknown_xid_is_a_weak_hardware_root():
    tag = decode_xid({"xid": 999, "pci": "0000:65:00", "msg": "", "pid": None, "pname": None})
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "gpu", "gpu_hardware_fault", "weak")
    assert tag.fields["known"] is False and tag.fields["mnemonic"] is None


def test_missing_xid_number_is_not_decoded():
    assert decode_xid({"xid": None, "pci": None, "msg": "", "pid": None, "pname": None}) is None


# ---------------------------------------------------------------- contract mapping


@pytest.mark.parametrize("code,role,domain,sub_domain", [
    (79, "root", "gpu", "gpu_fell_off_bus"),
    *[(c, "root", "gpu", "gpu_memory_ecc") for c in (48, 94, 95, 64, 140, 171, 172)],
    *[(c, "root", "gpu", "gpu_hardware_fault") for c in (119, 120, 62, 46, 110, 143, 158, 169, 61)],
    (74, "root", "interconnect", "nvlink_error"),
    (136, "root", "interconnect", "nvlink_signal_integrity"),
    (137, "root", "application", "illegal_memory_access"),
    *[(c, "root", "application", "illegal_memory_access") for c in (13, 31, 69)],
    (43, "symptom", None, None),
    (8, "symptom", None, None),         # the RC watchdog: a hang of any origin (NVIDIA: RESTART_APP)
    (109, "symptom", None, None),       # a context switch that timed out: a hang of any origin too
    (32, "root", "host", "pcie_error"),
    (167, "root", "host", "pcie_error"),
    (45, "marker", None, None),
    (154, "marker", None, None),
    *[(c, "noise", None, None) for c in (63, 92, 121, 14, 106, 107, 93)],
    *[(c, "decode", None, None) for c in range(144, 151)],
])
def test_catalog_follows_the_contract_mapping(code, role, domain, sub_domain):
    entry = load_xid_table().entries[code]
    assert entry["role"] == role
    assert entry.get("domain") == domain and entry.get("sub_domain") == sub_domain


def test_137_is_weak():
    assert load_xid_table().entries[137]["strength"] == "weak"


SIGNATURES_SECTION_4 = [
    8, 11, 13, 14, 25, 31, 32, 37, 38, 39, 40, 41, 70, 71, 72, 75, 76, 77, 85, *range(126, 136), 43, 44, 45, 46,
    48, 54, 60, 61, 62, 63, 64, 66, 67, 68, 69, 74, 78, 79, 80, 92, 93, 94, 95, 106, 107, 108, 109, 110, 119, 120,
    121, 136, 137, 140, 141, 143, *range(144, 152), *range(154, 177),
]


def test_every_code_of_the_reference_table_is_catalogued():
    entries = load_xid_table().entries
    missing = [c for c in SIGNATURES_SECTION_4 if c not in entries]
    assert missing == []
    for code, e in entries.items():
        assert e["origin"] in ("hardware", "driver", "firmware", "application", "info", "test"), code
        assert e["role"] in ("root", "symptom", "marker", "noise", "decode"), code
        assert e["meaning"] and e["mnemonic"], code
        if e["role"] == "root":
            assert e["strength"] in ("strong", "weak"), code


# Names in NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h (595.45.04) that
# differ from those in NVIDIA's Xid catalog; the table keeps "nverror.h name / catalog name".
NVERROR_595_NAMES = {
    30: ("ROBUST_CHANNEL_UNUSED_ERROR_30", "ROBUST_CHANNEL_BAD_ADDR_ACCESS"),
    63: ("INFOROM_PAGE_RETIREMENT_EVENT", "INFOROM_DRAM_RETIREMENT_EVENT"),
    64: ("INFOROM_PAGE_RETIREMENT_FAILURE", "INFOROM_DRAM_RETIREMENT_FAILURE"),
    152: ("RESERVED7_ERROR", "ROBUST_CHANNEL_DLA_SMMU_ERROR"),
    153: ("RESERVED8_ERROR", "ROBUST_CHANNEL_DLA_TIMEOUT"),
    162: ("ISINK_REENGAGED", "PSHC_REENGAGED"),
    163: ("ISINK_DISENGAGED", "PSHC_DISENGAGED"),
    164: ("ISINK_LOW_LIFETIME", "PSHC_LOW_LIFETIME"),
    165: ("ISINK_ZERO_LIFETIME", "PSHC_ZERO_LIFETIME"),
    166: ("NVLINK_SECURE_NVLE_ERROR", "NVLINK_SECURE_CRYPTO_ERR"),
    170: ("NVLINK_SECURE_ERROR", "NVLINK_SECURE_OTHER"),
}
NVERROR_595_LAST_ERROR = 176          # ROBUST_CHANNEL_LAST_ERROR


@pytest.mark.parametrize("code", sorted(NVERROR_595_NAMES))
def test_mnemonic_gives_the_nverror_h_name_then_the_catalog_name(code):
    assert load_xid_table().entries[code]["mnemonic"] == " / ".join(NVERROR_595_NAMES[code])


def test_every_code_up_to_the_drivers_last_error_is_catalogued():
    entries = load_xid_table().entries
    assert [c for c in range(1, NVERROR_595_LAST_ERROR + 1) if c not in entries] == []
    for code in (174, 175, 176):                          # nverror.h only: meaning not documented
        assert entries[code]["verified"] is False, code


def test_every_sub_domain_in_xid_yaml_is_in_the_taxonomy():
    taxonomy = yaml.safe_load((ROOT / "data" / "taxonomy.yaml").read_text())["domains"]
    doc = yaml.safe_load((ROOT / "data" / "xid.yaml").read_text())
    roots = [e for e in doc["xids"] if e["role"] == "root"] + [doc["unknown"]]
    assert len(roots) > 100
    for e in roots:
        assert e["domain"] in taxonomy, e
        assert e["sub_domain"] in taxonomy[e["domain"]], e


# ---------------------------------------------------------------- SXid


def test_sxid_20034_fatal_is_an_nvswitch_root(patterns):
    f = sxid_fields(patterns, "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")
    assert (f["severity"], f["link"], f["msg"]) == ("Fatal", 48, "LTSSM Fault Up")
    tag = decode_sxid(f)
    assert (tag.role, tag.domain, tag.sub_domain, tag.strength) == ("root", "interconnect", "nvswitch_fatal", "strong")
    assert tag.fields["sxid_class"] == "fatal" and tag.fields["sxid_unit"] == "DLPL link layer"
    assert "20034" in tag.output and "link 48" in tag.output and "0000:06:00.0" in tag.output


def test_sxid_12028_nonfatal_is_noise(patterns):
    f = sxid_fields(patterns, "[111111111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)")
    tag = decode_sxid(f)
    assert tag.role == "noise" and tag.sub_domain is None
    assert tag.fields["sxid_class"] == "non_fatal"


@pytest.mark.parametrize("line", [
    "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
    "[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
])
def test_sxid_detail_lines_are_context(patterns, line):
    tag = decode_sxid(sxid_fields(patterns, line))
    assert tag.role == "context"
    assert "{0x" not in tag.output          # braces from the line never reach the output template


def test_always_fatal_sxid_class():
    tag = decode_sxid({"sxid": 12020, "severity": "Fatal", "link": 3, "msg": "egress sequence ID error"})
    assert tag.role == "root" and tag.fields["sxid_class"] == "always_fatal"
