"""Tensor parallelism in the engine: N processes per server, one per rank.

Rank 0 is the engine process the frontend starts: it runs the scheduler, sends each step's
plan (``messages.StepPlan``, msgpack over ZMQ IPC) to ranks 1..N-1 and samples. Ranks 1..N-1
(``worker.py``, started by rank 0's ``launcher.py``) only run the forward of each plan on their
weight shard; the layers' collectives (torch.distributed: gloo on CPU, NCCL on CUDA) keep every
rank in the same step. See docs/disaggregation.md for PD with TP.
"""
