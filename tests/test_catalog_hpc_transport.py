"""The HPC transports under training jobs (UCX, MPICH / HPE Cray MPICH, libfabric's cxi provider, the
Slingshot NIC driver, HPE Cray PALS) through the real engine. Patterns: rules/catalog/extract/
hpc_transport.yaml; roles: rules/catalog/early/hpc_transport.yaml; the enumeration of the sites:
rules/emitters/hpc_transport.yaml. Completion errors and timeouts are echoes (weak evidence: never a
drain, the reporting host a suspect); the HCA's port-error event and the Slingshot NIC's
uncorrectable error name a fault of their host; MPI's and PALS's teardown lines are symptoms."""

from conftest import diag

SEVERE = ("drain_nodes", "retry_excluding_nodes")


def around(start: str, end: str, *nodes: str) -> dict:
    """A workload record whose window holds a posted log's own stamps (UCX stamps its lines with the
    epoch: rules/prefixes.py reads them as stated times, and the job's scope bounds them)."""
    return {"start_time": start, "end_time": end, **({"nodes": list(nodes)} if nodes else {})}

# openucx/ucx#5199 (UCX 1.8, Open MPI pml ucx): the fatal form with UCX's own [host:pid:thread:tid] prefix.
RETRY_5199 = ("[master:19546:0:19546] ib_mlx5_log.c:139  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"
              "[master:19546:0:19546] ib_mlx5_log.c:139  DCI QP 0xa9f wqe[0]: SEND s-e [rqpn 0xa66 rlid 703] [inl len 18]\n")
# openucx/ucx#6669: two hosts fail towards the same remote LID.
RETRY_6669 = ("[g07r1n14:27251:0:27251] ib_mlx5_log.c:143  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"
              "[g07r1n14:27251:0:27251] ib_mlx5_log.c:143  DCI QP 0x10f3a wqe[446]: SEND s-e [rqpn 0x32ca rlid 19352] [inl len 20]\n"
              "[i12r2n04:30536:0:30536] ib_mlx5_log.c:143  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"
              "[i12r2n04:30536:0:30536] ib_mlx5_log.c:143  DCI QP 0x17c58 wqe[384]: SEND s-e [rqpn 0x32ca rlid 19352] [inl len 20]\n")
# The ucx#9590 line (UCX 1.15) with the job's host names in the prefix.
RETRY_NODE01 = "[node-01:2330856:0:2330856] ib_mlx5_log.c:177  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)\n"
XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
# No public log shows UCX's port-error event (UCX 1.10+ logs it at DIAG only): built from
# openucx/ucx@v1.8.0:src/uct/ib/base/ib_device.c:261 uct_ib_async_event_handler, "IB Async event on %s: %s"
# with "%s on port %d" and ibv_event_type_str(IBV_EVENT_PORT_ERR) = "port error", in UCX's log prefix.
PORT_ERROR = "[1793613791.120551] [node-02:4711 :1]       ib_device.c:261  UCX  ERROR IB Async event on mlx5_0: port error on port 1\n"

# BLAST-WarpX/warpx#4234 (OLCF Frontier, HPE Cray MPICH over libfabric cxi), verbatim.
CRAY_UNDELIVERABLE = (
    "MPICH ERROR [Rank 8281] [job id 1410467.0] [Wed Aug 23 06:05:55 2023] [frontier01982] - Abort(136982671) (rank 8281 in comm 0): Fatal error in PMPI_Waitall: Other MPI error, error stack:\n"
    "PMPI_Waitall(339)..............: MPI_Waitall(count=26, req_array=0x1006e9b0, status_array=0xfefafb0) failed\n"
    "MPIR_Waitall(167)..............: \n"
    "MPIR_Waitall_impl(51)..........: \n"
    "MPID_Progress_wait(193)........: \n"
    "MPIDI_Progress_test(89)........: \n"
    "MPIDI_OFI_handle_cq_error(1062): OFI poll failed (ofi_events.c:1064:MPIDI_OFI_handle_cq_error:Input/output error - UNDELIVERABLE)\n")
# HPE's Slingshot troubleshooting guide: the cxi provider's warning on the sender and the target NIC's
# uncorrectable error; hosts renamed to the job's.
CXI_UNDELIVERABLE = ("libfabric:23840:1689991048::cxi:ep_data:report_send_completion():3570<warn> node-01: TXC (0x19751:0:0): "
                     "Request dest_addr: 225 caddr.nic: 0X19631 caddr.pid: 0 rxc_id: 0  error: 0x40dc440 (err: 5, UNDELIVERABLE)\n")
CXI_UNCOR = ("Nov  2 10:03:11 node-03 kernel: cxi_core 0000:c3:00.0: cxi3[hsn3]: C_EC_UNCOR_NS: C1_PCT error: tct_cam_ucor (42) "
             "(was first error at 1689213438:290566940)\n"
             "Nov  2 10:03:11 node-03 kernel: cxi_core 0000:c3:00.0: cxi3[hsn3]: C_EC_UNCOR_NS: C_PCT_ERR_INFO_MEM 3f1d900400000000\n")


def test_a_ucx_retry_exceeded_alone_is_weak_evidence_naming_its_host():
    d = diag({"logs/app/train.log": RETRY_5199})
    assert d.status == "unattributed"
    assert "master" in d.suspect_nodes
    assert "early.ucx.ib_completion_error" in {e.rule_id for e in d.evidence}
    assert d.recovery.action not in SEVERE


def test_two_hosts_retrying_towards_one_lid_are_both_suspects_not_culprits():
    d = diag({"logs/app/mpi-job.err": RETRY_6669})
    assert d.status == "unattributed"
    assert {"g07r1n14", "i12r2n04"} <= set(d.suspect_nodes)
    assert d.responsible_nodes == []


def test_the_peer_s_gpu_fault_is_the_cause_and_the_ucx_errors_its_echo():
    d = diag({"logs/app/node-01.log": RETRY_NODE01, "logs/syslog/node-02.log": XID79})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_the_hca_s_own_port_error_event_is_the_cause_and_excludes_not_drains_its_node():
    d = diag({"logs/app/node-02.log": PORT_ERROR, "logs/app/node-01.log": RETRY_NODE01})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "ib_link_error", ["node-02"])
    assert d.recovery.action == "retry_excluding_nodes" and d.recovery.nodes == ["node-02"]


def test_a_gid_table_change_that_the_job_rode_through_is_no_cause():
    # openucx/ucx#7613: printed by an OSU benchmark that ran to completion.
    d = diag({"logs/app/osu.log": "[1635835013.823013] [node181:6471 :async]       ib_device.c:475  UCX  WARN  "
                                  "IB Async event on mlx5_0: GID table change on port 1\n"},
             **around("2021-11-02T06:30:00Z", "2021-11-02T06:40:00Z", "node181"))
    assert d.status == "unattributed" and d.suspect_nodes == []


def test_a_ud_timeout_suspects_its_host_and_the_peer_it_names():
    # openucx/ucx#5543's line (UCT_UD_EP_PEER_NAME_FMT "%s:%d") with the job's host names.
    d = diag({"logs/app/node-01.log": "[node-01:15197:0:15197]       ud_ep.c:255  Fatal: UD endpoint 0x2a01ad0 to node-02:15197: "
                                      "unhandled timeout error\n"})
    assert d.status == "unattributed"
    assert {"node-01", "node-02"} <= set(d.suspect_nodes)
    assert d.recovery.action not in SEVERE


def test_an_endpoint_timeout_is_weak_and_another_endpoint_status_is_only_a_symptom():
    # rapidsai/ucx-py#131 (UCX 1.6 wording); the DIAG line quoted in find_string file 69837648184.
    timeout = diag({"logs/app/worker.log": "[1564069506.097666] [dgx15:34226:0]     ucp_worker.c:505  UCX  ERROR error 'Endpoint timeout' "
                                           "will not be handled for ep 0x7fb7fd48f120 - rc_mlx5/mlx5_3:1\n"},
                   **around("2019-07-25T15:40:00Z", "2019-07-25T15:50:00Z", "dgx15"))
    assert timeout.status == "unattributed" and "dgx15" in timeout.suspect_nodes
    io = diag({"logs/app/worker.log": "[1701292112.836497] [a670n1:162239:0]          ucp_ep.c:1508 UCX  DIAG  ep 0x7f1eac0b5108: "
                                      "error 'Input/output error' on rc_mlx5/mlx5_0:1 will not be handled since no error callback is installed\n"},
              **around("2023-11-29T21:00:00Z", "2023-11-29T21:10:00Z", "a670n1"))
    assert io.status == "unattributed" and io.suspect_nodes == []


def test_a_flushed_work_request_is_the_echo_not_the_evidence():
    # A send flushed after its QP failed (the srd transport, UCX on EFA; a real line, host renamed): no root of its own.
    d = diag({"logs/app/prefill.log": "[1784621081.896649] [node-01:537  :1]       srd_iface.c:221  UCX  ERROR send completion[0] with "
                                      "error on rdmap132s0/0x55cf4425cfb0: Work Request Flushed Error, vendor_err 0x1 wr_id 0x7f8b20022480\n"},
             **around("2026-07-21T08:00:00Z", "2026-07-21T08:10:00Z"))
    assert d.status == "unattributed" and d.suspect_nodes == []


def test_cray_mpich_undeliverable_alone_is_weak_and_never_drains():
    d = diag({"logs/app/out.txt": CRAY_UNDELIVERABLE})
    assert d.status == "unattributed"
    assert d.recovery.action not in SEVERE
    assert {"early.mpich.ofi_poll", "early.mpich.fatal_error"} <= {e.rule_id for e in d.evidence}


def test_the_target_nic_s_uncorrectable_error_explains_the_senders_undeliverable():
    d = diag({"logs/syslog/node-03.log": CXI_UNCOR, "logs/app/node-01.log": CXI_UNDELIVERABLE + CRAY_UNDELIVERABLE})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "network_error", ["node-03"])
    assert d.recovery.action != "drain_nodes"
    assert "cxi_healthcheck" in d.recovery.next_step


def test_a_cxi_send_error_alone_suspects_the_sender():
    d = diag({"logs/app/node-01.log": CXI_UNDELIVERABLE})
    assert d.status == "unattributed" and "node-01" in d.suspect_nodes


def test_uncorrected_codewords_on_a_link_are_not_a_nic_fault():
    # HPE: llr_eopb counts uncorrected codewords of a poor link; cass_errors.c logs it at INFO.
    d = diag({"logs/syslog/node-03.log": "Nov  2 10:03:11 node-03 kernel: cxi_core 0000:41:00.0: cxi0[hsn0]: C_EC_UNCOR_NS: C1_HNI error: "
                                         "llr_eopb (32) (was first error at 1674414354:329651605)\n"})
    assert d.sub_domain != "network_error"


def test_a_truncated_receive_is_not_the_fabric():
    # reger-men/HPL_GPU#20
    d = diag({"logs/app/hpl.log": "MPIDI_OFI_handle_cq_error(1059): OFI poll failed (ofi_events.c:1061:MPIDI_OFI_handle_cq_error:Message too long - OK)\n"})
    assert d.status == "unattributed"
    assert "early.mpich.ofi_poll_truncated" in {e.rule_id for e in d.evidence}


def test_a_user_exception_before_mpi_abort_and_pals_teardown_is_the_cause():
    # MPICH's MPI_Abort line (ALCF's Aurora documentation) and PALS's rank lines (a Polaris run log,
    # pmodels/mpich#7605; hosts renamed to the job's) after the program's own traceback.
    lines = ("Traceback (most recent call last):\n"
             "  File \"train.py\", line 10, in <module>\n"
             "    main()\n"
             "KeyError: 'labels'\n"
             "Abort(15) on node 3 (rank 3 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 15) - process 3\n"
             "node-01: rank 3 exited with code 255\n"
             "node-02: rank 8 died from signal 15\n")
    d = diag({"logs/app/node-01.log": lines})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


def test_pals_rank_teardown_alone_names_no_cause():
    d = diag({"logs/app/job.out": "x4213c4s7b0n0.hsn.cm.aurora.alcf.anl.gov: rank 27421 died from signal 6\n"
                                  "x4417c3s5b0n0.hsn.cm.aurora.alcf.anl.gov: rank 48109 died from signal 15\n"})
    assert d.status == "unattributed" and d.responsible_nodes == []


def test_a_vpn_interface_at_finalize_is_weak_evidence_only():
    # MPICH 4.3+ on a laptop with a VPN up (a project README quotes it, find_string file 5287091191).
    d = diag({"logs/app/run.log": "OFI poll failed (default nic=utun4: Input/output error)\n"})
    assert d.status == "unattributed"
    assert d.recovery.action not in SEVERE


def test_the_cxi_endpoint_close_warning_is_not_read_as_a_fault():
    # VectorInstitute/vector-inference#308: a healthy vLLM server printed it.
    d = diag({"logs/app/vllm_serve.err": "libfabric:132:1787839803::cxi:ep_ctrl:cxip_ep_close():869<warn> gpua001.delta.ncsa.illinois.edu: "
                                         "Unable to free EP object -16 : Device or resource busy\n"})
    assert d.status != "attributed" and d.suspect_nodes == []
