"""Which machine a measurement belongs to, read without initialising CUDA (NVML only).

Hard: what makes step times incomparable (device kind and model, device count, nodes, world size, the GPUs'
interconnect and what connects the nodes); it names a baseline's folder (`cuda-nvidia-h200-2gpu-nvlink-1node-ws2`).
Soft: what may explain a change (versions, host, git commit), recorded with each baseline and only warned about.
The commit comes with whether the tree held uncommitted changes (`git_dirty`, and `git_dirty_files`: how many
tracked files differ from it): a baseline saved from a dirty tree is not that commit's code, and `commit_text`
says so wherever a commit is named.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
import socket
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any, Mapping

from pytest_distperf.launch import devices

# Soft fields whose change can move the numbers (warned about); host and commit are only context.
VERSION_FIELDS = ("driver", "cuda", "nccl", "torch", "deepspeed", "lightning", "accelerate", "python")


@dataclass(frozen=True)
class MachineClass:
    device: str  # "cpu" | "cuda"
    model: str  # CPU model name, or the GPU name(s)
    count: int  # usable CPU cores, or visible GPUs
    nodes: int
    world_size: int
    interconnect: str  # "nvlink" | "pcie" | "unknown" on GPUs; "none" on CPU
    # between nodes: "none" (one node), "loopback" (several node agents on one host), or network_fabric()
    inter_node: str = "none"

    @property
    def name(self) -> str:
        """A readable folder name, stable for the same hardware."""
        unit = "gpu" if self.device == "cuda" else "core"
        parts = [self.device, _slug(self.model), f"{self.count}{unit}"]
        if self.device == "cuda":
            parts.append(self.interconnect)
        parts.append(f"{self.nodes}node")
        if self.nodes > 1:  # one-node names stay as they were
            parts.append(self.inter_node)
        parts.append(f"ws{self.world_size}")
        return "-".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    text = re.sub(r"\b(cpu|processor)\b|@.*$", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:48] or "unknown"


def machine_class(device: str, world_size: int, nodes: int = 1, inter_node: str = "none") -> MachineClass:
    """Read on the host that runs pytest: on several nodes, the class of that host's node."""
    if device == "cuda":
        gpus = _gpu_facts()
        return MachineClass(device="cuda", model=gpus["model"], count=gpus["count"], nodes=nodes,
                            world_size=world_size, interconnect=gpus["interconnect"], inter_node=inter_node)
    return MachineClass(device="cpu", model=cpu_model(), count=devices.usable_cores(), nodes=nodes,
                        world_size=world_size, interconnect="none", inter_node=inter_node)


def inter_node(nodes: int, one_host: bool) -> str:
    """What connects a job's nodes: "none" (one node), "loopback" (every agent on one host), else network_fabric()."""
    if nodes == 1:
        return "none"
    return "loopback" if one_host else network_fabric()


def network_fabric(sysfs: str = "/sys/class/infiniband") -> str:
    """"ib" (an active InfiniBand port), "roce" (an active RDMA port on Ethernet), else "tcp", from sysfs as NCCL
    picks its transport."""
    kinds = set()
    for state_path in glob.glob(os.path.join(sysfs, "*", "ports", "*", "state")):
        try:
            with open(state_path) as f:
                active = "ACTIVE" in f.read()
            with open(os.path.join(os.path.dirname(state_path), "link_layer")) as f:
                layer = f.read().strip().lower()
        except OSError:
            continue
        if active:
            kinds.add("roce" if layer == "ethernet" else "ib")
    return "ib" if "ib" in kinds else "roce" if "roce" in kinds else "tcp"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _gpu_facts() -> dict[str, Any]:
    """GPU model, visible count and interconnect from NVML (devices.nvml); nvidia-smi's names without it."""
    with devices.nvml() as nvml:
        if nvml is None:
            names = sorted(set(devices.nvidia_smi("--query-gpu=name", "--format=csv,noheader")))
            return {"model": "+".join(names) or "unknown", "count": devices.visible_gpu_count(),
                    "interconnect": "unknown"}
        total = int(nvml.nvmlDeviceGetCount())
        indices = devices.nvml_indices(devices.visible_gpu_ids(total), total)
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        names = sorted({devices.nvml_text(nvml.nvmlDeviceGetName(h)) for h in handles}) or ["unknown"]
        return {"model": "+".join(names), "count": len(handles),
                "interconnect": _interconnect(nvml, handles[0]) if handles else "unknown"}


def _interconnect(pynvml: Any, handle: Any) -> str:
    """'nvlink' when any NVLink of the first visible GPU is up, else 'pcie'."""
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) == getattr(pynvml, "NVML_FEATURE_ENABLED", 1):
                return "nvlink"
        except Exception:  # NVMLError_NotSupported / InvalidArgument: no such link
            continue
    return "pcie"


def soft_metadata(device: str, rootdir: str | None = None) -> dict[str, str | None]:
    """Versions and context recorded with a baseline; a difference is only warned about."""
    meta: dict[str, str | None] = {
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        **git_state(rootdir),
    }
    for dist in ("torch", "deepspeed", "lightning", "accelerate"):
        meta[dist] = dist_version(dist)
    cuda = device == "cuda"
    meta.update(cuda=_torch_cuda_version() if cuda else None, nccl=_nccl_version() if cuda else None,
                driver=_driver_version() if cuda else None)
    return meta


def dist_version(name: str) -> str | None:
    """An installed distribution's version; None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_cuda_version() -> str | None:
    with contextlib.suppress(Exception):
        import torch

        return torch.version.cuda
    return None


def _nccl_version() -> str | None:
    with contextlib.suppress(Exception):
        import torch

        v = torch.cuda.nccl.version()  # a library query; does not create a CUDA context
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return None


def _driver_version() -> str | None:
    with devices.nvml() as nvml:
        if nvml is not None:
            return devices.nvml_text(nvml.nvmlSystemGetDriverVersion())
    found = devices.nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return found[0] if found else None


def git_commit(rootdir: str | None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=rootdir or None, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def git_state(rootdir: str | None) -> dict[str, Any]:
    """{"git_commit": HEAD, "git_dirty": whether tracked files differ from it (staged or not, as `git diff HEAD`
    sees them, the head side of --distperf-against), "git_dirty_files": how many}; the last two only where a
    commit was read (outside a repository: {"git_commit": None})."""
    commit = git_commit(rootdir)
    if commit is None:
        return {"git_commit": None}
    changed = changed_files(rootdir)
    if changed is None:  # git answered HEAD but not the diff: say nothing rather than "clean"
        return {"git_commit": commit}
    return {"git_commit": commit, "git_dirty": bool(changed), "git_dirty_files": len(changed)}


def changed_files(rootdir: str | None) -> list[str] | None:
    """The tracked files that differ from HEAD (`git diff --name-only HEAD`); None when git cannot say."""
    try:
        out = subprocess.run(["git", "diff", "--name-only", "HEAD", "--"], cwd=rootdir or None, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None


DIRTY_TEXT = " + uncommitted changes"


def commit_text(record: Mapping[str, Any] | None, width: int = 12) -> str:
    """The commit a record (an environment, a baseline's provenance) was measured at, as messages name it:
    'cc03c20abcde', 'cc03c20abcde + uncommitted changes' when the tree was dirty, '?' when unknown. Records
    written before `git_dirty` existed read as the plain commit."""
    record = record or {}
    return describe_commit(record.get("git_commit"), bool(record.get("git_dirty")), width)


def describe_commit(commit: str | None, dirty: bool = False, width: int = 12) -> str:
    """commit_text's words from the commit and the dirty flag themselves."""
    if not commit:
        return "?"
    return str(commit)[:width] + (DIRTY_TEXT if dirty else "")


def soft_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'torch 2.5.1 -> 2.6.0' for each version that differs between the baseline and this run."""
    return [f"{key} {saved.get(key) or '?'} -> {current.get(key) or '?'}" for key in VERSION_FIELDS
            if saved.get(key) != current.get(key)]
