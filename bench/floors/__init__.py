"""The floors under a collective: the loopback limit, the latency and copy floors, pure Python's fastest exchange."""
