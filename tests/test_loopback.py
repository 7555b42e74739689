"""The one-machine rendezvous (launch/rendezvous.py): every socket of a local job binds loopback, also where the
hostname resolves to a network address; torch's rendezvous there, less its cluster costs."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_distperf.launch.launcher import agent_environment
from pytest_distperf.spec.job import JobSpec

SCRIPT = Path(__file__).resolve().parent / "netns_loopback.py"


def test_rendezvous_events_keep_torchs_names(monkeypatch):
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from pytest_distperf.launch import rendezvous

    def torchs_way(depth=2):  # torch's get_method_name, as dynamic_rendezvous.py has it
        return inspect.stack()[depth].function if len(inspect.stack()) > depth else "no_method_name"

    def _record():  # as torch's _record calls it: the name is _record's caller's
        return rendezvous.caller_name(), torchs_way()

    def join_round():
        return _record()

    assert join_round() == ("join_round", "join_round")
    for name in ("get_method_name", "_delay"):  # undone after the test: pytest's own process keeps torch's
        monkeypatch.setattr(dynamic_rendezvous, name, getattr(dynamic_rendezvous, name))
    rendezvous.quick_single_machine()
    assert dynamic_rendezvous.get_method_name is rendezvous.caller_name


def test_one_agent_joins_without_the_clusters_random_delay(monkeypatch):
    from pytest_distperf.launch import rendezvous

    slept: list[object] = []
    monkeypatch.setattr(rendezvous, "_torch_delay", slept.append)
    rendezvous._delay_without_skew((0, 0.3))  # the first round's spread over many nodes' joins
    rendezvous._delay_without_skew(1)  # the poll between syncs stays
    assert slept == [1]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ranks_are_told_to_bind_loopback(monkeypatch, device):
    # A user's cluster settings must not put a local job's sockets on the network.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    env = agent_environment(JobSpec(world_size=2, device=device))
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["TP_SOCKET_IFNAME"] == "lo"
    assert env["NCCL_SOCKET_IFNAME"] == "lo"


def _address(local: str) -> str:
    """The address of an `ss` local-address column: 127.0.0.1:41234, [::1]:5, *:80, 0.0.0.0:80, 192.0.2.2%lo:80."""
    host = local.rsplit(":", 1)[0].strip("[]")
    return host.split("%", 1)[0]


def _on_loopback(local: str) -> bool:
    try:
        address = ipaddress.ip_address(_address(local))
    except ValueError:  # "*": every interface
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # [::ffff:127.0.0.1]: an IPv4 connection on a dual-stack socket
    return address.is_loopback


def _local_column(line: str, listening: bool) -> str:
    # -l -t -u: Netid State Recv-Q Send-Q Local Peer Process; -t (connected): State Recv-Q Send-Q Local Peer Process
    return line.split()[4 if listening else 3]


def _namespace_unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "needs root to create network, UTS and mount namespaces"
    missing = [tool for tool in ("ip", "ss", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"needs iproute2 and util-linux: {', '.join(missing)} not found"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.mark.slow
def test_every_socket_of_a_job_listens_on_loopback_where_the_hostname_resolves_to_the_network(tmp_path):
    reason = _namespace_unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the loopback proof, but {reason}")
        pytest.skip(reason)
    out = tmp_path / "sockets.json"
    proc = subprocess.run(["unshare", "--net", "--uts", "--mount", "--fork", "--", sys.executable, str(SCRIPT),
                           str(out)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(out.read_text())

    # The trap is armed: the hostname resolves to the TEST-NET address, and torch's default gloo device listens there.
    assert seen["resolves_to"] == ["192.0.2.2"]
    control = {_address(_local_column(line, listening=True)) for line in seen["control_listening"]}
    assert "192.0.2.2" in control, seen["control_listening"]

    job = seen["job"]
    listening = job["listening"]
    assert listening, "no listening socket seen during the job"
    off_loopback = [line for line in listening if not _on_loopback(_local_column(line, listening=True))]
    assert not off_loopback, "\n".join(off_loopback)
    connected = [line for line in job["connected"] if not _on_loopback(_local_column(line, listening=False))]
    assert not connected, "\n".join(connected)
    assert job["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert any("python" in line for line in listening)  # the ranks' own listeners were among those checked
