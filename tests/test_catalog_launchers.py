"""Launchers (mpirun/ORTE, ssh as launchers run it, pdsh, horovodrun, DeepSpeed, Ray, torchrun):
real-format lines through the real engine (extract/launchers.yaml, early/launchers.yaml)."""

from conftest import diag

ORTE_DAEMONS = """--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
  one or more nodes. Please check your PATH and LD_LIBRARY_PATH
  settings, or configure OMPI with --enable-orterun-prefix-by-default
"""

PRIMARY_JOB = """-------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
-------------------------------------------------------
"""


def test_ssh_cannot_resolve_a_worker_is_a_launch_failure_not_unattributed():
    # horovod/horovod#951, volcano-sh/volcano#2226: the known miss of the issue.
    d = diag({"logs/app/node-01.log":
              "ssh: Could not resolve hostname node-05.cluster: Name or service not known\n" + ORTE_DAEMONS})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.action == "retry"
    assert "node-05.cluster" in d.recovery.next_step          # the next_step names the host list entry
    assert d.responsible_nodes == [] or d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_orte_daemon_text_alone_names_no_cause():
    # The help text lists five causes: with no ssh line before it, no confident answer.
    d = diag({"logs/app/node-01.log": ORTE_DAEMONS})
    assert d.status != "attributed"


def test_mpirun_rank_killed_by_signal_alone_stays_unattributed():
    # horovod/horovod#469: only mpirun's teardown lines; the signal is the rank's end, not its cause.
    d = diag({"logs/app/node-01.log": PRIMARY_JOB + "\n"
              "--------------------------------------------------------------------------\n"
              "mpirun noticed that process rank 7 with PID 0 on node node-02 exited on signal 9 (Killed).\n"
              "--------------------------------------------------------------------------\n"})
    assert d.status == "unattributed"
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_mpirun_teardown_does_not_hide_the_rank_that_ran_out_of_memory():
    d = diag({"logs/app/node-01.log":
              "[1,3]<stderr>:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.02 GiB is free.\n"
              + PRIMARY_JOB +
              "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
              "the job to be terminated. The first process to do so was:\n\n"
              "  Process name: [[29973,1],3]\n  Exit code:    1\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_lost_remote_daemon_names_its_node_as_a_suspect_not_a_cause():
    # open-mpi/ompi#6618's block, with a node of this workload. Open MPI hedges (the network or the
    # daemon itself): echo evidence, as the blind ho15 round labelled it (early.launch.mpi_daemon_lost_node).
    d = diag({"logs/app/node-01.log":
              "--------------------------------------------------------------------------\n"
              "ORTE has lost communication with a remote daemon.\n\n"
              "  HNP daemon   : [[11377,0],0] on node node-01\n"
              "  Remote daemon: [[11377,0],1] on node node-03\n\n"
              "This is usually due to either a failure of the TCP network\n"
              "connection to the node, or possibly an internal failure of\n"
              "the daemon itself. We cannot recover from this failure, and\n"
              "therefore will terminate the job.\n"})
    assert d.status == "unattributed"
    assert d.suspect_nodes == ["node-03"]                      # mpirun's own node is not suspected
    assert d.recovery.action == "notify_owner"


def test_ssh_refused_and_unreachable_read_differently():
    refused = diag({"logs/app/node-01.log": "ssh: connect to host node-02 port 12345: Connection refused\n"})
    assert (refused.status, refused.sub_domain) == ("attributed", "rendezvous_error")
    unreachable = diag({"logs/app/node-01.log": "ssh: connect to host node-02 port 22: No route to host\n"})
    assert (unreachable.status, unreachable.sub_domain) == ("attributed", "network_error")
    assert unreachable.recovery.action == "retry"


def test_pdsh_permission_denied_is_a_launch_failure():
    # deepspeedai/DeepSpeed#5709
    d = diag({"logs/app/node-01.log":
              "localhost: Permission denied, please try again.\n"
              "localhost: jiaming@localhost: Permission denied (publickey,password).\n"
              "pdsh@jiaming-Precision-7960-Tower: localhost: ssh exited with exit code 255\n"})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert "passwordless ssh" in d.recovery.next_step


def test_a_git_clone_denied_in_a_setup_step_is_not_read_as_the_launch():
    d = diag({"logs/app/node-01.log":
              "git@github.com: Permission denied (publickey).\n"
              "fatal: Could not read from remote repository.\n"})
    assert d.sub_domain != "rendezvous_error"
    assert d.status != "attributed"


def test_deepspeed_ssh_precheck_is_not_a_user_exception():
    # volcano-sh/volcano#2952: before, the RuntimeError read as user_code_exception.
    d = diag({"logs/app/node-01.log":
              "Traceback (most recent call last):\n"
              "  File \"/opt/conda/bin/deepspeed\", line 6, in <module>\n    main()\n"
              "  File \"/opt/conda/lib/python3.10/site-packages/deepspeed/launcher/runner.py\", line 368, in main\n"
              "    raise RuntimeError(\n"
              "RuntimeError: Using hostfile at /etc/hostfile but host=node-02 was not reachable via ssh. "
              "If you are running with a single node please remove /etc/hostfile or setup passwordless ssh.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


def test_horovod_shutdown_echo_and_teardown_do_not_outrank_the_exception():
    d = diag({"logs/app/node-01.log":
              "[1,1]<stderr>:Traceback (most recent call last):\n"
              "[1,1]<stderr>:  File \"train.py\", line 11, in <module>\n"
              "[1,1]<stderr>:KeyError: 'attention_mask'\n"
              "[1,0]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks "
              "or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution. "
              "If the shutdown was caused by an exception, you should see the exception in the log before the first shutdown message.\n"
              "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job "
              "to be terminated. The first process to do so was:\n"
              + PRIMARY_JOB})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


def test_horovod_echoes_alone_are_not_a_cause():
    d = diag({"logs/app/node-01.log":
              "2018-07-30 06:41:52.525932: W tensorflow/core/framework/op_kernel.cc:1318] OP_REQUIRES failed at mpi_ops.cc:422 : "
              "Aborted: Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
              "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown was "
              "caused by an exception, you should see the exception in the log before the first shutdown message.\n"
              "RuntimeError: mpirun failed with exit code 1\n"})
    assert d.status == "unattributed"


def test_ray_dead_actor_is_explained_by_the_memory_monitor():
    d = diag({"logs/app/node-01.log":
              "(raylet) [2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) "
              "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node "
              "(ID: 351e406b196f66bb45eaad02a3b8b4725babfa8cc12949432f7ad7d8, IP: 10.95.143.76) over the last time period.\n"
              "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_ray_dead_actor_alone_is_unattributed():
    d = diag({"logs/app/node-01.log":
              "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
              "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
              "Worker unexpectedly exits with a connection error code 2. End of file.\n"
              "[2023-04-12 11:23:25,823 E 946 946] (raylet) gcs_rpc_client.h:533: Failed to connect to GCS within 60 seconds. "
              "GCS may have been killed.\n"})
    assert d.status == "unattributed"


def test_ray2_node_dead_wording_is_a_weak_node_failure():
    d = diag({"logs/app/node-01.log":
              "2023-03-03 05:15:30,774 WARNING worker.py:1866 -- The node with node id: "
              "9426f44574cce4866be798cfed308f2d3e21ba69487d422872cdd6e3 and address: 10.130.0.113 and node name: "
              "10.130.0.113 has been marked dead because the detector has missed too many heartbeats from it. "
              "This can happen when a       (1) raylet crashes unexpectedly (OOM, preempted node, etc.) \n"},
             start_time="2023-03-03T05:00:00Z", end_time="2023-03-03T05:30:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "node_failure")
    assert d.recovery.action != "drain_nodes"


def test_torchrun_restart_is_context_not_the_cause():
    d = diag({"logs/app/node-01.log":
              "ValueError: expected sequence of length 512 at dim 1 (got 498)\n"
              "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 5534) of binary: /usr/bin/python\n"
              "INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 2/3 attempts left; will restart worker group\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
