"""sglang-pd router: length-aware PD router (light package, no torch). Built in the router issue."""

__version__ = "0.1.0"
