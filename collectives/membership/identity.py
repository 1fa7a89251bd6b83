"""A member speaks only for itself: its member id is the fingerprint of a CURVE key of its own.

Every process that talks to the coordinator makes a fresh CURVE key pair (never written
anywhere) and proves it in every handshake; its member id (`mid`) is derived from the public
key. The coordinator's ZAP handler names each connection after the member id of the key it
proved, ZeroMQ attaches that name to every message as its User-Id, and the coordinator takes a
message that names a member id only if it is that one (server.py). So a holder of the job
secret -- a member gone bad -- can still say what it likes about itself, but cannot leave,
beat, re-register or ask a verdict in another member's name: that needs the other's secret key,
which never leaves its process.

Admission is unchanged: a client completes a CURVE handshake only if it knows the server's
public key, which only the job secret gives (transport/security.py); the server admits any
client key, because the member id, not the key, is what it checks.

Without authentication (COLLECTIVES_INSECURE=1) there are no keys: a member id is random and
proves nothing, like everything else on such a job.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import zmq

from ..common import secret as shared
from ..common import security

MID_BYTES = 16  # a member id is 32 hex characters, as a uuid4().hex was


def mid_of(raw_public: bytes) -> str:
    """The member id of a CURVE public key (32 raw bytes)."""
    return hashlib.sha256(b"collectives member id " + raw_public).hexdigest()[: 2 * MID_BYTES]


def new_member(keys: security.JobKeys | None) -> tuple[security.KeyPair | None, str]:
    """(this member's own key pair, its member id); (None, a random id) when insecure."""
    if keys is None:
        return None, uuid.uuid4().hex
    pair = security.KeyPair(zmq.curve_keypair()[1])
    return pair, mid_of(pair.raw_public)


def connection_name(raw_public: bytes) -> bytes:
    """What the coordinator's ZAP handler names a connection: the member id its key gives."""
    return mid_of(raw_public).encode()


def client_keys(keys: Any, address: str) -> Any:
    """keys as given; for AUTO: the environment's, None (insecure), the secret a coordinator
    of this user published for that port on this host (common/secret.py), else this process's
    own (security.process_keys)."""
    if keys is not security.AUTO:
        return keys
    found = security.from_environment()
    if found is not security.AUTO:
        return found
    port = address.rpartition(":")[2]
    published = shared.read(f"coordinator-{port}") if port.isdigit() else None
    if published is not None:
        return security.JobKeys(published, "shared file")
    return security.process_keys()
