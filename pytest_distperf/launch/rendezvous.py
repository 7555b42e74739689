"""A single-machine rendezvous for torch elastic whose stores listen on loopback only: torch's `c10d` backend binds
its TCPStores on every interface, and a test has no business listening on the network. Everything else is torch's
own dynamic rendezvous, less two costs it has for clusters that a one-agent rendezvous need not pay on every job
(`quick_single_machine`).
"""

from __future__ import annotations

import socket
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

BACKEND_NAME = "distperf-loopback"
LOOPBACK = "127.0.0.1"


def loopback_store(port: int = 0) -> dist.TCPStore:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, port))
    sock.listen(1024)
    bound_port = sock.getsockname()[1]
    # detach(): the store owns the descriptor from now on, Python must not close it.
    return dist.TCPStore(LOOPBACK, bound_port, is_master=True, multi_tenant=True, master_listen_fd=sock.detach(),
                         timeout=timedelta(seconds=300))


class LoopbackBackend(C10dRendezvousBackend):
    @property
    def name(self) -> str:
        return BACKEND_NAME  # torch checks that the handler's backend answers to the registered name


class LoopbackRendezvousHandler(DynamicRendezvousHandler):
    def _create_tcp_store_server(self, master_addr, master_port) -> dist.TCPStore:  # noqa: ARG002
        return loopback_store(master_port)


def _create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    store = loopback_store()
    backend = LoopbackBackend(store, params.run_id)
    return LoopbackRendezvousHandler.from_backend(
        run_id=params.run_id, store=store, backend=backend, min_nodes=params.min_nodes, max_nodes=params.max_nodes,
        local_addr=LOOPBACK, timeout=None)


def register() -> None:
    """In the job agent, which runs only this one-machine rendezvous."""
    rendezvous_handler_registry.register(BACKEND_NAME, _create_handler)
    quick_single_machine()


def caller_name(depth: int = 2) -> str:
    """What torch's `dynamic_rendezvous.get_method_name` returns (`inspect.stack()[depth].function`), read from
    the frame itself: inspect.stack() reads every frame's source lines, twice per rendezvous event, and that took
    more of a job's start than the ranks' fork (benchmarks/run_timeline.py)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


_torch_delay = dynamic_rendezvous._delay


def _delay_without_skew(seconds: "float | tuple[float, float]") -> None:
    """torch's rendezvous delay, less the random first-round one (a (low, high) range) that spreads many nodes'
    joins over the store: one agent joins this rendezvous."""
    if not isinstance(seconds, tuple):
        _torch_delay(seconds)


def quick_single_machine() -> None:
    """Drop the two cluster costs from torch's dynamic rendezvous in this process (where torch has them)."""
    if hasattr(dynamic_rendezvous, "get_method_name"):
        dynamic_rendezvous.get_method_name = caller_name
    dynamic_rendezvous._delay = _delay_without_skew
