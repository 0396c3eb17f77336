"""Small helpers shared by the server processes (logging setup, ...)."""
