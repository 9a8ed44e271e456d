"""NVSHMEM's error lines and DeepEP's host assertions (extract/nvshmem.yaml, early/nvshmem.yaml) through
the real engine: the symmetric heap out of GPU memory is the job's memory; a full heap, a team count
and a bootstrap plugin that will not load are its NVSHMEM settings; IB completion and connection
set-up errors are echoes (never a drain); a failed bootstrap says the group did not form but not why;
the rest of NVSHMEM's error path, and DeepEP's checks of its own set-up, are symptoms."""

from conftest import diag

SEVERE = ("drain_nodes", "retry_excluding_nodes")
XID79 = "Nov  2 10:03:11 node-03 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"

# deepseek-ai/DeepEP#157: cuMemCreate out of memory, then NVSHMEM's null heap makes an illegal access.
HEAP_OOM = ("/nvshmem/src/host/mem/mem_heap.cpp:1509: non-zero status: 2 cuMemCreate failed \n\n"
            "/nvshmem/src/host/mem/mem_heap.cpp:1590: non-zero status: 7 allocate_physical_memory_to_heap failed\n\n"
            "[/nvshmem/src/host/coll/barrier/barrier.cpp:21] cuda failed with an illegal memory access was encountered \n"
            "/nvshmem/src/modules/bootstrap/uid/ncclSocket/ncclsocket_socket.cpp:socketProgress:59: socketProgress: "
            "Connection closed by remote peer\n")
# mlc-ai/mlc-llm#3254: the UID bootstrap's connects ran out of retries, then the bootstrap chain.
UID_CONNECT = ("/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/main_nvshmem/src/modules/bootstrap/uid/ncclSocket/ncclsocket_socket.cpp"
               ":socketStartConnect:479: socketStartConnect: exceeded retries (20000)\n")
BOOTSTRAP_CHAIN = ("/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/main_nvshmem/src/host/bootstrap/bootstrap.cpp:240: non-zero status: 7 "
                   "bootstrap_loader_init returned error for mode UID\n\n"
                   "/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/main_nvshmem/src/host/init/init.cu:327: non-zero status: 7 bootstrap_init failed \n\n"
                   "/dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/main_nvshmem/src/host/init/init.cu:1149: non-zero status: 7 nvshmem_bootstrap failed \n")
# NVSHMEM's FAQ (docs.nvidia.com/nvshmem/api/faq.html), verbatim.
PLUGIN_MISSING = ("src/bootstrap/bootstrap_loader.cpp:46: NULL value Bootstrap unable to load 'nvshmem_bootstrap_mpi.so'\n"
                  "    nvshmem_bootstrap_mpi.so: cannot open shared object file: No such file or directory\n"
                  "src/bootstrap/bootstrap.cpp:26: non-zero status: -1 bootstrap_loader_init returned error\n"
                  "src/init/init.cpp:101: non-zero status: 7 bootstrap_init failed\n"
                  "src/init/init.cpp:767: non-zero status: 7 nvshmem_bootstrap failed\n"
                  "src/init/init.cpp:792: non-zero status: 7: Success, exiting... aborting due to error in nvshmemi_init_thread\n")
IBRC_COMPLETION = ("src/comm/transports/ibrc/ibrc.cpp:962: non-zero status: 10 ibv_poll_cq failed, status: 10\n"
                   "src/comm/transports/ibrc/ibrc.cpp:1021: non-zero status: 7 progress_send failed, outstanding_count: 0\n"
                   "src/comm/transports/ibrc/ibrc.cpp:1294: non-zero status: 7 check_poll failed\n")
# deepseek-ai/DeepEP#307 (L20 nodes, IBGDA)
IBGDA_SETUP = ("/sgl-workspace/nvshmem/src/modules/transport/ibgda/ibgda.cpp:1348: NULL value \n"
               "Unable to create ah.\n\n"
               "/sgl-workspace/nvshmem/src/modules/transport/ibgda/ibgda.cpp:3025: non-zero status: 7 \n"
               "ibgda_rc_init2rtr failed on RC #216.\n")
# NVIDIA/nvshmem#40: a multicast mapping that failed because the node's NVLink fabric state was out of sync.
NVLS_MAPPING = ("/home/szegel/Nvshmem/src/host/team/team_internal_nvls.cpp:254: non-zero status: 401 cuMemMap failed to map "
                "274877906944 bytes handle at address: 0x1320000000 offset 0 on device 7\n"
                "/home/szegel/Nvshmem/src/host/mem/mem_heap.cpp:1573: non-zero status: 7 Mapping mem size 274877906944 to MC "
                "group 101602722380032 failed \n")
# deepseek-ai/DeepEP#125
DEEPEP_ASSERT = "RuntimeError: Failed: Assertion error /***/csrc/deep_ep.cpp:629 'num_tokens_per_rdma_rank.has_value()'\n"
# NVIDIA/nvshmem#100
TEAMS = ("/dvs/p4/build/sw/rel/gpgpu/toolkit/r13.2/main_nvshmem/src/host/team/team_internal.cpp:1821: error status: 2 "
         "(NVSHMEMX_ERROR_OUT_OF_MEMORY) No more teams available (max = 7), try setting NVSHMEM_MAX_TEAMS environment variable\n")


def rule_ids(d):
    return {e.rule_id for e in d.evidence}


def test_the_heap_out_of_gpu_memory_is_the_job_s_memory_and_its_illegal_access_an_echo():
    d = diag({"logs/app/node-01.log": HEAP_OOM})
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "cuda_oom", "notify_owner")
    assert "NVSHMEM's symmetric heap" in d.recovery.next_step


def test_a_full_heap_names_the_setting():
    line = ("/sgl-workspace/nvshmem/src/host/mem/mem_heap.cpp:allocate_symmetric_memory:2266: nvshmem malloc failed (hint: "
            "check if total allocation has exceeded NVSHMEM symmetric size = 1073741824, NVSHMEM symmetric size can be "
            "increased using NVSHMEM_SYMMETRIC_SIZE environment variable) \n")
    d = diag({"logs/app/node-01.log": line})
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "nccl_config_error", "notify_owner")
    assert "NVSHMEM_SYMMETRIC_SIZE" in d.recovery.next_step


def test_too_many_teams_names_nvshmem_max_teams():
    d = diag({"logs/app/node-01.log": TEAMS})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert "NVSHMEM_MAX_TEAMS (it was 7)" in d.recovery.next_step


def test_an_ib_completion_error_alone_is_echo_evidence_and_drains_nothing():
    d = diag({"logs/app/node-01.log": IBRC_COMPLETION})
    assert d.status == "unattributed"
    assert "early.nvshmem.ib_completion_error" in rule_ids(d)
    assert d.recovery.action not in SEVERE


def test_the_peer_s_gpu_loss_is_the_cause_and_the_ib_completion_error_its_echo():
    line = "/sgl-workspace/nvshmem/src/modules/transport/ibrc/ibrc.cpp:1093: non-zero status: 12 ibv_poll_cq failed, status: 12\n"
    d = diag({"logs/app/node-01.log": line, "logs/syslog/node-03.log": XID79})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-03"])


def test_a_queue_pair_that_would_not_come_up_names_no_cause_and_drains_nothing():
    d = diag({"logs/app/node-01.log": IBGDA_SETUP})
    assert d.status == "unattributed"
    assert "early.nvshmem.qp_setup" in rule_ids(d)
    assert d.recovery.action not in SEVERE


def test_the_bootstrap_chain_alone_says_the_group_did_not_form_but_names_no_cause():
    d = diag({"logs/app/node-01.log": BOOTSTRAP_CHAIN})
    assert d.status == "unattributed"
    assert "early.nvshmem.bootstrap_failed" in rule_ids(d)


def test_the_uid_bootstrap_s_failed_connects_are_the_rendezvous_error():
    d = diag({"logs/app/node-01.log": UID_CONNECT + BOOTSTRAP_CHAIN})
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "rendezvous_error", "retry")


def test_a_bootstrap_plugin_that_will_not_load_is_the_job_s_set_up_not_a_rendezvous():
    d = diag({"logs/app/node-01.log": PLUGIN_MISSING})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert "bootstrap plugin" in d.recovery.next_step


def test_nvshmem_s_error_path_after_a_fabric_fault_names_no_cause():
    d = diag({"logs/app/node-01.log": NVLS_MAPPING})
    assert d.status == "unattributed"
    assert d.recovery.action not in SEVERE


def test_a_deepep_host_assertion_is_the_program_s():
    d = diag({"logs/app/node-01.log": DEEPEP_ASSERT})
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "user_code_exception", "notify_owner")
    assert "early.deepep.host_assert" in rule_ids(d)


def test_deepep_s_check_of_its_nvshmem_set_up_is_the_echo_of_the_heap_failure():
    assertion = ("RuntimeError: Failed: Assertion error /sgl-workspace/DeepEP/csrc/deep_ep.cpp:364 'nvshmem_rank == "
                 "internode::init(root_unique_id, nvshmem_rank, num_nvshmem_ranks, low_latency_mode)'\n")
    d = diag({"logs/app/node-01.log": "/nvshmem/src/host/mem/mem_heap.cpp:1509: non-zero status: 2 cuMemCreate failed \n" + assertion})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
