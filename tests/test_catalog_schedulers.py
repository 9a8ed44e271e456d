"""Scheduler sites added from Slurm's, Kubernetes', Kueue's and the training-operator's source
(issue 21): real-format lines through the real engine. Patterns: rules/catalog/extract/schedulers.yaml;
roles: rules/catalog/early/schedulers.yaml; the enumeration of sites: rules/emitters/slurm.yaml and
rules/emitters/kubernetes.yaml."""
import pytest

from conftest import diag

TRAIN = "0: [2026-11-02 10:02:00,000] INFO step 1200 loss 2.3411\n"
XID79 = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.\n")
K8S = {"scheduler": "kubernetes", "workload_id": "pytorchjob-bert"}


# ------------------------------------------------------------------ Slurm: memory enforcement

def test_memory_kill_is_not_read_as_a_person_cancelling():
    # coqui-ai/STT#2238: the plain cancel banner is the memory kill's own tear-down.
    d = diag({"logs/app/node-01.log":
              "Epoch 0 |   Training | Elapsed Time: 0:00:15 | Steps: 93 | Loss: 24.580695\n"
              "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), being killed\n"
              "slurmstepd: error: Exceeded job memory limit\n"
              "slurmstepd: error: *** JOB 7518 ON xantipa CANCELLED AT 2022-06-10T17:11:35 ***\n"})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_jobacct_memory_kill_is_a_host_oom():
    d = diag({"logs/app/node-01.log": TRAIN
              + "slurmstepd: error: StepId=100.0 exceeded memory limit (42949672960 > 34359738368), being killed\n"
              + "slurmstepd: error: Exceeded job memory limit\n"
              + "srun: error: node-01: tasks 0-7: Killed\n"
              + "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")
    assert d.recovery.action != "drain_nodes"


def test_failcnt_at_some_point_alone_is_not_a_confident_oom():
    # Older Slurm prints this whenever the cgroup touched its limit (page cache too): a suspect only.
    d = diag({"logs/app/node-01.log": TRAIN
              + "slurmstepd: error: Exceeded step memory limit at some point.\n"
              + "srun: error: node-01: task 0: Exited with exit code 1\n"})
    assert d.status != "attributed"


# ------------------------------------------------------------------ Slurm: slurmctld and job states

def test_slurmctld_time_limit_is_walltime():
    d = diag({"logs/scheduler/slurmctld.log": "[2026-11-02T10:21:10.117] Time limit exhausted for JobId=100\n",
              "logs/app/node-01.log": TRAIN})
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")


def test_gpu_loss_before_the_time_limit_is_the_cause():
    d = diag({"logs/syslog/node-02.log": XID79,
              "logs/scheduler/slurmctld.log": "[2026-11-02T10:21:10.117] Time limit exhausted for JobId=100\n",
              "logs/app/node-01.log": TRAIN}, state="TIMEOUT")
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_slurmctld_preemption_is_preempted_and_retried():
    d = diag({"logs/scheduler/slurmctld.log":
              "[2026-11-02T10:21:10.020] preempted JobId=100 has been requeued to reclaim resources for JobId=4802\n",
              "logs/app/node-01.log": TRAIN})
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "preempted", "retry")


def test_sacct_timeout_row():
    d = diag({"logs/scheduler/sacct.txt":
              "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode\n"
              "------------ ---------- ---------- ---------- ---------- ---------- --------\n"
              "100               train        gpu       proj         64    TIMEOUT      0:0\n"
              "100.batch         batch                  proj         16  CANCELLED     0:15\n"})
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")


def test_sacct_node_fail_never_drains():
    d = diag({"logs/scheduler/sacct.txt": "100               train        gpu       proj         64  NODE_FAIL      0:0\n"})
    assert d.sub_domain == "node_failure"
    assert d.recovery.action != "drain_nodes" and d.responsible_nodes == []


def test_kill_task_failed_alone_names_no_cause_and_drains_nothing():
    d = diag({"logs/scheduler/slurmctld.log":
              "[2026-11-02T10:21:14.880] error: slurmd error running StepId=100.0 on Node(s)=node-02: Kill task failed\n",
              "logs/app/node-01.log": TRAIN})
    assert d.status == "unattributed" and d.responsible_nodes == []


# ------------------------------------------------------------------ Kubernetes, Kueue, Kubeflow

def test_ephemeral_storage_eviction():
    d = diag({"logs/scheduler/describe.txt":
              "Status:           Failed\nReason:           Evicted\n"
              "Message:          Pod ephemeral local storage usage exceeds the total limit of containers 20Gi.\n"}, **K8S)
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "evicted", "retry")


@pytest.mark.parametrize("message", [
    "Preempted in order to admit critical pod",
    "Pod was terminated in response to imminent node shutdown.",
])
def test_kubelet_preemption_and_node_shutdown_are_preemptions(message):
    d = diag({"logs/scheduler/describe.txt": f"Status:           Failed\nMessage:          {message}\n"}, **K8S)
    assert (d.status, d.sub_domain) == ("attributed", "preempted")


def test_kueue_preemption():
    d = diag({"logs/scheduler/events.txt":
              "  Warning  Preempted  2m  kueue-admission  Preempted to accommodate a workload (UID: wl-preemptor, "
              "JobUID: job-preemptor) due to prioritization in the ClusterQueue\n"}, **K8S)
    assert (d.status, d.sub_domain) == ("attributed", "preempted")


@pytest.mark.parametrize("why", ["reclaim", "preempt"])
def test_volcano_preempt_and_reclaim_are_preemptions(why):
    d = diag({"logs/scheduler/events.txt":
              f"    24s       Warning   Evict   pod/a-4-w-0                  Pod is evicted, because of {why}\n"}, **K8S)
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "preempted", "retry")


def test_device_taint_alone_is_only_a_suspect():
    # The DRA device taint manager does not say what was wrong with the GPU: never a drain on its own.
    d = diag({"logs/scheduler/pod.yaml":
              '      message: "Device Taint manager: deleting due to NoExecute taint"\n'}, **K8S)
    assert d.status != "attributed" and d.recovery.action != "drain_nodes"


def test_job_active_deadline_is_walltime_not_a_symptom():
    d = diag({"logs/scheduler/events.txt":
              "2m30s       Warning   DeadlineExceeded            job/bert-train         "
              "Job was active longer than specified deadline\n"}, **K8S)
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")


def test_failed_replicas_and_backoff_name_no_cause():
    # The operator and the kubelet only say the container failed: the application's lines say why.
    d = diag({"logs/scheduler/events.txt":
              "  Normal   PyTorchJobFailed  2m  pytorchjob-controller  PyTorchJob default/bert-ddp is failed because 1 Worker replica(s) failed.\n"
              "      Reason:       Error\n"
              "  Warning  BackOff    33s (x70 over 15m)  kubelet  Back-off restarting failed container\n"}, **K8S)
    assert d.status == "unattributed"


def test_node_status_unknown_is_a_weak_node_failure():
    d = diag({"logs/scheduler/node.txt":
              "  Ready            Unknown   Mon, 02 Nov 2026 10:03:41 +0000   Mon, 02 Nov 2026 10:04:53 +0000   "
              "NodeStatusUnknown   Kubelet stopped posting node status.\n"}, **K8S)
    assert d.sub_domain == "node_failure" and d.recovery.action != "drain_nodes"


# ------------------------------------------------------------------ srun's own tear-down, LSF and PBS

DEIT = ("srun: error: learnfair0824: task 5: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=43575862.0\n"
        "slurmstepd: error: *** STEP 43575862.0 ON learnfair0824 CANCELLED AT 2021-07-14T08:00:36 ***\n"
        "srun: error: learnfair0824: tasks 3,7: Killed\n"
        "srun: Force Terminated StepId=43575862.0\n")


def bare(tmp_path, text):
    """A bare log as users hold it (no scheduler record: the window is the lines' own)."""
    from firstfault.rules.engine import analyze_path
    p = tmp_path / "slurm-43575862.err"
    p.write_text(text)
    return analyze_path(p).diagnosis


def test_a_banner_printed_by_srun_s_own_tear_down_is_not_a_person_cancelling(tmp_path):
    # facebookresearch/deit#102; srun's _step_signal (src/srun/launch.c) after a task's abnormal exit
    d = bare(tmp_path, DEIT)
    assert d.status == "unattributed"
    assert d.recovery.action == "notify_owner"


def test_the_banner_of_a_scancel_is_still_a_person_cancelling(tmp_path):
    # scancel: the banner first, then srun reports the tasks it killed; no task ended on its own
    d = bare(tmp_path, "\n".join(DEIT.splitlines()[2:]) + "\n")
    assert (d.status, d.sub_domain) == ("attributed", "user_cancelled")


@pytest.mark.parametrize("line, sub_domain", [
    ("TERM_OWNER: job killed by owner.", "user_cancelled"),                  # MrCogito/Deep_learning_2023
    ("TERM_ADMIN: job killed by root or LSF administrator.", "user_cancelled"),
    ("TERM_PREEMPT: job killed after preemption.", "preempted"),
    ("TERM_RUNLIMIT: job killed after reaching LSF run time limit.", "walltime_exceeded"),
    ("batch: 19172, current loss: 0.3624596437682209=>> PBS: job killed: walltime 86489 exceeded limit 86400", "walltime_exceeded"),
    ("=>> PBS: job killed: mem 4267188kb exceeded limit 4194304kb", "host_oom"),
])
def test_lsf_and_pbs_say_why_they_ended_the_job(line, sub_domain):
    d = diag({"logs/app/job.out": TRAIN + line + "\n"}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", sub_domain)


def test_a_kueue_preemption_folded_by_kubectl_yaml_is_still_a_preemption():
    # kubernetes-sigs/kueue#7350: the workload's Evicted condition as `kubectl get workload -o yaml` prints it
    text = """  - lastTransitionTime: "2025-10-23T06:33:18Z"
   message: 'Preempted to accommodate a workload (UID: 9f542104-a9e2-4344-ad2e-9c136204da18,
    JobUID: a20d0a6a-64a3-46ce-9b95-8cfb3bf6e675) due to prioritization in the
    ClusterQueue'
   observedGeneration: 1
   reason: Preempted
   status: "True"
   type: Evicted
"""
    d = diag({"logs/app/workload.yaml": text})
    assert (d.status, d.sub_domain) == ("attributed", "preempted")
    assert d.recovery.nodes == []


# MrCogito/Deep_learning_2023 (committed LSF output files): the job report LSF appends to the output
LSF_DONE = """Epoch [650/650], Validation Loss: 0.0017, Validation L1: 0.2673, Smoothed Validation Loss: 0.0017
cuda

------------------------------------------------------------
Sender: LSF System <lsfadmin@hpc.dtu.dk>
Subject: Job 19673445: <WorkingSetup_11> in cluster <dcc> Done

Job <WorkingSetup_11> was submitted from host <gbarlogin2> by user <s230208> in cluster <dcc> at Sat Dec  2 18:17:09 2023
"""


def test_lsf_saying_the_job_is_done_is_the_end_of_the_run():
    d = diag({"logs/app/WorkingSetup_11.log": LSF_DONE}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_lsf_saying_the_job_exited_is_no_end_of_the_run():
    # TheDingodile/ML_health (a committed LSF output file)
    exited = ("------------------------------------------------------------\n"
              "Sender: LSF System <lsfadmin@hpc.dtu.dk>\n"
              "Subject: Job 21070542: <Ensemble0_0> in cluster <dcc> Exited\n")
    d = diag({"logs/app/Ensemble0_0.log": exited}, state="UNKNOWN")
    assert d.status != "no_failure"


def test_an_oom_before_lsfs_done_still_failed_the_run():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 12.73 GiB is free.\n")
    d = diag({"logs/app/WorkingSetup_11.log": oom + LSF_DONE}, state="UNKNOWN")
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_azure_ml_preempting_low_priority_nodes_is_a_preemption():
    # Azure/MachineLearningNotebooks#1242
    line = ("AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if the run has failed or "
            "restarted. Reason: Received pre-emption warning signal\n")
    d = diag({"logs/app/70_driver_log.txt": line})
    assert (d.status, d.sub_domain) == ("attributed", "preempted")
    assert d.recovery.nodes == []


# NVIDIA/deepops#1179: a two-node srun --mpi=pmix whose first fence never completes.
PMIX_TIMEOUT = [
    "slurmstepd: error:  mpi/pmix_v3: pmixp_coll_ring_reset_if_to: adas-ml [0]: pmixp_coll_ring.c:742: 0x14ce0c02cb20: collective timeout seq=0",
    "slurmstepd: error:  mpi/pmix_v3: pmixp_coll_log: adas-ml [0]: pmixp_coll.c:281: Dumping collective state",
    "slurmstepd: error:  mpi/pmix_v3: pmixp_coll_ring_log: adas-ml [0]: pmixp_coll_ring.c:760: 0x14ce0c02cb20: COLL_FENCE_RING state seq=0",
    "slurmstepd: error:  mpi/pmix_v3: pmixp_coll_ring_log: adas-ml [0]: pmixp_coll_ring.c:769: neighbor id: next 1:adas-ml-2, prev 1:adas-ml-2",
]


def test_a_pmix_fence_that_times_out_is_a_group_never_formed_and_no_node_leaves():
    d = diag({"logs/app/job.log": "\n".join(PMIX_TIMEOUT) + "\n"}, nodes=["adas-ml", "adas-ml-2"])
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")
    # The state it dumps alone says nothing of a timeout.
    assert diag({"logs/app/job.log": "\n".join(PMIX_TIMEOUT[1:]) + "\n"}, nodes=["adas-ml", "adas-ml-2"]).status == "unattributed"
