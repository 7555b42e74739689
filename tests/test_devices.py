"""GPU discovery in the pytest process (devices.py): CUDA_VISIBLE_DEVICES, NVML, the machine class. No CUDA."""

import sys

from pytest_distperf.launch import devices


def test_visible_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert devices.visible_gpu_ids(8) == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,-1,3")  # CUDA stops at the first entry naming no device
    assert devices.visible_gpu_ids(8) == ["2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc")
    assert devices.visible_gpu_ids(2) == ["GPU-aa", "GPU-bb"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.visible_gpu_ids(3) == ["0", "1", "2"]
    assert devices.nvml_indices(["3", "9"], 8) == [3]
    assert devices.nvml_indices(["GPU-aa", "GPU-bb"], 8) == [0, 1]


class FakeNVML:
    """pynvml's calls that fingerprint.py makes, for a 4-GPU box whose GPU 0 has NVLink 2 up."""

    def __init__(self):
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetNvLinkState(self, handle, link):
        return 1 if (handle, link) == (0, 2) else 0

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"


def test_machine_class_and_driver_read_through_nvml(monkeypatch):
    from pytest_distperf.launch import fingerprint

    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert fingerprint.machine_class("cuda", 2).name == "cuda-nvidia-h200-2gpu-nvlink-1node-ws2"
    assert devices.visible_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,3")  # GPU 1 has no NVLink up
    assert fingerprint.machine_class("cuda", 3).name == "cuda-nvidia-h200-3gpu-pcie-1node-ws3"
    assert fingerprint._driver_version() == "580.95.05"
    assert fake.initialised == 0  # every nvmlInit was shut down
