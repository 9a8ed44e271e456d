"""AWS's NCCL network plugin (extract/aws_ofi_nccl.yaml, early/aws_ofi_nccl.yaml) through the real
engine: an EFA completion error is an echo, as an InfiniBand completion error is; the plugin's
start-up failures, after which NCCL falls back to another transport, are not a cause."""

from conftest import diag

# NVIDIA/nccl#1928 (the Last error: echo of a v1.16-v1.18 line); gnosia93/training-on-eks (v1.16+ with
# libfabric's peer text); aws/aws-ofi-nccl#156 (v1.3-v1.9 wording).
COMPLETION = ("[2026-11-02 10:05:02] node-02:194:710 [0] int cm_req_handle_error_entry(nccl_net_ofi_context_t*, fid_cq*, "
              "fi_cq_err_entry*, uint16_t):46 NCCL WARN NET/OFI Request 0x7f456c222f60 completed with error. RC: 103. "
              "Error: 4126 (Unresponsive receiver (reachable by EFA device but handshake failed) My EFA addr: "
              "fi_addr_efa://[fe80::c55:2eff:fe44:db5]:0:142160333 My host id: i-07792e0f955a9673b Peer EFA addr: "
              "fi_addr_efa://[fe80::454:14ff:fedd:d5b3]:0:825957744 Peer host id: N/A). Completed length: 0\n")
XID79 = "Nov  2 10:03:11 node-03 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def test_an_efa_completion_error_alone_is_weak_evidence():
    d = diag({"logs/app/rank-8.log": COMPLETION})
    assert d.status == "unattributed"
    assert "early.ofi.completion_error" in {e.rule_id for e in d.evidence}
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_the_peer_s_gpu_fault_is_the_cause_and_the_efa_errors_its_echo():
    d = diag({"logs/app/rank-8.log": COMPLETION, "logs/syslog/node-03.log": XID79})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-03"])


def test_the_plugin_failing_to_start_is_not_a_cause():
    # awslabs/awsome-distributed-ai#386: NCCL then uses another transport
    line = ("(RayTrainWorker pid=954, ip=10.67.132.202) ini-worker-ray-worker-p5:954:3133 [6] nccl_net_ofi_create_plugin:1067 "
            "NCCL WARN NET/OFI aws-ofi-nccl initialization failed [repeated 15x across cluster]\n")
    d = diag({"logs/app/train.log": line})
    assert d.status == "unattributed" and d.sub_domain in (None, "unattributed")
