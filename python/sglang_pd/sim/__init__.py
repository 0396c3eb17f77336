"""Discrete-event cluster simulator (DESIGN.md section 4): instances hold the engine's own
``Scheduler`` and registry policies, driven with length-only requests. Imports no torch."""
