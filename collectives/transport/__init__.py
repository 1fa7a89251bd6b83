"""Moving frames between ranks: the Transport base (base.py) and OpChannel, the narrow channel
every algorithm sees (channel.py); the wire header (wire.py); frames kept for later (stash.py);
receive from any source (anysource.py); the in-process transport (inproc.py); channel wrappers
(wrapper.py) and fault injection (faults.py). The ZeroMQ transport, with same-host shared memory
and fast links, is the subpackage zmq/.

Every transport delivers the same framed messages (a msgpack header + a raw payload) to the
same OpChannel logic, so validation, mismatch detection and error messages are identical
whether an algorithm runs in one process or across hosts.
"""
