"""Moving frames between ranks: the Transport base (base.py) and OpChannel, the narrow channel
every algorithm sees (channel.py); the wire header (wire.py); in-process (inproc.py), ZeroMQ
(zmq.py) and same-host shared memory (shm.py) transports; the socket-monitor failure watch
(peerwatch.py); channel wrappers (wrapper.py) and fault injection (faults.py).

Every transport delivers the same framed messages (a msgpack header + a raw payload) to the
same OpChannel logic, so validation, mismatch detection and error messages are identical
whether an algorithm runs in one process or across hosts.
"""
