"""NCCL error sites read from NCCL's source (rules/catalog/extract/nccl.yaml, early/nccl.yaml):
real-format lines through the real engine, the diagnosis they must (and must not) give."""
from firstfault.rules.engine import analyze_files

from conftest import BASE_WORKLOAD

WL = {**BASE_WORKLOAD, "nodes": ["node-01", "node-02", "node-03", "node-04"]}

PEER_CLOSED = "node-01:4711:4790 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node-02<41109>\n"
PROXY_FAILED = "node-01:4711:4790 [0] proxy.cc:1519 NCCL WARN [Proxy Service 1] Failed to execute operation Connect from rank 1, retcode 2\n"
WD = ("[rank{r}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600054 milliseconds before timing out.\n")


def diag(files, **wl):
    return analyze_files({**WL, **wl}, files).diagnosis


def rule_ids(d):
    return {s.rule_id for s in d.evidence}


def test_bootstrap_connect_refused_is_a_rendezvous_failure_not_a_node_fault():
    d = diag({"logs/app/node-01.log": (
        "node-01:941227:943077 [0] NCCL INFO Call to connect returned Connection refused, retrying\n"
        "node-01:941227:943077 [0] NCCL INFO Call to connect returned Connection refused, retrying\n"
        "\n"
        "node-01:941227:943077 [0] include/socket.h:390 NCCL WARN Connect to 10.38.10.112<21724> failed : Connection refused\n"
        "node-01:941227:943077 [0] NCCL INFO bootstrap.cc:100 -> 2\n"
        "node-01:941227:943077 [0] NCCL INFO init.cc:695 -> 2\n")})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.action == "retry"


def test_current_wording_connect_timeout_after_retries_is_a_network_fault():
    d = diag({"logs/app/node-03.log": (
        "node-03:4711:4790 [0] os/linux.cc:284 NCCL WARN ncclOsSocketPollConnect: connect to 10.0.0.2<45763> returned "
        "Connection timed out, exceeded error retry count after 35 attempts\n"
        "node-03:4711:4790 [0] NCCL INFO misc/socket.cc:752 -> 6\n")})
    assert (d.status, d.sub_domain) == ("attributed", "network_error")
    assert d.recovery.action == "retry"


def test_qp_setup_failure_names_the_hca_host_but_never_drains_it():
    # nccl-tests#185 shape: the QP on node-02 cannot reach RTR, its peer then sees the socket close.
    d = diag({
        "logs/app/node-02.log": (
            "node-02:225140:225355 [0] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is unreachable\n"
            "node-02:225140:225355 [0] NCCL INFO transport/net_ib.cc:579 -> 2\n"
            "node-02:225140:225355 [0] proxy.cc:1519 NCCL WARN [Proxy Service 1] Failed to execute operation Connect from rank 1, retcode 2\n"),
        "logs/app/node-01.log": PEER_CLOSED})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "ib_link_error", ["node-02"])
    assert d.recovery.action != "drain_nodes"


def test_modify_qp_invalid_argument_points_at_the_gid_index_setting():
    d = diag({"logs/app/node-01.log": (
        "node-01:4711:4790 [0] misc/ibvwrap.cc:376 NCCL WARN Call to ibv_modify_qp failed with 22 Invalid argument, on dev mlx5_0:1, "
        "curr state INIT, next state RTR, local GID index 3, local GID ::ffff:10.0.0.1, remote GID ::ffff:10.0.0.2\n")})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner"


def test_topology_check_in_a_vm_is_configuration():
    d = diag({"logs/app/node-01.log": (
        "node-01:24352:24369 [0] graph/paths.cc:155 NCCL WARN Error : could not find CPU close to GPU 0\n"
        "node-01:24352:24369 [0] NCCL INFO graph/paths.cc:220 -> 3\n"
        "node-01:24352:24369 [0] NCCL INFO init.cc:471 -> 3\n")})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")


def test_a_lost_gpu_outranks_the_nccl_lines_it_causes():
    d = diag({
        "logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
        "logs/app/node-02.log": (
            "[2026-11-02 10:03:12] node-02:4711:4790 [3] misc/nvmlwrap.cc:166 NCCL WARN nvmlDeviceGetHandleByIndex(3) failed: GPU is lost\n"
            "[2026-11-02 10:03:12] node-02:4711:4790 [3] graph/topo.cc:2048 NCCL WARN Could not find any local path from gpu 3 to net.\n")})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_an_oom_on_one_rank_explains_the_refused_connects_of_its_peers():
    d = diag({
        "logs/app/node-03.log": "[2026-11-02 10:02:00] [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.20 GiB is free.\n",
        "logs/app/node-01.log": "[2026-11-02 10:02:40] node-01:4711:4790 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.3<45763> failed : Connection refused\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_misconfiguration_lines_are_firm():
    d = diag({"logs/app/node-01.log": "node-01:4711:4711 [0] init.cc:1043 NCCL WARN Mismatched NCCL version detected : rank 0 version 22703 rank 8 version 21903\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.responsible_nodes == [] or d.recovery.action == "notify_owner"


def test_fallback_warning_and_timeouts_do_not_name_a_cause():
    d = diag({"logs/app/node-01.log": (
        "node-01:21858:22794 [5] graph/search.cc:765 NCCL WARN Could not find a path for pattern 4, falling back to simple order\n"
        + "".join(WD.format(r=r) for r in range(4)))})
    assert d.status != "attributed"
    assert "early.nccl.src.search_fallback" in rule_ids(d) or d.status == "unattributed"


def test_proxy_teardown_and_verbs_echo_alone_stay_unattributed():
    d = diag({"logs/app/node-01.log": (
        "node-01:4711:4799 [0] proxy.cc:1861 NCCL WARN [Service thread] Error encountered progressing operation=Connect, res=3, closing connection\n"
        "node-01:4711:4790 [0] misc/ibvwrap.cc:79 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory errno 12\n"
        + PEER_CLOSED + PROXY_FAILED)})
    assert d.status == "unattributed"
    assert d.responsible_nodes == []
    assert "node-01" in d.suspect_nodes


def test_nvls_bind_failure_names_the_fabric_but_never_drains():
    # pytorch/pytorch#177472's lines: NCCL names a Fabric Manager or NVSwitch problem; weak evidence.
    from firstfault.rules.engine import analyze_files

    text = ("torch.distributed.DistBackendError: NCCL error in: /var/lib/jenkins/workspace/torch/csrc/distributed/c10d/"
            "NCCLUtils.cpp:93, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.3 \n"
            "ncclUnhandledCudaError: Call to CUDA function failed. \nLast error: \n"
            "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the operation cannot be "
            "performed in the present state'. \n"
            "This is usually caused by a system or configuration error in the Fabric Manager or NVSwitches. \n")
    wl = {"workload_id": "w", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z", "nodes": ["node-01", "node-02"]}
    d = analyze_files(wl, {"logs/app/node-01.log": text}).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "nvswitch_fatal")
    assert d.recovery.action != "drain_nodes"


def test_a_gid_table_change_before_the_ib_errors_is_the_cause_on_its_host():
    # The async event's libibverbs name (ibv_event_type_str(IBV_EVENT_GID_CHANGE)), then the completion
    # errors the broken queue pairs give on both sides: weak ib_link_error on the host that changed.
    from firstfault.rules.engine import analyze_files

    text = ("[2026-11-02 10:02:55,118] INFO step 1200 loss 2.3411\n"
            "node-03:184785:184901 [3] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : GID table change\n"
            "node-03:184785:184901 [3] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer "
            "10.0.0.2<49189> with error 12, opcode 0, len 0, vendor err 129 (Recv)\n"
            "node-01:208241:208300 [0] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer "
            "10.0.0.3<49190> with error 12, opcode 0, len 0, vendor err 129 (Recv)\n")
    wl = {"workload_id": "w", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z",
          "nodes": ["node-01", "node-02", "node-03"]}
    d = analyze_files(wl, {"logs/app/train.log": text}).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "ib_link_error", ["node-03"])
    assert d.recovery.action == "retry_excluding_nodes"


def test_ib_size_check_is_a_collective_mismatch_on_the_host_nccl_names():
    # NVIDIA/nccl#969: pdsh puts the address first, NCCL's prefix names the host; NCCL returns ncclInvalidUsage.
    d = diag({"logs/app/train.log": (
        "10.10.23.10: so-ucloud-10-10-23-10:1307367:1307586 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 "
        "peer 10.10.23.6<58683> collective mismatch error, local size 496640 remote size 65536\n"
        "10.10.23.10: so-ucloud-10-10-23-10:1307367:1307586 [0] NCCL INFO include/net.h:32 -> 5\n"
        "10.10.23.10: so-ucloud-10-10-23-10:1307367:1307586 [0] NCCL INFO proxy.cc:684 -> 5 [Proxy Thread]\n")},
        nodes=["so-ucloud-10-10-23-10", "so-ucloud-10-10-23-6"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "collective_mismatch", ["so-ucloud-10-10-23-10"])
    assert d.recovery.action == "notify_owner"


def test_socket_truncation_hedges_on_the_network_and_is_not_a_mismatch():
    d = diag({"logs/app/node-01.log": (
        "node-01:4711:4790 [0] transport/net_socket.cc:636 NCCL WARN NET/Socket : peer 10.0.0.2<40531> message truncated : "
        "receiving 1048576 bytes instead of 65536. If you believe your socket network is in a healthy state, there may be a "
        "mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks\n")})
    assert d.sub_domain != "collective_mismatch"


# ncclNetInit (src/net.cc, NCCL 2.18-2.23): NCCL_NET names a network no loaded plugin provides.
GIB_POD = "rickruguichen-serving-deepseek-r1-model-serving-5d74c6754cq79gp"


def test_a_network_nccl_net_names_that_is_not_there_is_the_jobs_configuration():
    # GoogleCloudPlatform/container-engine-accelerators#414: the gIB plugin failed to load (GLIBC_2.32 not found)
    text = (f"{GIB_POD}:556:556 [1] NCCL INFO NET/Plugin: Plugin load returned 2 : /lib/x86_64-linux-gnu/libc.so.6: "
            "version `GLIBC_2.32' not found (required by /usr/local/nvidia/lib64/libnccl-net.so) : when loading libnccl-net.so\n"
            f"{GIB_POD}:556:556 [1] NCCL INFO NET/Plugin: Using internal network plugin.\n"
            f"{GIB_POD}:560:560 [4] net.cc:579 NCCL WARN Error: network gIB not found.\n"
            f"{GIB_POD}:560:560 [4] NCCL INFO init.cc:321 -> 5\n")
    d = diag({"logs/app/pod.log": text}, nodes=[GIB_POD])
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


def test_falling_back_to_the_internal_plugin_alone_is_no_failure_cause():
    text = f"{GIB_POD}:556:556 [1] NCCL INFO NET/Plugin: Using internal network plugin.\n"
    d = diag({"logs/app/pod.log": text}, nodes=[GIB_POD])
    assert d.status != "attributed"


def test_a_connect_to_a_link_local_address_is_the_interface_nccl_picked():
    # verl-project/verl#726: the peer NCCL was given is 169.254.0.1, which no other host can reach.
    link_local = "socketStartConnect: Connect to 169.254.0.1<40815> failed : Software caused connection abort"
    d = diag({"logs/app/node-01.log": link_local + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner" and "NCCL_SOCKET_IFNAME" in d.root_cause.message
    # pytorch/pytorch#131781: the same error to a routable peer stays a (weak) network fault.
    routable = "[rank9]: socketStartConnect: Connect to 10.15.13.105<42639> failed : Software caused connection abort"
    assert diag({"logs/app/node-01.log": routable + "\n"}).sub_domain == "network_error"
