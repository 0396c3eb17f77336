"""Small helpers shared by the server processes and the code that starts them (logging setup,
server_procs, ...)."""
