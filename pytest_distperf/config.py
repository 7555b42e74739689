"""Session settings (command line > ini > default) and each test's plan (marker > settings).

Plain logic over plain values, testable without pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.errors import SettingsError
from pytest_distperf.launch.devices import DEVICE_CHOICES, resolve_device

DEFAULTS: dict[str, Any] = {
    "device": "auto",
    "world_size": 2,
    "timeout": 900.0,
    "repeats": 3,
    "shape_cpu": "tiny",
    "shape_cuda": "1b",
}
MARKER_KEYS = ("world_size", "device", "timeout", "repeats",
               # baseline gate overrides, validated in regression.policy_for
               "time_threshold", "time_k", "memory_threshold", "memory_floor", "baseline_metrics",
               "probes",  # default probes of the test's jobs (pytest_distperf.probes)
               "known_gap")  # {"cpu"|"cuda": "upstream issue + measured value"}: a strict xfail there


@dataclass(frozen=True)
class Settings:
    enabled: bool
    device: str
    world_size: int
    timeout: float
    repeats: int
    shape_cpu: str
    shape_cuda: str
    keep_jobs: bool = False


@dataclass(frozen=True)
class TestPlan:
    device: str | None  # None: skipped, see skip_reason
    world_size: int
    timeout: float
    repeats: int
    skip_reason: str | None = None
    probes: tuple[str, ...] = ()  # distperf(probes=[...]): the default for every job the test builds
    known_gap: str | None = None  # on this device the check fails for a known upstream reason (strict xfail)

    def default_shape(self, settings: Settings) -> str:
        return settings.shape_cuda if self.device == "cuda" else settings.shape_cpu


def _positive(value: Any, kind: Callable[[Any], Any], where: str) -> Any:
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where}: expected a positive number, got {value!r}") from None
    if v <= 0:
        raise SettingsError(f"{where}: expected a positive number, got {value!r}")
    return v


def _device(value: Any, where: str) -> str:
    if value not in DEVICE_CHOICES:
        raise SettingsError(f"{where}: expected one of {', '.join(DEVICE_CHOICES)}, got {value!r}")
    return value


def build_settings(enabled: bool, cli: dict[str, Any], ini: dict[str, Any], keep_jobs: bool = False) -> Settings:
    """cli/ini map each setting name to a value or None (unset)."""

    def pick(name: str) -> tuple[Any, str]:
        flag = "--distperf-" + name.replace("_", "-")
        if cli.get(name) not in (None, ""):
            return cli[name], flag
        if ini.get(name) not in (None, ""):
            return ini[name], f"ini option distperf_{name}"
        return DEFAULTS[name], f"default distperf_{name}"

    device, where = pick("device")
    ws, ws_where = pick("world_size")
    timeout, t_where = pick("timeout")
    repeats, r_where = pick("repeats")
    shape_cpu, _ = pick("shape_cpu")
    shape_cuda, _ = pick("shape_cuda")
    return Settings(enabled=enabled, device=_device(device, where), world_size=_positive(ws, int, ws_where),
                    timeout=_positive(timeout, float, t_where), repeats=_positive(repeats, int, r_where),
                    shape_cpu=str(shape_cpu), shape_cuda=str(shape_cuda), keep_jobs=keep_jobs)


def plan_test(settings: Settings, marker_kwargs: dict[str, Any], gpus: int, where: str) -> TestPlan:
    unknown = sorted(set(marker_kwargs) - set(MARKER_KEYS))
    if unknown:
        raise SettingsError(f"{where}: @pytest.mark.distperf has no argument(s) {unknown}; "
                            f"it takes {', '.join(MARKER_KEYS)}")
    ws = _positive(marker_kwargs.get("world_size", settings.world_size), int, f"{where}: distperf(world_size=...)")
    timeout = _positive(marker_kwargs.get("timeout", settings.timeout), float, f"{where}: distperf(timeout=...)")
    repeats = _positive(marker_kwargs.get("repeats", settings.repeats), int, f"{where}: distperf(repeats=...)")
    marker_device = marker_kwargs.get("device")
    if marker_device is not None:
        _device(marker_device, f"{where}: distperf(device=...)")
    device, reason = resolve_device(settings.device, marker_device, ws, gpus)
    from pytest_distperf.probes import ProbeError, validate as validate_probes

    try:
        probes = validate_probes(marker_kwargs.get("probes"), f"{where}: distperf(probes=...)")
    except ProbeError as e:
        raise SettingsError(str(e)) from None
    gaps = marker_kwargs.get("known_gap") or {}
    if not isinstance(gaps, dict) or not all(k in ("cpu", "cuda") and isinstance(v, str) and v for k, v in gaps.items()):
        raise SettingsError(f"{where}: distperf(known_gap=...) must map 'cpu'/'cuda' to a non-empty reason "
                            f"(the upstream issue and the measured value), got {gaps!r}")
    return TestPlan(device=device, world_size=ws, timeout=timeout, repeats=repeats, skip_reason=reason,
                    probes=probes, known_gap=gaps.get(device) if device else None)
