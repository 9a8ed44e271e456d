"""Prefix stripping and time stamps, on lines as the real software writes them."""
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from firstfault.rules.prefixes import StampContext, read_head, plain
from firstfault.rules.stamps import iso_z

CTX = StampContext(zone=timezone.utc, anchor=datetime(2026, 11, 2, 10, tzinfo=timezone.utc))


@pytest.mark.parametrize("line, message, stamp, rank, host", [
    # RFC 3164 with a dmesg uptime inside (NVIDIA/gpu-operator#1146 shape): year from the workload,
    # the header's host recorded (a bare syslog file names its host only there)
    ("Nov  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>'",
     "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>'", "2026-11-02T11:38:47.000000Z", None, "worker4"),
    # RFC 3164 without a host (NVIDIA developer forum post, Xid 62 on an RTX PRO 6000): "kernel:" is the program
    ("Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c",
     "NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c",
     "2027-03-27T17:40:36.000000Z", None, None),   # the year nearest the workload start
    # markdown bold around a pasted line (Kent0n-Li/ChatDoctor#49); a single backtick stays content
    ("**RuntimeError: DDP expects same model across all ranks, but Rank 3 has 128 params, while rank 0 has inconsistent 0 params.**",
     "RuntimeError: DDP expects same model across all ranks, but Rank 3 has 128 params, while rank 0 has inconsistent 0 params.**",
     None, None, None),
    ("`Trainer.fit` stopped: `max_steps=400000` reached.", "`Trainer.fit` stopped: `max_steps=400000` reached.", None, None, None),
    # NCCL's device field holding the int cudaGetDevice left when CUDA could not start (NVIDIA/cuml#5961): the
    # prefix and its host are still NCCL's
    ("VM-192-150-centos:2871:2871 [32523] misc/cudawrap.cc:182 NCCL WARN Cuda failure 'CUDA driver version is insufficient for CUDA runtime version'",
     "misc/cudawrap.cc:182 NCCL WARN Cuda failure 'CUDA driver version is insufficient for CUDA runtime version'",
     None, None, "VM-192-150-centos"),
    # grep -H output a user pasted (llm-d/llm-d#191): the file name goes, the stamp and NCCL's host stay;
    # a "file.log:" later in a message is content
    ("ms-pd-llm-d-modelservice-prefill-2.log:[2025-09-17 15:16:23] ms-pd-llm-d-modelservice-prefill-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event: port error",
     "transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event: port error",
     "2025-09-17T15:16:23.000000Z", None, "ms-pd-llm-d-modelservice-prefill-2"),
    ("RuntimeError: see train.log: for details", "RuntimeError: see train.log: for details", None, None, None),
    # docker compose service prefix (saturncloud/dask-pytorch-ddp#17)
    ("daskcluster-worker-1     | Exception: 'AssertionError()'", "Exception: 'AssertionError()'", None, None, "daskcluster-worker-1"),
    # Talos kmsg forwarding (vllm-project/vllm#40652)
    ("192.168.11.119: kern:     err: [2026-04-22T21:25:20.466440686Z]: nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Severity 1 Engine instance 12 Sub-engine instance 00",
     "nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Severity 1 Engine instance 12 Sub-engine instance 00",
     "2026-04-22T21:25:20.466440Z", None, "192.168.11.119"),
    # vLLM worker tag and logger (snowflakedb/ArcticInference#175)
    ("(VllmWorker rank=0 pid=104) ERROR 09-09 02:24:28 [multiproc_executor.py:522] ValueError: output tensor size must be equal to world_size times input tensor size",
     "ValueError: output tensor size must be equal to world_size times input tensor size", "2026-09-09T02:24:28.000000Z", 0, None),
    # Python logging's "%(asctime)s %(levelname)s %(name)s: " (ai-dynamo/dynamo#1229): a level, not a host
    ("2025-05-28T03:35:37.857Z ERROR engine.run_mp_engine: CUDA error: peer access is not supported between these two devices",
     "ERROR engine.run_mp_engine: CUDA error: peer access is not supported between these two devices",
     "2025-05-28T03:35:37.857000Z", None, None),
    # dmesg -T (leptonai/gpud testdata)
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi",
     "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi", "2025-02-23T16:24:18.000000Z", None, None),
    # dmesg --time-format iso (equinor/ert#7797)
    ("2024-04-29T14:55:41,679700+02:00 Out of memory: Killed process 1440763 (perl)",
     "Out of memory: Killed process 1440763 (perl)", "2024-04-29T12:55:41.679700Z", None, None),
    # torchrun tee + PyTorch rank tag + glog with nanoseconds and an unpadded month (pytorch/pytorch#113128)
    ("[default0]:[rank12]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 12] Process group watchdog",
     "[PG 0 (default_pg) Rank 12] Process group watchdog", "2026-08-17T17:40:34.227531Z", 12, None),
    # srun --label + PyTorch
    ("3: [rank3]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught",
     "[Rank 3] Watchdog caught", "2026-11-02T10:13:12.044871Z", 3, None),
    # old glog without a stamp (modelscope/FunASR#2006)
    ("[rank10]:[E ProcessGroupNCCL.cpp:1537] [PG 1 Rank 10] Timeout at NCCL work: 15734",
     "[PG 1 Rank 10] Timeout at NCCL work: 15734", None, 10, None),
    # Python glog (huggingface/accelerate#2960)
    ("W0726 10:59:50.786825 140538811684672 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 147865 closing signal SIGTERM",
     "Sending process 147865 closing signal SIGTERM", "2026-07-26T10:59:50.786825Z", None, None),
    # NCCL prefix (NVIDIA/nccl-tests#166)
    ("gpu004:2200689:2200706 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer",
     "misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer", None, None, "gpu004"),
    # Fabric Manager (leptonai/gpud log_matcher.go)
    ("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0",
     "detected NVSwitch fatal error 20034 on fid 0", "2024-07-23T07:53:55.000000Z", None, None),
    # slurmctld
    ("[2026-11-02T10:21:14.123] error: Nodes node-03 not responding, setting DOWN",
     "error: Nodes node-03 not responding, setting DOWN", "2026-11-02T10:21:14.123000Z", None, None),
])
def test_read_head(line, message, stamp, rank, host):
    head = read_head(line, CTX)
    assert head.message == message
    assert iso_z(head.stamp) == stamp
    assert head.rank == rank
    assert head.host == host


def test_year_chosen_nearest_the_workload_start():
    # A job started on Dec 31st: a "Jan  1" line belongs to the next year.
    ctx = StampContext(zone=timezone.utc, anchor=datetime(2026, 12, 31, 23, tzinfo=timezone.utc))
    assert iso_z(read_head("Jan  1 00:10:00 n1 kernel: x", ctx).stamp) == "2027-01-01T00:10:00.000000Z"


def test_local_zone_applies_to_zoneless_stamps():
    ctx = StampContext(zone=ZoneInfo("Europe/Berlin"), anchor=datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
    assert iso_z(read_head("Nov  2 11:03:11 n1 kernel: x", ctx).stamp) == "2026-11-02T10:03:11.000000Z"


def test_dmesg_uptime_is_anchored_on_boot_time_or_order_only():
    boot = datetime(2026, 11, 1, 0, 0, tzinfo=timezone.utc)
    anchored = read_head("[ 3600.500000] NVRM: Xid", StampContext(timezone.utc, boot, boot=boot))
    assert iso_z(anchored.stamp) == "2026-11-01T01:00:00.500000Z" and anchored.quality == "uptime"
    unanchored = read_head("[ 3600.500000] NVRM: Xid", CTX)
    assert unanchored.stamp is None and unanchored.quality == "order_only" and unanchored.uptime == 3600.5


def test_a_bracketed_epoch_is_a_stamp_not_an_uptime():
    # UCX's gettimeofday() stamp "[%lu.%06lu]" (openucx/ucx src/ucs/debug/log.c), as posted in a real log:
    # 31 years is no host's uptime
    line = ("[1594407135.546337] [k69a05298:117  :0]          ib_md.c:1933 UCX  ERROR ibv_open_device(mlx5_9) "
            "failed: No such file or directory")
    head = read_head(line, CTX)
    assert iso_z(head.stamp) == "2020-07-10T18:52:15.546337Z" and head.quality == "exact"
    assert head.uptime is None
    assert head.message.startswith("[k69a05298:117  :0]")
    # a long-running host's dmesg stays an uptime (ten years of seconds)
    long_up = read_head("[315360000.000001] NVRM: Xid", CTX)
    assert long_up.uptime == 315360000.000001 and long_up.stamp is None


@pytest.mark.parametrize("line, message, rank, host, stamp", [
    # Horovod's gloo runner (horovod#1797's posted log), with and without its ctime
    ("[0]<stderr>:RuntimeError: boom", "RuntimeError: boom", 0, None, None),
    ("Tue Apr 21 18:22:53 2020[2]<stderr>:/home/node/DataShare/pytorch_mnist.py:88: UserWarning: x",
     "/home/node/DataShare/pytorch_mnist.py:88: UserWarning: x", 2, None, "2020-04-21T18:22:53.000000Z"),
    # mpirun --timestamp-output, and SageMaker's mpirun tag with the host
    ("Thu Jun 18 14:28:35 2020[1,2]<stderr>:W tensorflow/x", "W tensorflow/x", 2, None, "2020-06-18T14:28:35.000000Z"),
    ("[1,mpirank:3,algo-1]<stderr>:INFO:root:Reducer buckets", "INFO:root:Reducer buckets", 3, "algo-1", None),
])
def test_launcher_output_tags(line, message, rank, host, stamp):
    head = read_head(line, CTX)
    assert (head.message, head.rank, head.host, iso_z(head.stamp)) == (message, rank, host, stamp)


@pytest.mark.parametrize("line, message, host", [
    # pdsh's "%s: %s" (DeepSpeed's multi-node runner; salesforce/CodeGen2#3, a ROCm OOM)
    ("c05r2n11: RuntimeErrorRuntimeError: : HIP out of memory. Tried to allocate 576.00 MiB (GPU 3; 15.98 GiB total capacity)",
     "RuntimeErrorRuntimeError: : HIP out of memory. Tried to allocate 576.00 MiB (GPU 3; 15.98 GiB total capacity)", "c05r2n11"),
    # nccl-tests run under mpirun with the host first (corpus ho3-ncclcfg-invalid-device-ordinal-2host-nccltests-263)
    ("g0010: Test CUDA failure common.cu:941 'invalid device ordinal'", "Test CUDA failure common.cu:941 'invalid device ordinal'", "g0010"),
    # a host prefix, then NCCL's own "host:pid:tid [dev]" (corpus ho3-unattr-cuda-init-error-worker1-k8s-nccl-1029)
    ("rdma-test-gpu-worker-1: rdma-test-gpu-worker-1:2918:4483 [4] init.cc:263 NCCL WARN Cuda failure 'initialization error'",
     "init.cc:263 NCCL WARN Cuda failure 'initialization error'", "rdma-test-gpu-worker-1"),
    # slurmstepd names its node after a dash
    ("slurmstepd-falkor7: error: Detected 1 oom_kill event in StepId=4.0.", "error: Detected 1 oom_kill event in StepId=4.0.", "falkor7"),
    ("localhost: jiaming@localhost: Permission denied (publickey,password).",
     "jiaming@localhost: Permission denied (publickey,password).", "localhost"),
    # a host given to pdsh by its address, then NCCL's prefix, which names the host itself (NVIDIA/nccl#969)
    ("10.10.23.10: so-ucloud-10-10-23-10:1307367:1307586 [0] NCCL INFO include/net.h:32 -> 5",
     "NCCL INFO include/net.h:32 -> 5", "so-ucloud-10-10-23-10"),
    ("10.10.23.10: Traceback (most recent call last):", "Traceback (most recent call last):", "10.10.23.10"),
    # not a host: an exception name, a rank or a step, a word without a digit, a later "name: " in the message
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB", None),
    ("rank3: CUDA error: an illegal memory access was encountered", "rank3: CUDA error: an illegal memory access was encountered", None),
    ("step10: loss 2.1", "step10: loss 2.1", None),
    ("worker: lost connection", "worker: lost connection", None),
    ("[rank0]: node12: foo", "node12: foo", None),
    # a number is not an address, nor a version or a time
    ("10: RuntimeError: boom", "RuntimeError: boom", None),
    ("2.1.0: release notes", "2.1.0: release notes", None),
])
def test_a_host_put_first_by_pdsh_or_a_launcher(line, message, host):
    head = read_head(line, CTX)
    assert (head.message, head.host) == (message, host)


def _reads_digits_alike(tree) -> bool:
    """No item of a parsed regex tells one ASCII digit from another (sets hold all ten or none)."""
    from re import _constants as C, _parser

    digits = [ord(d) for d in "0123456789"]

    def in_set(items, c: int) -> bool:
        hit = False
        for op, av in items:
            if op is C.NEGATE:
                continue
            if op is C.LITERAL:
                hit |= av == c
            elif op is C.RANGE:
                hit |= av[0] <= c <= av[1]
            elif op is C.CATEGORY:
                hit |= av in (C.CATEGORY_DIGIT, C.CATEGORY_WORD, C.CATEGORY_NOT_SPACE, C.CATEGORY_NOT_LINEBREAK)
            else:
                raise AssertionError(f"unexpected set item {op}")
        return hit

    for op, av in tree:
        if op in (C.LITERAL, C.NOT_LITERAL) and av in digits:
            return False
        if op is C.IN and len({in_set(av, c) for c in digits}) > 1:
            return False
        if op in (C.GROUPREF, C.GROUPREF_EXISTS):
            return False                       # a back-reference compares the digits themselves
        subs = []
        if op is C.SUBPATTERN:
            subs = [av[-1]]
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            subs = [av[2]]
        elif op is C.BRANCH:
            subs = list(av[1])
        elif op in (C.ASSERT, C.ASSERT_NOT):
            subs = [av[1]]
        elif op is C.ATOMIC_GROUP:
            subs = [av]
        if not all(_reads_digits_alike(s) for s in subs):
            return False
    return True


def test_every_prefix_shape_reads_the_ten_digits_alike():
    # read_head replays the chain of shapes that peeled a line on every line that differs from it
    # only in its ASCII digits; that is sound only while no shape tells one digit from another.
    from re import _parser

    from firstfault.rules.prefixes import _REGEX

    for name, rx in _REGEX.items():
        assert _reads_digits_alike(_parser.parse(rx.pattern, rx.flags)), name


@pytest.mark.parametrize("first, second", [
    # the second line replays the first's chain of shapes; a shape that declines there reads it in full
    ("3: [rank3]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught",
     "7: [rank7]:[E1102 10:19:52.944871 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog caught"),
    ("Nov 31 10:03:11 n1 kernel: 4: y", "Nov 30 10:03:11 n1 kernel: 4: y"),     # srun declines after a stamp
    ("Nov 30 10:03:11 n1 kernel: 4: y", "Nov 31 10:03:11 n1 kernel: 4: y"),
    ("[E1331 10:13:12.1 a.cc:1] 5: z", "[E1130 10:13:12.1 a.cc:1] 5: z"),
])
def test_lines_alike_but_for_digits_read_as_if_alone(first, second):
    _reads_as_if_alone(first, second)


@pytest.mark.parametrize("first, second", [
    # NCCL proxy.cc: WARN("Socket recv failed while polling for opId=%p", opId); a pointer in the prefix's place too
    ("2219: gpu-278:236252:236563 [3] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7f018ec0a720",
     "2219: gpu-278:236252:236563 [3] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7fceb9c55ae0"),
    ("0x7f01ab: 3: y", "0x7f0123: 3: y"),
    ("[0x1f]<stdout>: z", "[0x10]<stdout>: z"),
    ("(pid=0x1f) w", "(pid=0x10) w"),
])
def test_lines_alike_but_for_a_pointer_read_as_if_alone(first, second):
    _reads_as_if_alone(first, second)


def test_a_pointer_does_not_make_a_new_chain():
    from firstfault.rules import prefixes

    line = "2219: gpu-278:236252:236563 [3] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x{}"
    prefixes._CHAINS.clear()
    read_head(line.format("7f018ec0a720"), CTX)
    read_head(line.format("7fceb9c55ae0"), CTX)
    assert len(prefixes._CHAINS) == 1


def test_pointer_blind_keys():
    from firstfault.rules.prefixes import _pointer_blind

    assert _pointer_blind(b"opId=0x7f00ec0a000 x") == b"opId=0x00000000000 x"
    assert _pointer_blind(b"a0x7f 0x7fz _0x7f") == b"a0x7f 0x7fz _0x7f"        # not whole words
    assert _pointer_blind(b"0x1f%|#| 0/0") == b"0x1f%|#| 0/0"                # a progress bar: kept
    assert _pointer_blind(b"0xABC") == b"0xABC"                              # %p prints lower case


def test_the_compiled_line_keys_are_the_python_ones():
    """rules/_linekey.c stands in for translate + _pointer_blind: the same two keys, byte for byte."""
    import random

    from firstfault.rules import prefixes

    if prefixes._line_keys_c is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")
    crafted = [b"", b"0x", b"0x1", b"opId=0x7f00ec0a720 x", b"a0x7f 0x7fz _0x7f", b"0x1f%|#| 0/0", b"0xABC",
               b"5x7f 15x7f", b"0x0x7f", b"(0xdeadbeef)", b"0xfg", b"\xff0x7f", "\u00e90x7f".encode()]
    rng = random.Random(7)
    alphabet = b"0123456789abcdefxgAZ_ %|.:-\xff"
    made = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(20_000)]
    for data in crafted + made:
        assert prefixes._line_keys_c(data) == prefixes._line_keys(data), data


def test_the_compiled_memo_keeps_every_reference_it_hands_out():
    """head_hit returns None and shared objects in its tuples: a reference it does not own, given
    away, frees None under the interpreter a few thousand lines later (a crash, not a wrong answer)."""
    import gc
    import sys

    from firstfault.rules import prefixes
    from firstfault.rules.prefixes import Head

    if prefixes._head_hit is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")
    nccl = "2488: gpu-312:122947:123263 [0] proxy.cc:1143 NCCL WARN Socket recv failed"
    read_head(nccl, CTX)
    read_head(nccl, CTX)                    # its chain and its head remembered
    chains = dict(prefixes._CHAINS)
    lines = [nccl,                                             # a remembered head
             "2488: gpu-999:122947:123263 [0] proxy.cc:1143 NCCL WARN Socket recv failed",   # its chain, a new prefix
             "a line no chain was learnt for 0x7f00ec0a720",   # no chain (and a pointer in its key)
             "caf\u00e9 is not ASCII", "\x1b[31mcoloured\x1b[0m"]  # left to the Python path
    for line in lines:
        prefixes._head_hit(line, CTX, chains, Head, 1024)
    gc.collect()
    before = sys.getrefcount(None)
    for _ in range(5_000):
        for line in lines:
            prefixes._head_hit(line, CTX, chains, Head, 1024)
    gc.collect()
    # 25,000 calls: a reference lost or kept per call moves the count by thousands, the frame by one
    assert abs(sys.getrefcount(None) - before) <= 2


@pytest.mark.parametrize("sample", ["gpu-fell-off-bus-32node", "worked-example", "ambiguous-two-faults", "hang-until-timeout"])
def test_analyze_reads_alike_with_and_without_the_compiled_keys(sample, monkeypatch):
    """The same diagnosis, byte for byte, from the C keys and memo and from the Python ones."""
    from pathlib import Path

    from firstfault.rules import engine, prefixes

    path = Path(__file__).resolve().parents[1] / "samples" / sample
    with_c = engine.analyze_path(path).diagnosis.model_dump_json()
    monkeypatch.setattr(prefixes, "_head_hit", None)
    monkeypatch.setattr(prefixes, "line_keys", prefixes._line_keys)
    prefixes._CHAINS.clear()
    assert engine.analyze_path(path).diagnosis.model_dump_json() == with_c


def test_a_repeated_prefix_is_read_again_under_another_context():
    """The heads a chain remembers are its context's: another zone reads the same prefix anew."""
    line = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus."
    other = StampContext(zone=ZoneInfo("America/New_York"), anchor=CTX.anchor)
    assert iso_z(read_head(line, CTX).stamp) == "2026-11-02T10:03:11.000000Z"
    assert iso_z(read_head(line, other).stamp) == "2026-11-02T15:03:11.000000Z"
    assert iso_z(read_head(line, CTX).stamp) == "2026-11-02T10:03:11.000000Z"


def _reads_as_if_alone(first: str, second: str) -> None:
    from firstfault.rules import prefixes

    def fields(head):
        return (head.message, head.stamp, head.quality, head.host, head.rank, head.local_rank, head.pid, head.dev)

    prefixes._CHAINS.clear()
    alone = fields(read_head(second, CTX))
    prefixes._CHAINS.clear()
    read_head(first, CTX)
    assert fields(read_head(second, CTX)) == alone


@pytest.mark.parametrize("line, want", [
    # Ray relays a worker's lines with its tag in colour; pasted, the ESC is lost or becomes U+FFFD
    ("\x1b[36m(RayWorkerWrapper pid=4183, ip=10.3.32.122)\x1b[0m ERROR 06-03 23:13:39 worker_base.py:148] boom",
     "(RayWorkerWrapper pid=4183, ip=10.3.32.122) ERROR 06-03 23:13:39 worker_base.py:148] boom"),
    ("[36m(RayWorkerWrapper pid=4183, ip=10.3.32.122)[0m ERROR 06-03 23:13:39 worker_base.py:148] boom",
     "(RayWorkerWrapper pid=4183, ip=10.3.32.122) ERROR 06-03 23:13:39 worker_base.py:148] boom"),
    ("\ufffd[36m(RayWorkerWrapper pid=4183)\ufffd[0m ERROR", "(RayWorkerWrapper pid=4183) ERROR"),
    # a cleared screen before the first line (corpus ho-walltime-megatron-ds-zero-perf-n16-jeanzay-bigscience-1999616)
    ("\x1b[H\x1b[2J\x1b[3J+ srun --jobid 1999616 bash", "+ srun --jobid 1999616 bash"),
    ("\ufeffNov  2 10:03:11 node-02 kernel: x", "Nov  2 10:03:11 node-02 kernel: x"),        # UTF-8 byte-order mark
    # content that only looks like a colour code keeps its brackets
    ("timeout [30m] reached", "timeout [30m] reached"),
    ("[rank0]: step [12m/30m]", "[rank0]: step [12m/30m]"),
    ("[36m(VllmWorker rank=0 pid=104) ERROR 09-09 02:24:28 [multiproc_executor.py:522] ValueError: boom[0m",
     "(VllmWorker rank=0 pid=104) ERROR 09-09 02:24:28 [multiproc_executor.py:522] ValueError: boom"),
])
def test_colours_and_a_byte_order_mark_are_not_the_line(line, want):
    assert plain(line) == want


def test_a_coloured_prefix_is_read_as_the_plain_one():
    head = read_head("\x1b[32mNov  2 10:03:11 node-02 kernel:\x1b[0m NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", CTX)
    assert (head.host, head.message) == ("node-02", "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.")


def test_kubectl_s_pod_prefix_names_the_pod_and_the_prefixes_after_it_are_read():
    # kubectl logs --prefix (kubernetes/kubectl pkg/cmd/logs/logs.go addPrefixIfNeeded: "[pod/%s/%s] "), with --timestamps
    head = read_head("[pod/train-worker-1/pytorch] 2026-11-02T10:03:11.123456789Z [rank9]:[E1102 10:13:12.044871 "
                     "ProcessGroupNCCL.cpp:632] boom", CTX)
    assert (head.host, head.rank, head.message, iso_z(head.stamp)) == ("train-worker-1", 9, "boom", "2026-11-02T10:03:11.123456Z")
    assert read_head("[pod] x", CTX).host is None


@pytest.mark.parametrize("wrapper", ["[pod/trainer-worker-0/pytorch] ", "trainer-1  | ", "> "])
def test_a_collector_s_wrapper_keeps_the_line_s_first_prefixes_first(wrapper):
    # pdsh's host (DeepSpeed's multi-node runner, bigscience-workshop/Megatron-DeepSpeed#356) and TorchX's
    # role/replica (NeMo-Run, NVIDIA/NeMo#14348) are read only as a line's first prefix: kubectl --prefix,
    # docker compose and a quote are added around the line afterwards, so they do not count.
    pdsh = read_head(wrapper + "c000001: FileNotFoundError: [Errno 2] No such file or directory: '/x_doc_idx.npy'", CTX)
    assert (pdsh.host, pdsh.message) == ("c000001", "FileNotFoundError: [Errno 2] No such file or directory: '/x_doc_idx.npy'")
    torchx = read_head(wrapper + "i.pretrain/0 [default2]:[rank2]: RuntimeError: Rank 2, node dcfai-xe9680-01", CTX)
    assert (torchx.rank, torchx.message) == (2, "RuntimeError: Rank 2, node dcfai-xe9680-01")


def test_a_pod_named_by_kubectl_is_placed_on_its_node():
    from firstfault.rules.engine import analyze_files
    from conftest import BASE_WORKLOAD
    wl = {**BASE_WORKLOAD, "scheduler": "kubernetes", "pods": {"train-worker-1": "node-02", "train-worker-0": "node-01"}}
    d = analyze_files(wl, {"logs/app/workers.log": (
        "[pod/train-worker-1/pytorch] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 1 has a total capacity of 79.10 GiB of which 1.06 GiB is free.\n")}).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "cuda_oom", ["node-02"])


def test_python_loggings_name_and_level_are_not_a_syslog_host_and_program():
    # Brummi/BehindTheScenes#34: ignite's "%(asctime)s %(name)s %(levelname)s: %(message)s"
    ctx = StampContext(zone=None, anchor=None, boot=None)
    head = read_head("2025-01-06 20:58:03,681 ignite.distributed.launcher.Parallel INFO: End of run", ctx)
    assert head.host is None and head.stamp is not None
    assert head.message == "ignite.distributed.launcher.Parallel INFO: End of run"
    # rsyslog's ISO form still names its host and program
    head = read_head("2024-02-01T10:00:00.123+00:00 gpu-01 kernel: NVRM: Xid 79", ctx)
    assert (head.host, head.message) == ("gpu-01", "NVRM: Xid 79")
