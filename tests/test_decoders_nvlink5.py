"""NVLink5 (Xid 144-150) decoder: real lines from the sources in shared/reference/signatures.md.

Line sources: gpud unit tests and PRs (leptonai/gpud kmsg_extended_test.go, nvlink_logs_test.go,
#1160, #1174), NVIDIA/nccl#2241. Lines marked "constructed" are built from the catalog masks
to exercise a layout no public log shows.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from firstfault.rules.decoders.nvlink5 import Nvlink5Decode, decode_nvlink5, load_table

DATA = Path(__file__).resolve().parent.parent / "rules" / "catalog" / "data"


def _link_down_v1(reason: int) -> str:
    """A V1 NETIR_LINK_EVT line whose intrInfo carries ``reason`` in bits 25:20 (constructed)."""
    return f"NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x{(reason << 20) | 0x1C6:08x} 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"


def _root(d: Nvlink5Decode) -> tuple[str, str | None, str | None]:
    return d.role, d.sub_domain, d.strength if d.role == "root" else None


# ---------------------------------------------------------------- signatures.md section 5.7


def test_worked_example_reason_4_alignment_loss_is_signal_integrity():
    d = decode_nvlink5(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert d is not None
    assert (d.version, d.decided_by, d.unit_code) == ("V1", "bits", 14)
    assert d.unit == "NETIR_LINK_DOWN" and d.token == "NETIR_LINK_EVT"
    assert (d.reason_code, d.reason_name) == (4, "Alignment_loss")
    assert (d.immediate, d.investigatory, d.hw_sw) == ("RESET_GPU", "INVESTIGATE_LINK_SI", "HW")
    assert (d.link, d.severity, d.xc, d.injected) == (8, "Fatal", 0, 0)
    assert _root(d) == ("root", "nvlink_signal_integrity", "strong")
    assert d.domain == "interconnect"


def test_worked_example_reason_38_reset_without_power_cycle_is_noise():
    d = decode_nvlink5(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.reason_code, d.reason_name) == (38, "Reset_no_power_cycle")
    assert (d.immediate, d.investigatory) == ("IGNORE", "INVESTIGATE_SW/USER")
    assert d.role == "noise" and d.sub_domain is None


def test_worked_example_reason_37_peer_reset_is_weak_nvlink_error():
    d = decode_nvlink5(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.reason_code, d.reason_name) == (37, "Peer_side_down_due_to_reset_event")
    assert (d.immediate, d.investigatory) == ("RESET_GPU", "INVESTIGATE_PEER_DEVICE")
    assert d.far_end_is_source is True
    assert _root(d) == ("root", "nvlink_error", "weak")


def test_worked_example_netir_int_link_minus_one_is_sympathetic():
    d = decode_nvlink5(149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert d.link == -1
    assert (d.version, d.unit, d.unit_code) == ("V1", "NETIR_INT", 0)
    assert d.reason_code is None                       # not a link-down unit
    assert (d.immediate, d.investigatory, d.catalog_severity) == ("RESET_GPU", "SYMPATHETIC_REPORT_SOLO", "Link Fatal")
    assert _root(d) == ("root", "nvlink_error", "weak")


def test_worked_example_rlw_rxpipe_status_8_is_noise():
    d = decode_nvlink5(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")
    assert (d.version, d.unit, d.unit_code) == ("V1", "RLW_RXPIPE", 6)
    assert d.error_status == 0x8 and d.debug == (0x1, 0x0, 0x100000, 0x4)
    assert d.action2 is None                           # 0x8 is not a promotable row
    assert (d.immediate, d.investigatory, d.catalog_severity) == ("IGNORE", "CONTACT_SUPPORT", "Non-fatal")
    assert d.role == "noise"


def test_worked_example_saw_mvb_status_8_is_noise_with_xid48_expected():
    d = decode_nvlink5(144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert d.unit == "SAW_MVB"
    assert (d.immediate, d.investigatory) == ("IGNORE", "CONTACT_SUPPORT")
    assert "xid48" in d.local_impact and "poison_or_xid94" in d.remote_impact
    assert d.role == "noise"


# ---------------------------------------------------------------- classification (contract section 2)


@pytest.mark.parametrize("reason", [2, 4, 10, 42, 43])
def test_link_down_reasons_asking_for_signal_integrity_work(reason):
    d = decode_nvlink5(149, _link_down_v1(reason))
    assert d.investigatory.startswith("INVESTIGATE_LINK_SI")
    assert _root(d) == ("root", "nvlink_signal_integrity", "strong")


@pytest.mark.parametrize("reason", [0, 21, 32, 33, 34, 35, 36, 37])
def test_peer_side_and_sympathetic_reasons_are_weak(reason):
    d = decode_nvlink5(149, _link_down_v1(reason))
    assert _root(d) == ("root", "nvlink_error", "weak")


@pytest.mark.parametrize("reason", [1, 15, 16, 17, 18, 22])
def test_local_link_down_reasons_are_strong_nvlink_errors(reason):
    d = decode_nvlink5(149, _link_down_v1(reason))
    assert d.immediate == "RESET_GPU"
    assert _root(d) == ("root", "nvlink_error", "strong")


@pytest.mark.parametrize("reason", [38, 40])
def test_ignore_reasons_are_noise(reason):
    assert decode_nvlink5(149, _link_down_v1(reason)).role == "noise"


def test_reason_without_a_catalog_row_falls_back_on_the_severity_word():
    d = decode_nvlink5(149, _link_down_v1(23))
    assert d.known is False and d.reason_code == 23
    assert d.reason_name == "Cable_was_unplugged"
    assert _root(d) == ("root", "nvlink_error", "strong") and d.rule == "unknown_fatal"


@pytest.mark.parametrize("xid,msg", [
    (144, "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)"),
    (144, "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000010 0x00000000 0x00000000)"),
    (145, "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"),
    (145, "RLW_TAGSTATE Fatal XC0 i0 Link 00 (0x00000008 0x00000002 0x00000000 0x00000000)"),
    (145, "RLW_SRC_TRACK Fatal XC0 i0 Link 00 (0x00000007 0x00000001 0x00000000 0x00000000)"),
    (146, "TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000a 0x00000004 0x00000000 0x00000000)"),
    (146, "TLW_CTRL Fatal XC0 i0 Link 00 (0x00000009 0x00000004 0x00000000 0x00000000)"),
    (149, "NETIR_MFDE_EVENT Fatal XC0 i0 Link 00 (0x00000014 0x00000001 0x00000000 0x00000000)"),
    (150, "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)"),
])
def test_fatal_saw_rlw_tlw_mfde_mse_rows_are_strong_nvlink_errors(xid, msg):
    d = decode_nvlink5(xid, msg)
    assert d.known and d.immediate == "RESET_GPU"
    assert _root(d) == ("root", "nvlink_error", "strong")


def test_saw_mvb_status_2_is_fatal_hw_with_xid48_and_app_crash():
    d = decode_nvlink5(144, "SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)")
    assert (d.version, d.catalog_severity, d.hw_sw) == ("V2", "Fatal", "HW")
    assert d.local_impact == ("xid48", "app_crash_xid45")


@pytest.mark.parametrize("xid,msg", [
    (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)"),
    (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)"),
    (145, "RLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000003 0x80000000 0x00000000 0x00000000)"),
    (149, "NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000003 0x00000000 0x00000000)"),
    (148, "NVLPW_CTRL/NVLPW Nonfatal XC0 i0 Link 00 (0x0000000f 0x80000000 0x00000000 0x00000000)"),
    (144, "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 0x00000000 0x00000000)"),
])
def test_ignore_rows_are_noise(xid, msg):
    d = decode_nvlink5(xid, msg)
    assert d.known and d.immediate == "IGNORE"
    assert d.role == "noise"


def test_ber_event_decodes_v1_unit_17():
    d = decode_nvlink5(149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.version, d.unit, d.unit_code) == ("V1", "NETIR_BER_EVENT", 17)
    assert d.investigatory == "INVESTIGATE_LINK_SI_AND_CABLES"


def test_xid154_eval_rows_are_weak_roots():
    d = decode_nvlink5(145, "RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.version, d.unit, d.xc) == ("V1", "RLW_SRC_TRACK", 1)
    assert d.immediate == "XID_154_EVAL"
    assert _root(d) == ("root", "nvlink_error", "weak")


# ---------------------------------------------------------------- layout versions


def test_v2_layout_netir_link_down_decodes_by_v2_rules():
    # constructed: V2 unit 17 (NETIR_LINK_DOWN) in intrInfo[6:0], reason 4 in [25:20]
    d = decode_nvlink5(149, "NETIR_LINK_DOWN Fatal XC0 i0 Link 05 (0x00400011 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.version, d.decided_by, d.unit_code, d.unit) == ("V2", "bits", 17, "NETIR_LINK_DOWN")
    assert (d.reason_code, d.immediate, d.investigatory) == (4, "RESET_GPU", "INVESTIGATE_LINK_SI")
    assert _root(d) == ("root", "nvlink_signal_integrity", "strong")


def test_v2_layout_with_both_token_names():
    # gpud nvlink_logs_test.go prints both names; the bits say V2, reason 0x25 = 37 (peer reset)
    d = decode_nvlink5(149, "NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x02500011 0x00000000 0x00000000 0x00000000)")
    assert (d.version, d.unit_code, d.reason_code) == ("V2", 17, 37)
    assert _root(d) == ("root", "nvlink_error", "weak")


def test_v2_netir_int_is_unit_24():
    d = decode_nvlink5(149, "NETIR/NETIR_INT Fatal XC0 i0 Link 00 (0x00000018 0x00000000 0x00000000 0x00000000)")
    assert (d.version, d.unit, d.unit_code) == ("V2", "NETIR_INT", 24)
    assert _root(d) == ("root", "nvlink_error", "weak")


def test_v1_unit_code_does_not_match_v2_reading():
    # V1 NETIR_INT has intrInfo[9:0] = 0b0000000110; read as V2 that would be unit 6 (RLW_RXPIPE)
    d = decode_nvlink5(149, "NETIR Fatal XC0 i0 Link -1 (0x00000006 0x00000000)")
    assert (d.version, d.unit) == ("V1", "NETIR_INT")


@pytest.mark.parametrize("version,intr,status,promoted", [
    ("V1", 0x000004C2, 0x1, True),     # bit 10 set
    ("V1", 0x000000C2, 0x1, False),
    ("V1", 0x000004C2, 0x4, True),
    ("V2", 0x00000086, 0x2, True),     # bit 7 set
    ("V2", 0x00000006, 0x2, False),
])
def test_rlw_rxpipe_action2_bit_promotes_to_reset(version, intr, status, promoted):
    # constructed from the catalog's "Decode for action 2" masks
    d = decode_nvlink5(145, f"RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x{intr:08x} 0x{status:08x} 0x00000000 0x00000000)")
    assert d.version == version and d.unit == "RLW_RXPIPE"
    assert d.action2 is promoted
    if promoted:
        assert d.immediate == "RESET_GPU"
        assert _root(d) == ("root", "nvlink_error", "strong")
    else:
        assert d.immediate == "IGNORE" and d.role == "noise"


def test_action2_bit_on_a_row_that_is_not_promotable_changes_nothing():
    d = decode_nvlink5(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 03 (0x000004c2 0x00000008)")
    assert d.action2 is None and d.immediate == "IGNORE" and d.role == "noise"


# ---------------------------------------------------------------- edge cases


def test_several_bitmask_bits_take_the_heaviest_row():
    d = decode_nvlink5(144, "SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000003 0x00000000 0x00000000)")
    assert d.combined_status is True and d.immediate == "RESET_GPU"
    assert _root(d) == ("root", "nvlink_error", "strong")


def test_enum_status_without_row_is_unknown():
    d = decode_nvlink5(149, "NETIR_MFDE_EVENT Nonfatal XC0 i0 Link 00 (0x00000014 0x00000002 0x00000000 0x00000000)")
    assert d.unit == "NETIR_MFDE_EVENT" and d.known is False
    assert d.role == "noise" and d.rule == "unknown_nonfatal"


@pytest.mark.parametrize("severity,expect", [("Fatal", ("root", "nvlink_error", "strong")), ("Nonfatal", ("noise", None, None))])
def test_unknown_sub_component_falls_back_on_severity(severity, expect):
    d = decode_nvlink5(144, f"SAW_EGR {severity} XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)")
    assert d.known is False and d.unit is None
    assert _root(d) == expect


def test_v2_unit_without_catalog_rows_is_named_but_not_known():
    # constructed: V2 unit 18 = NETIR_THERMAL_EVENT (driver enum), which the catalog gives no row
    d = decode_nvlink5(149, "NETIR_THERMAL_EVENT Fatal XC0 i0 Link 02 (0x00000012 0x00000001)")
    assert (d.unit, d.unit_code, d.version, d.known) == ("NETIR_THERMAL_EVENT", 18, "V2", False)
    assert _root(d) == ("root", "nvlink_error", "strong")


def test_pid_and_name_prefix_is_skipped():
    d = decode_nvlink5(145, "pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")
    assert d.token == "RLW_RXPIPE" and d.link == 13 and d.unit == "RLW_RXPIPE"


def test_repeated_spaces_are_tolerated():
    d = decode_nvlink5(149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    assert (d.link, d.reason_code) == (9, 37)


def test_redacted_words_give_an_undecoded_result():
    d = decode_nvlink5(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)")      # NVIDIA/nccl#2241
    assert d is not None and d.intr_info is None and d.known is False
    assert d.role == "noise"


@pytest.mark.parametrize("xid,msg", [
    (137, "RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error"),      # not an NVLink5 Xid
    (145, "RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error"),      # not the structured tail
    (79, "GPU has fallen off the bus."),
    (149, ""),
])
def test_other_messages_are_not_decoded(xid, msg):
    assert decode_nvlink5(xid, msg) is None


def test_fields_are_flat_scalars():
    d = decode_nvlink5(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    f = d.fields()
    assert f["nvlink_reason_code"] == 4 and f["nvlink_intr_info"] == "0x004505c6" and f["nvlink_layout"] == "V1"
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in f.values())


def test_decode_is_deterministic():
    msg = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    assert decode_nvlink5(149, msg) == decode_nvlink5(149, msg)


# ---------------------------------------------------------------- the table itself


def test_table_rows_match_the_catalog_masks():
    """Each unit's V1/V2 codes are the ones the catalog masks give (spot checks)."""
    units = {u.key: u for u in load_table().units}
    assert (units["SAW_MVB"].v1_code, units["SAW_MVB"].v2_code) == (1, 1)
    assert (units["RLW_RXPIPE"].v1_code, units["RLW_RXPIPE"].v2_code) == (6, 6)
    assert (units["TLW_TX_PIPE1"].v1_code, units["TLW_TX_PIPE1"].v2_code) == (11, 13)
    assert (units["TREX"].v1_code, units["TREX"].v2_code) == (12, 14)
    assert (units["NETIR_LINK_DOWN"].v1_code, units["NETIR_LINK_DOWN"].v2_code) == (14, 17)
    assert (units["NETIR_BER_EVENT"].v1_code, units["NETIR_BER_EVENT"].v2_code) == (17, 19)
    assert (units["NETIR_MFDE_EVENT"].v1_code, units["NETIR_MFDE_EVENT"].v2_code) == (18, 20)
    assert (units["NETIR_INT"].v1_code, units["NETIR_INT"].v2_code) == (0, 24)
    assert sum(len(u.rows) for u in units.values()) == 96
    reasons = [r.reason for r in units["NETIR_LINK_DOWN"].rows]
    assert reasons == [0, 1, 2, 4, 10, 15, 16, 17, 18, 21, 22, 32, 33, 34, 35, 36, 37, 38, 40, 42, 43]
    promotable = [(u.key, r.error_status) for u in units.values() for r in u.rows if r.action2]
    assert promotable == [("RLW_RXPIPE", 0x1), ("RLW_RXPIPE", 0x2), ("RLW_RXPIPE", 0x4)]


def test_classification_targets_are_in_the_taxonomy():
    taxonomy = yaml.safe_load((DATA / "taxonomy.yaml").read_text())["domains"]
    doc = yaml.safe_load((DATA / "nvlink5.yaml").read_text())
    tags = [r["tag"] for r in doc["classification"]] + list(doc["unknown"].values())
    roots = [t for t in tags if t["role"] == "root"]
    assert roots
    for t in roots:
        assert t["sub_domain"] in taxonomy[t["domain"]]
