"""Torch-free scheduling mechanism shared by the engine and the simulator (DESIGN.md section 1).

No torch and no I/O here (test/unit/test_import_rules.py checks it), so the simulator and the
scheduler benchmarks drive exactly the code the engine runs without importing ``engine/``:

- ``step.py``: the one definition of a step (ForwardMode, ReqState, StepShape, StepProfile,
  BucketGrid).
- ``scheduler.py``: the Scheduler (step composition: admission, chunking, mixed steps), built on
  ``scheduler_queues.py`` (queues, PD parking, quarantine) and ``pool_pressure.py`` (preemption,
  retraction, unblock); ``scheduled_step.py``: ScheduledStep and the SchedulerReq protocol.
- ``page_allocator.py``: KV page allocators (PageAllocator, CountingAllocator).
- ``pd_rules.py``: the PD rules both sides apply (whole-prompt pages, decode admission).
- ``load_signals.py``: per-class load figures the engine reports to the router.
- ``progress.py``: the progress rule; ``watchdog.py``: the livelock detector.
"""
