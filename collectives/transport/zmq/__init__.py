"""The ZeroMQ transport and what only it uses: ZmqTransport (transport.py), the reading of its
frames (frames.py), same-host shared memory (shm.py) and registered buffers (registered.py),
fast links for small same-host messages (fastlink.py), the socket-monitor failure watch
(peerwatch.py) and the addresses its sockets bind and advertise (addresses.py). Job security
(CURVE keys, the ZAP guard) is common/security.py: the launcher and the coordinator use it too.
"""
