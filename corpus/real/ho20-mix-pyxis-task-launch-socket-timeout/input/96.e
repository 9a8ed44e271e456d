pyxis: imported docker image: docker://hpcreid/openmpi:230130
srun: error: slurm_receive_msgs: [[n1.mytestdomain]:6818] failed: Socket timed out on send/recv operation
srun: error: Task launch for StepId=96.0 failed on node n2: No such process
srun: error: Task launch for StepId=96.0 failed on node n3: No such process
srun: error: Task launch for StepId=96.0 failed on node n1: Socket timed out on send/recv operation
srun: error: Application launch failed: Socket timed out on send/recv operation
srun: Job step aborted
