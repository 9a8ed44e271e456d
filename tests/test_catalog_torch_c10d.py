"""PyTorch c10d sites added from PyTorch's source (issue 21): real-format lines through the real
engine. Patterns: rules/catalog/extract/torch_c10d.yaml; roles: rules/catalog/early/torch_c10d.yaml;
the enumeration of sites: rules/emitters/torch_c10d.yaml."""


from conftest import diag

WD = ("{rank}: [rank{rank}]:[E1102 {t} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.")

UNIQUEID = ("{rank}: [rank{rank}]: torch.distributed.DistBackendError: [{rank}] is setting up NCCL communicator and retrieving "
            "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
            "wait timeout after 600000ms, keys: /default_pg/0//cuda//0")

STORE_LOST = ("{rank}: [rank{rank}]:[W1102 10:13:1{rank}.898456436 TCPStore.cpp:125] [c10d] recvValue failed on "
              "SocketImpl(fd=73, addr=[node-02]:46764, remote=[node-01]:29500): Failed to recv, got 0 bytes. "
              "Connection was likely closed. Did the remote server shutdown or crash?")

GLOO_IFACE = ("0: [rank0]: RuntimeError: [enforce fail at /root/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:83] "
              "ifa != nullptr. Unable to find address for: bond1")


def wd_file(ranks, t="10:13:12.044871", ran=600054):
    return "\n".join(WD.format(rank=r, t=t, ran=ran) for r in ranks) + "\n"


def lines(template, ranks):
    return "\n".join(template.format(rank=r) for r in ranks) + "\n"


def test_gloo_interface_without_address_is_a_config_error_never_drained():
    d = diag({"logs/app/node-01.log": GLOO_IFACE + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner"          # an application fault: nothing is drained
    assert "GLOO_SOCKET_IFNAME" in d.recovery.next_step


def test_gloo_interface_line_outranks_the_generic_gloo_symptom():
    # The same line carries "gloo/transport/" (torch.gloo_error, a symptom): the config pattern wins.
    d = diag({"logs/app/node-01.log": "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:127] "
                                      "rp != nullptr. Unable to find address for: dgx-1.ai\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")


def test_uniqueid_wait_alone_is_no_confident_answer():
    # Ranks 1-7 waited for rank 0's unique id; nothing shows what happened to rank 0.
    d = diag({"logs/app/node-01.log": lines(UNIQUEID, range(1, 8))})
    assert d.status == "unattributed"
    assert d.responsible_nodes == []


def test_uniqueid_wait_beside_rank0_oom_is_the_oom():
    rank0 = ("0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of "
             "79.15 GiB of which 12.73 GiB is free.\n")
    d = diag({"logs/app/node-01.log": rank0 + lines(UNIQUEID, range(1, 8))})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_store_wait_timeout_is_a_weak_rendezvous_error_never_drained():
    line = ("[W1102 10:13:12.741177013 socket.cpp:487] [c10d] waitForInput: socket SocketImpl(fd=11, addr=[node-02]:38674, "
            "remote=[::ffff:10.0.0.1]:29500) timed out after 900000ms\n")
    d = diag({"logs/app/node-02.log": line})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.action == "retry"


def test_store_connection_lost_alone_is_only_a_symptom():
    d = diag({"logs/app/node-02.log": lines(STORE_LOST, range(8, 12))})
    assert d.status != "attributed"


def test_store_connection_lost_after_a_gpu_loss_keeps_the_gpu_loss():
    xid = "Nov  2 10:03:11 node-01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    d = diag({"logs/syslog/node-01.log": xid,
              "logs/app/node-02.log": lines(STORE_LOST, range(8, 12)) + wd_file(range(8, 16))})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-01"])


def test_monitored_barrier_report_alone_is_no_confident_answer():
    d = diag({"logs/app/node-01.log": "0: [rank0]: RuntimeError: [Rank 0]: Ranks 9, 12 failed to pass monitoredBarrier in 120000 ms\n"})
    assert d.status != "attributed"


def test_gloo_group_that_cannot_connect_is_a_rendezvous_error_to_retry():
    d = diag({"logs/app/node-02.log": "RuntimeError: [/opt/conda/conda-bld/pytorch_1682343967769/work/third_party/gloo/gloo/transport/tcp/"
                                      "pair.cc:799] connect [172.31.71.170]:13195: Connection refused\n"})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.action == "retry"


def test_gloo_mesh_failure_beside_the_peers_oom_is_the_oom():
    # The peer died of an OOM while the group was being built: the OOM is the cause, the mesh failure its echo.
    d = diag({"logs/app/node-01.log": "0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                      "GPU 0 has a total capacity of 79.15 GiB of which 1.73 GiB is free.\n",
              "logs/app/node-02.log": "9: [rank9]:[E1102 10:13:12.164295950 ProcessGroupGloo.cpp:145] Gloo connectFullMesh failed with "
                                      "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_gloo_size_mismatch_is_a_collective_mismatch():
    d = diag({"logs/app/node-01.log": "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                                      "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
                                      "op.preamble.length <= op.nbytes. 6232 vs 4\n"})
    assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch")


def test_env_rendezvous_variable_unset_is_a_rendezvous_error():
    d = diag({"logs/app/node-01.log": "ValueError: Error initializing torch.distributed using env:// rendezvous: "
                                      "environment variable MASTER_ADDR expected, but not set\n"})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


def test_pytorch_without_nccl_is_a_config_error():
    d = diag({"logs/app/node-01.log": "RuntimeError: Distributed package doesn't have NCCL built in\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner"


def test_no_gpus_beside_a_gpu_loss_on_that_host_is_never_a_confident_config_error():
    xid = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    d = diag({"logs/syslog/node-02.log": xid,
              "logs/app/node-02.log": "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n"})
    assert not (d.status == "attributed" and d.sub_domain == "nccl_config_error")


# reducer.cpp verify_params_across_processes: DDP's constructor all-gathers the ranks' parameter counts.
DDP_ZERO = ("[rank2]: RuntimeError: DDP expects same model across all ranks, but Rank 2 has 51 params, "
            "while rank 0 has inconsistent 0 params.")                 # hpc-community.unige.ch/t/4301
DDP_COUNT = ("RuntimeError: DDP expects same model across all ranks, but Rank 6 has 59 params, "
             "while rank 0 has inconsistent 48 params.")               # pomonam/kronfluence#41
ALLGATHER_WD = ("[rank{rank}]:[E606 09:09:08.164985364 ProcessGroupNCCL.cpp:757] [Rank {rank}] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) "
                "ran for 600004 milliseconds before timing out.")     # the same thread


def test_a_peer_count_of_0_is_the_allgather_that_did_not_deliver_not_a_model_mismatch():
    alone = diag({"logs/app/node-01.log": DDP_ZERO + "\n"})
    after_timeouts = diag({"logs/app/node-01.log": lines(ALLGATHER_WD, range(4)) + DDP_ZERO + "\n"})
    for d in (alone, after_timeouts):
        assert (d.status, d.sub_domain) == ("unattributed", "unattributed")
        assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_a_peer_count_other_than_0_is_the_ranks_models_differing():
    d = diag({"logs/app/node-01.log": DDP_COUNT + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
