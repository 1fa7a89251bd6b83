"""A namespace left behind by an earlier process is removed, not skipped over
(tests/support/netns.py).

Invariant: where a namespace and a veth by the names Hosts would make already exist (left by
a process that had this pid), Hosts removes them and makes its own: the host it makes has its
address, and on leaving nothing by those names remains.
"""

import os
import shutil
import subprocess

import pytest

from support.netns import Hosts, ip

# root, network namespaces, nsenter: under CI=true a skip is a failure (conftest.py)
pytestmark = pytest.mark.ci_must_run

NET = 76  # 169.254.76.x: link-local, our own namespaces only


@pytest.mark.timeout(60)
def test_a_leftover_namespace_and_veth_are_removed_not_skipped_over():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nsenter")):
        pytest.skip("needs root, iproute2 and nsenter for network namespaces")
    planned = Hosts(1, NET, tag="lo")
    ip("netns", "add", planned.switch, check=True)  # the leftovers
    ip("link", "add", planned.devs[0], "type", "veth", "peer", "name", planned.ports[0])
    try:
        with Hosts(1, NET, tag="lo") as h:
            shown = subprocess.run(
                [*h.prefix(0), "ip", "-o", "addr", "show", "dev", h.devs[0]],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            assert f"{h.ips[0]}/24" in shown, shown
        names = ip("netns", "list", check=False).stdout
        assert planned.switch not in names and planned.names[0] not in names, names
        assert ip("link", "show", planned.devs[0], check=False).returncode != 0
    finally:  # whatever happened: nothing of ours stays
        for ns in (planned.switch, *planned.names):
            ip("netns", "del", ns, check=False)
        ip("link", "del", planned.devs[0], check=False)
