51200+0 records in
51200+0 records out
52428800 bytes (52 MB) copied, 0.459204 s, 114 MB/s
slurmstepd: Exceeded step memory limit at some point.
