"""What the ho16 round changed, through the real engine: Moab's reason in a TORQUE/PBS job's mail
("MOAB_INFO:  job exceeded wallclock limit"), PyTorch's store client timing out with its timeout in
milliseconds, and CUDA's "all CUDA-capable devices are busy or unavailable" read as echo evidence.
Patterns: rules/catalog/extract/runtime.yaml (pbs.moab_wallclock), extract/app.yaml
(torch.store_connect_failed); EARLY: early/app.yaml (early.cuda.device_unavailable)."""

from conftest import diag


# CoBrALab/MAGeTbrain#20: the job's mail
MOAB = """PBS Job Id: 26066307.gpc-sched-ib0
Job Name:   mb_voting_2014-11-27T12-13-48_353
job deleted
Job deleted at request of root@gpc-sched-ib0
MOAB_INFO:  job exceeded wallclock limit
"""


def test_moab_s_wallclock_reason_is_the_walltime():
    d = diag({"logs/app/pbs_mail.txt": MOAB})
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")
    assert "?" not in d.root_cause.message


def test_a_deletion_by_root_alone_names_no_walltime():
    d = diag({"logs/app/pbs_mail.txt": "".join(MOAB.splitlines(keepends=True)[:4])})
    assert d.sub_domain != "walltime_exceeded"


# vllm-project/vllm#19670: the store's host never answered; newer PyTorch states the timeout in ms
STORE = ("[E616 02:08:15.931416442 socket.cpp:1023] [c10d] The client socket has timed out after 600000ms while trying "
         "to connect to (172.17.0.9, 50437).\n")


def test_a_store_connect_timeout_in_milliseconds_is_a_rendezvous_failure():
    d = diag({"logs/app/vllm.log": STORE})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


# jade-hpc-gpu/jade-hpc-gpu.github.io#40 (a DGX-1): PyTorch's legacy check, error 46
BUSY = ("THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1518244421288/work/torch/lib/THC/THCStream.cpp line=40 "
        "error=46 : all CUDA-capable devices are busy or unavailable\n")
XID79 = "Nov  2 10:03:11 node-01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def test_devices_busy_alone_attributes_nothing():
    # cudaErrorDevicesUnavailable: the CUDA runtime's documentation names compute modes and a full GPU first
    d = diag({"logs/app/train.log": BUSY}, nodes=["node-01"])
    assert d.status == "unattributed"
    assert d.recovery.action == "notify_owner"


def test_devices_busy_beside_a_lost_gpu_is_that_gpu_s_echo():
    d = diag({"logs/app/train.log": BUSY, "logs/syslog/node-01.log": XID79}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")
