"""Run inside fresh network, UTS and mount namespaces (tests/test_loopback.py starts it under `unshare`).

Builds a namespace whose hostname resolves to a non-loopback address -- the trap gloo fell into on a
machine whose hostname resolves to its LAN address -- then records which sockets listen:

1. set-up, all of it inside the namespaces: loopback up, a veth pair (both ends inside) with the
   TEST-NET-1 address 192.0.2.2/24, hostname `distperf-netns`, and an /etc/hosts bind-mounted over
   (private mount namespace) that maps that hostname to 192.0.2.2. No traffic leaves the namespace.
2. control: one gloo process group created the way torch does by default (no GLOO_SOCKET_IFNAME):
   its listener shows where an unguarded socket lands (192.0.2.2 here), so the trap is armed.
3. a real 2-rank job through the launcher: rank 0 lists every listening and connected socket
   while both ranks are up (`ss`), after a collective on the default group and on a new group.

    python tests/netns_loopback.py OUT.json
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRAP_ADDRESS = "192.0.2.2"  # TEST-NET-1 (RFC 5737): documentation only, never routed
HOSTNAME = "distperf-netns"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def sockets() -> dict[str, list[str]]:
    """`ss` lines of this namespace: listening TCP/UDP sockets and connected TCP sockets (with processes)."""
    return {"listening": sh("ss", "-H", "-l", "-t", "-u", "-n", "-p").splitlines(),
            "connected": sh("ss", "-H", "-t", "-n", "-p").splitlines()}


def set_up_namespace() -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "dpv0", "type", "veth", "peer", "name", "dpv1")
    sh("ip", "addr", "add", f"{TRAP_ADDRESS}/24", "dev", "dpv0")
    sh("ip", "link", "set", "dpv0", "up")
    sh("ip", "link", "set", "dpv1", "up")
    socket.sethostname(HOSTNAME)
    hosts = tempfile.NamedTemporaryFile("w", prefix="distperf-netns-hosts-", delete=False)
    hosts.write(f"127.0.0.1 localhost\n{TRAP_ADDRESS} {HOSTNAME}\n")
    hosts.close()
    sh("mount", "--bind", hosts.name, "/etc/hosts")  # only in this mount namespace
    os.unlink(hosts.name)  # the mount keeps the file's contents


def control_listener() -> list[str]:
    """Where torch's default gloo device listens here (no GLOO_SOCKET_IFNAME): the address the job must avoid."""
    import torch.distributed as dist

    from pytest_distperf.launch.rendezvous import loopback_store

    env = os.environ.pop("GLOO_SOCKET_IFNAME", None)
    try:
        store = loopback_store()
        group = dist.ProcessGroupGloo(dist.PrefixStore("control", store), 0, 1, datetime.timedelta(seconds=30))
        lines = sockets()["listening"]
        del group, store
    finally:
        if env is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = env
    return lines


def sockets_during_job() -> dict | None:
    """In every rank: collectives on the default group and a new gloo group, then rank 0 lists the sockets."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t, group=dist.new_group(backend="gloo"))
    dist.barrier()
    seen = None
    if dist.get_rank() == 0:
        seen = {**sockets(), "env": {k: os.environ.get(k) for k in (
            "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}}
    dist.barrier()  # both ranks stay up until rank 0 has looked
    return seen


def main(out: str) -> None:
    set_up_namespace()
    sys.path.insert(0, str(ROOT))
    from pytest_distperf.launch.launcher import launch
    from pytest_distperf.spec.job import FunctionRef, JobSpec

    result: dict = {"hostname": socket.gethostname(),
                    "resolves_to": sorted({a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)})}
    result["control_listening"] = control_listener()
    job = JobSpec(world_size=2, device="cpu", function=FunctionRef("netns_loopback", "sockets_during_job", __file__),
                  sys_path=[str(HERE), str(ROOT)])
    with tempfile.TemporaryDirectory(prefix="distperf-netns-") as base:
        values = launch(job, timeout=240, base_dir=base)
    result["job"] = values[0]
    Path(out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
