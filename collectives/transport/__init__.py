"""Channel implementations: in-process (threads + queues) and ZeroMQ.

Both deliver the same framed messages (a msgpack header + a raw payload) to the same
OpChannel logic in base.py, so validation, mismatch detection and error messages are
identical whether an algorithm runs in one process or across hosts.
"""
