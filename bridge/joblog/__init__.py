"""The job's own console log: read it in bounded memory, find its first meaningful error with
the rank, host and GPU it names, and join that reading with the infrastructure diagnosis.

``reading`` is pure (bytes in, a frozen ``Reading`` out); ``sources`` holds the edges (a local
file, Slurm output files, Kubernetes pod logs, W&B's console log), each optional and failing on
its own; ``join`` combines a reading with the run's root cause into one statement and verdict.
"""
