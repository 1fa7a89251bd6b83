"""Who is in the group: the coordinator (server.py), init_process_group and the default group
(init.py), and stall diagnosis (diagnose.py)."""
