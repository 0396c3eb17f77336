"""Torch-free scheduling mechanism shared by the engine and the simulator (DESIGN.md section 1).

Issue 28 item 4 moves ``engine/scheduler.py``, the page allocators, ``pd_rules`` and the load
signals here; until then this package holds the new torch-free pieces: the progress rule
(``progress.py``) and the livelock detector the engine's watchdog reads (``watchdog.py``).
"""
