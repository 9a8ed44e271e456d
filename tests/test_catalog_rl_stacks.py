"""RL post-training stacks (Ray actors beside vLLM rollout engines), held-out round ho35: vLLM's
sleep-mode allocator running out of GPU memory (runtime.yaml vllm.cumem_oom) and Ray destroying an
actor because its owner's node died (runtime.yaml ray.owner_node_crashed). Real lines from the cited
threads, through the real engine."""
from conftest import diag

# OpenRLHF/OpenRLHF#1050
CUMEM = ("(LLMRayActor pid=226426) ERROR 06-10 10:55:03 [core.py:459] RuntimeError: CUDA Error: out of memory at "
         "/workspace/csrc/cumem_allocator.cpp:62 [repeated 3x across cluster]\n"
         "(LLMRayActor pid=226426) CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62 [repeated 3x across cluster]\n")

# hiyouga/EasyR1#324
OWNER = ("The actor is dead because its owner has died. Owner Id: 01000000ffffffffffffffffffffffffffffffffffffffffffffffff "
         "Owner Ip address: 172.21.160.9 Owner worker exit type: SYSTEM_ERROR Worker exit detail: Owner's node has crashed.\n")


def test_vllm_waking_up_without_gpu_memory_is_a_cuda_oom_never_drained():
    d = diag({"logs/app/train_ppo_ray.log": CUMEM}, start_time="2026-06-10T10:00:00Z", end_time="2026-06-10T11:00:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.nodes == []


def test_another_driver_error_from_the_allocator_is_not_read_as_an_oom():
    line = "CUDA Error: invalid argument at /workspace/csrc/cumem_allocator.cpp:62\n"     # format string, origin: source
    d = diag({"logs/app/train_ppo_ray.log": line})
    assert d.sub_domain != "cuda_oom"


def test_an_actor_lost_with_its_owners_node_names_that_node_weakly():
    d = diag({"logs/app/train.log": OWNER}, nodes=["172.21.160.9", "172.21.160.10"])
    assert (d.status, d.sub_domain) == ("attributed", "node_failure")
    assert d.recovery.action != "drain_nodes"


def test_an_actor_lost_with_its_owners_node_beside_the_hosts_oom_kill_is_the_oom():
    # the host's kernel OOM-killed a process (the ho7 corpus case's dmesg line): Ray then calls the node crashed
    oom = ("[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, anon-rss:12918388kB, "
           "file-rss:68668kB, shmem-rss:53352kB, UID:1000 pgtables:49772kB oom_score_adj:0\n")
    d = diag({"logs/app/train.log": OWNER, "logs/syslog/172.21.160.9.log": oom}, nodes=["172.21.160.9", "172.21.160.10"])
    assert d.sub_domain == "host_oom"
