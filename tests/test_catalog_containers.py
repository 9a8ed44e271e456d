"""The GPU container stack read from its source: nvidia-container-cli's failures (whichever wrapper
carries them: docker, a kubelet event, enroot's hook under pyxis, Apptainer --nvccli), enroot's
registry answers and the image unpack under pyxis. Real-format lines through the real engine.
Patterns: rules/catalog/extract/containers.yaml; roles: rules/catalog/early/containers.yaml; the
enumeration of sites: rules/emitters/containers.yaml.

Each message is as posted in the public report named beside it; an "N: " srun label or a node's
file name only places a line on a host. The question each test asks is whose fault: the node's
driver stack (the hook runs on the host), the job's image or request (never drained), or nobody's
the taxonomy names (unattributed)."""

from conftest import diag

DOCKER = ("docker: Error response from daemon: failed to create shim: OCI runtime create failed: container_linux.go:380: "
          "starting container process caused: process_linux.go:545: container init caused: Running hook #0:: error running "
          "hook: exit status 1, stdout: , stderr: ")
# NVIDIA/nvidia-docker#1629
DRIVER_NOT_LOADED = DOCKER + "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown."
# NVIDIA/libnvidia-container#231
NO_LIBNVIDIA_ML = ("nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot open shared "
                   "object file: no such file or directory")
# NVIDIA/nvidia-docker#1442
CUDA_REQUIREMENT = ("docker: Error response from daemon: OCI runtime create failed: container_linux.go:370: starting container "
                    "process caused: process_linux.go:459: container init caused: Running hook #0:: error running hook: exit "
                    "status 1, stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied condition: cuda>=11.0, "
                    "please update your driver to a newer version, or use an earlier cuda container: unknown.")
# BIOP/BIOP-desktop#2
IMAGE_HAS_DRIVER = ("nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/36b6fcd35cb3d156b325203e"
                    "5766197a4c32259e1efd25567305af74aa3f5e80/merged/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: file exists: "
                    "unknown.")
# NVIDIA/nvidia-container-toolkit#173 (the kubelet's event)
RPC_FAILED = ("Warning  Failed     5s (x3 over 19s)  kubelet            Error: failed to create containerd task: failed to "
              "create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during "
              "container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: "
              "nvidia-container-cli.real: initialization error: driver error: failed to process request: unknown")


def _no_drain(d):
    assert d.recovery.action not in ("drain_nodes",), d.recovery


# ------------------------------------------------------------------ the host's driver stack

def test_driver_not_loaded_on_the_host_is_the_nodes_driver_kept_out_not_drained():
    d = diag({"logs/app/node-02.log": DRIVER_NOT_LOADED + "\n"})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "driver_library_mismatch", ["node-02"])
    assert (d.recovery.action, d.recovery.nodes) == ("retry_excluding_nodes", ["node-02"])
    assert "driver on node-02" in d.recovery.next_step and "nvidia-smi" in d.recovery.next_step


def test_missing_libnvidia_ml_on_the_host_is_the_nodes_driver_install():
    d = diag({"logs/app/node-03.log": NO_LIBNVIDIA_ML + "\n"})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "driver_library_mismatch", ["node-03"])
    _no_drain(d)


def test_version_mismatch_in_a_kubelet_event_is_the_driver_library_mismatch():
    # NVIDIA/k8s-device-plugin#1431 (containerd's event as the kubelet shows it); cuda.nvml_driver_mismatch
    # reads the same line in application logs, this file's pattern where that one does not apply.
    line = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: "
            "unable to start container process: error during container init: error running prestart hook #0: exit status 1, "
            "stdout: , stderr: Auto-detected mode as 'legacy'\n"
            "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown\n")
    for path in ("logs/scheduler/events.log", "logs/app/node-01.log"):
        d = diag({path: line})
        assert (d.status, d.sub_domain) == ("attributed", "driver_library_mismatch"), path


def test_a_pyxis_step_whose_node_has_no_driver_names_that_node_and_explains_the_exit():
    # enroot's 98-nvidia.sh runs nvidia-container-cli and pyxis prints its log (NVIDIA/pyxis#166's layout,
    # with NVIDIA/nvidia-container-toolkit#1269's CLI line); srun's exit line is NVIDIA/pyxis#166's, naming
    # this workload's node and task instead of gpu-dy-g58xlarge-1 and task 0.
    log = ("8: slurmstepd: error: pyxis: container start failed with error code: 1\n"
           "8: slurmstepd: error: pyxis: printing enroot log file:\n"
           "8: slurmstepd: error: pyxis:     nvidia-container-cli: initialization error: nvml error: driver not loaded\n"
           "8: slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1\n"
           "8: slurmstepd: error: pyxis: couldn't start container\n"
           "srun: error: node-02: task 8: Exited with exit code 1\n")
    d = diag({"logs/app/job.log": log})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "driver_library_mismatch", ["node-02"])
    assert d.recovery.action == "retry_excluding_nodes" and d.recovery.nodes == ["node-02"]
    assert d.symptom_coverage == 1.0


def test_the_hook_failing_to_talk_to_the_driver_only_names_a_suspect():
    # NVIDIA/nvidia-container-toolkit#416 and #173: NVML or the driver RPC service failed; NVIDIA's
    # maintainers read it as a driver install problem, a failing GPU gives it too: echo evidence.
    for line in ("nvidia-container-cli: detection error: nvml error: unknown error", RPC_FAILED):
        d = diag({"logs/app/node-02.log": line + "\n"})
        assert d.status == "unattributed", line
        assert d.suspect_nodes == ["node-02"], line
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == [], line


def test_the_hooks_cuda_error_beside_the_gpus_ecc_xid_is_that_ecc_error():
    # NVIDIA/nvidia-docker#849 (corpus case ho4-xid48-...): the old hook's "cuda error: initialization
    # error" and the driver's Xid 48 on the GPU it could not initialize.
    # The docker output as posted there, wrapped at the reporter's terminal width.
    docker = ('docker: Error response from daemon: OCI runtime create failed: container_linux.go:348: \n'
              'starting container process caused "process_linux.go:402: container init caused \\"process_linux.go:385: '
              'running prestart hook 1 caused \\\\\\"error running hook: exit status 1, \n'
              'stdout: , stderr: exec command: [/usr/bin/nvidia-container-cli --load-kmods configure \n'
              '--ldconfig=@/sbin/ldconfig --device=all --compute --utility --require=cuda>=10.0 \n'
              'brand=tesla,driver>=384,driver<385 --pid=29004 \n'
              '/data/docker_rt/overlay2/65412291f76b94894ec8cdd271e3a7534a60a3e38a28e79fbc25d4276d70a215/merged]\n'
              '\\\\\\\\nnvidia-container-cli: initialization error: cuda error: initialization error'
              '\\\\\\\\n\\\\\\"\\"": unknown.\n')
    dmesg = ("[Mon Oct 29 12:07:39 2018] NVRM: Xid (PCI:0000:8a:00): 48, An uncorrectable double bit error (DBE) has been "
             "detected on GPU in the framebuffer at partition 4, subpartition 1.\n")
    d = diag({"logs/app/node-01.log": docker, "logs/syslog/node-01.log": dmesg},
             start_time="2018-10-29T12:00:00Z", end_time="2018-10-29T12:30:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "gpu_memory_ecc")


# ------------------------------------------------------------------ the image and the job's request

def test_cuda_requirement_above_the_driver_is_the_driver_job_disagreement_never_drained():
    d = diag({"logs/app/node-01.log": CUDA_REQUIREMENT + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "driver_library_mismatch")
    _no_drain(d)
    assert "older CUDA" in d.recovery.next_step


def test_driver_files_baked_into_the_image_are_the_images_fault_on_any_node():
    d = diag({"logs/app/node-01.log": IMAGE_HAS_DRIVER + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert (d.recovery.action, d.recovery.nodes) == ("notify_owner", [])
    assert "rebuild the image" in d.recovery.next_step


def test_another_file_creation_failure_is_not_read_as_the_image():
    # apptainer/apptainer#1208: --nvccli on an XFS overlay, not the image's own driver files.
    d = diag({"logs/app/node-01.log": "FATAL:   container creation failed: nvidia-container-cli failed with exit status 1: "
                                      "nvidia-container-cli: mount error: file creation failed: /var/apptainer/mnt/session/"
                                      "final/etc/nvidia/nvidia-application-profiles-rc.d: no data available\n"})
    assert d.status != "attributed"


def test_the_hooks_other_failures_name_no_cause_and_drain_nothing():
    # NVIDIA/pyxis#166 (a toolkit upgrade), NVIDIA/nvidia-container-toolkit#108 (k3s journal),
    # NVIDIA/nvidia-docker#1660's title line (cgroup v2 with an old toolkit).
    for path, line in (
            ("logs/app/node-01.log", "slurmstepd: error: pyxis:   nvidia-container-cli: container error: file lookup failed: "
                                     "/proc/421042/root/fsx/enroot/data/user-1111/pyxis_nemo_2502_$USER/etc/debian_version: "
                                     "permission denied"),
            ("logs/syslog/node-01.log", "Sep 08 08:58:07 REDACTED k3s[8174]:         nvidia-container-cli: device error: "
                                        "/var/run/nvidia-container-devices: unknown device: unknown"),
            ("logs/app/node-01.log", "nvidia-container-cli: container error: cgroup subsystem devices not found: unknown")):
        d = diag({path: line + "\n"})
        assert d.status == "unattributed", line
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == [], line


def test_docker_s_command_line_alone_is_no_hook_error():
    # The exec command docker prints before the error (NVIDIA/nvidia-docker#849) without the error line.
    d = diag({"logs/app/node-01.log": "stdout: , stderr: exec command: [/usr/bin/nvidia-container-cli --load-kmods configure\n"})
    assert not any(s.kind == "container_gpu_hook_error" for s in d.symptoms)
    assert d.root_cause is None


# ------------------------------------------------------------------ enroot under pyxis

PYXIS_401 = """pyxis: importing docker image: evuedsoacr.azurecr.io/dc-ecosys-appl-eng/mlperf-nvidia:stable_diffusion-pyt
slurmstepd: error: pyxis: child 1022281 failed with error code: 1
slurmstepd: error: pyxis: failed to import docker image
slurmstepd: error: pyxis: printing enroot log file:
slurmstepd: error: pyxis:     [INFO] Querying registry for permission grant
slurmstepd: error: pyxis:     [INFO] Authenticating with user: <anonymous>
slurmstepd: error: pyxis:     [INFO] Authentication succeeded
slurmstepd: error: pyxis:     [INFO] Fetching image manifest list
slurmstepd: error: pyxis:     [INFO] Fetching image manifest
slurmstepd: error: pyxis:     [ERROR] URL https://registry-1.docker.io/v2/evuedsoacr.azurecr.io/dc-ecosys-appl-eng/mlperf-nvidia/manifests/stable_diffusion-pyt returned error code: 401 Unauthorized
slurmstepd: error: pyxis: couldn't start container
"""


def test_a_registry_refusing_the_image_is_the_jobs_image_reference():
    # NVIDIA/pyxis#168, as posted (a private registry's image written with "/" instead of "#").
    d = diag({"logs/app/slurm-4242.out": PYXIS_401})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert (d.recovery.action, d.recovery.nodes) == ("notify_owner", [])
    assert "registry#image" in d.recovery.next_step
    assert "401" in d.summary


def test_a_registry_gateway_timeout_is_nobodys_fault_of_the_job():
    # NVIDIA/pyxis#21
    d = diag({"logs/app/node-01.log": "slurmstepd-gpu: error: pyxis:    [ERROR] URL https://registry.local:5050/v2/bot/gpu-pack/"
                                      "manifests/latest returned error code: 504 Gateway Time-out\n"})
    assert d.status != "attributed"


def test_no_space_to_unpack_the_image_is_the_nodes_storage_with_its_own_fix():
    # NVIDIA/pyxis#41, as posted (mksquashfs into /run, a tmpfs).
    log = ("slurmstepd: error: pyxis:     Write failed because No space left on device\n"
           "slurmstepd: error: pyxis:     FATAL ERROR:Failed to write to output filesystem\n"
           "slurmstepd: error: pyxis:     Parallel mksquashfs: Using 2 processors\n"
           "slurmstepd: error: pyxis:     Creating 4.0 filesystem on /run/pyxis/1000/7.0.squashfs, block size 131072.\n")
    d = diag({"logs/app/node-01.log": log})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")
    assert "runtime_path" in d.recovery.next_step


def test_pyxis_headlines_alone_are_no_cause():
    # NVIDIA/pyxis#135: only pyxis's and Slurm's headlines, no enroot log.
    log = ("slurmstepd-sp-0016: error: pyxis: couldn't start container\n"
           "slurmstepd-sp-0016: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1\n"
           "slurmstepd-sp-0016: error: Failed to invoke spank plugin stack\n"
           "srun: error: sp-0016: task 0: Exited with exit code 1\n")
    d = diag({"logs/app/node-01.log": log})
    assert d.status == "unattributed"


# NVIDIA/pyxis#61, as posted: the image lacks the shell the job runs, on both nodes
PYXIS_NO_BASH = """pyxis: importing docker image ...
pyxis: importing docker image ...
slurmstepd: error: pyxis: container start failed with error code: 1
slurmstepd: error: pyxis: printing contents of log file ...
slurmstepd: error: pyxis:     enroot-switchroot: failed to execute: /bin/bash: No such file or directory
slurmstepd: error: pyxis: couldn't start container
slurmstepd: error: pyxis: if the image has an unusual entrypoint, try using --no-container-entrypoint
slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1
slurmstepd: error: Failed to invoke spank plugin stack
srun: error: hpc-pg0-2: task 1: Exited with exit code 1
"""


def test_a_command_missing_from_the_image_is_the_jobs_own_on_any_node():
    d = diag({"logs/app/slurm-61.out": PYXIS_NO_BASH}, nodes=["hpc-pg0-1", "hpc-pg0-2"])
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert (d.recovery.action, d.recovery.nodes) == ("notify_owner", [])
    # the headline pyxis prints above it alone says nothing of why
    d = diag({"logs/app/slurm-61.out": "slurmstepd: error: pyxis: couldn't start container\n"})
    assert d.status != "attributed"
