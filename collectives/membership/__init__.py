"""Who is in the group: the coordinator's messages (protocol.py), the coordinator
(server.py) and a process's link to it (client.py), one process's life across generations
(lifecycle.py), init_process_group and the default group (init.py), SIGTERM (signals.py), and
whom a stall blames (diagnose.py)."""
