"""The ZeroMQ transport and what only it uses: ZmqTransport (transport.py), the reading of its
frames (frames.py), same-host shared memory (shm.py) and registered buffers (registered.py),
fast links for small same-host messages (fastlink.py), CURVE keys and authentication
(security.py), the socket-monitor failure watch (peerwatch.py) and the addresses its sockets
bind and advertise (addresses.py).
"""
