"""Which strategies exist: the built-in ones, a library's entry point in the group ``pytest_distperf.strategies``
(named as its import-light `Strategy`, docs/adapters.md) and `register()` calls, all through one record. A broken
entry point is a usage error when pytest starts with --distperf, naming it and its distribution.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pytest_distperf.errors import StrategyError

ENTRY_POINT_GROUP = "pytest_distperf.strategies"
COMMON_OPTIONS: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.01}
USER_LAUNCHES = ("torchrun", "deepspeed", "accelerate", "lightning")  # launch profiles (spec/profiles.py)


@dataclass(frozen=True)
class Strategy:
    name: str  # what tests pass to distperf.job()
    adapter: str  # the module the ranks import, with build(model, ctx, **options)
    options: Mapping[str, Any] = field(default_factory=dict)  # defaults; every strategy also takes COMMON_OPTIONS
    check: Callable[[dict[str, Any]], None] | None = None  # raises StrategyError for a bad value
    unsupported: Callable[[dict[str, Any], str], str | None] | None = None  # (options, device) -> why it is skipped
    user_launch: str = "torchrun"  # how its users start it: one of USER_LAUNCHES (launch="as_user")

    def defaults(self) -> dict[str, Any]:
        return {**COMMON_OPTIONS, **self.options}


def _check_strategy_record(s: Any, where: str) -> Strategy:
    if not isinstance(s, Strategy):
        raise StrategyError(f"{where} must be a pytest_distperf.strategies.registry.Strategy, "
                            f"got {type(s).__name__}")
    if not s.name.isidentifier():
        raise StrategyError(f"{where}: strategy name {s.name!r} must be an identifier")
    if not isinstance(s.adapter, str) or not s.adapter:
        raise StrategyError(f"{where}: Strategy.adapter must name the adapter module, got {s.adapter!r}")
    if not isinstance(s.options, Mapping):
        raise StrategyError(f"{where}: Strategy.options must map option names to defaults, got {s.options!r}")
    if s.user_launch not in USER_LAUNCHES:
        raise StrategyError(f"{where}: Strategy.user_launch={s.user_launch!r} is not one of {USER_LAUNCHES}")
    for hook in ("check", "unsupported"):
        if getattr(s, hook) is not None and not callable(getattr(s, hook)):
            raise StrategyError(f"{where}: Strategy.{hook} must be callable or None")
    try:
        found = importlib.util.find_spec(s.adapter) is not None
    except (ImportError, ValueError) as e:
        raise StrategyError(f"{where}: its adapter module {s.adapter!r} cannot be found: {e}") from None
    if not found:
        raise StrategyError(f"{where}: its adapter module {s.adapter!r} cannot be found on sys.path")
    return s


class Registry:
    """The strategies of this session: the built-in table, then entry points, then register() calls."""

    def __init__(self, builtin: dict[str, Strategy]):
        self.builtin = dict(builtin)
        self._registered: dict[str, tuple[Strategy, str]] = {}  # name -> (strategy, where it was registered)
        self._entry_points_loaded = False
        self._saved: list[tuple[dict[str, tuple[Strategy, str]], bool]] = []  # begin_session() .. end_session()

    def names(self) -> list[str]:
        self.load_entry_points()
        return sorted({*self.builtin, *self._registered})

    def get(self, name: str) -> Strategy:
        self.load_entry_points()
        found = self.builtin.get(name) or self._registered.get(name, (None, ""))[0]
        if found is None:
            raise StrategyError(f"unknown strategy {name!r}; known strategies: {', '.join(self.names())} "
                                f"(a library registers more through the entry-point group {ENTRY_POINT_GROUP!r})")
        return found

    def register(self, strategy: Strategy, origin: str = "register()") -> None:
        where = origin if origin.startswith("entry point") else f"strategy registered by {origin}"
        strategy = _check_strategy_record(strategy, where)
        if strategy.name in self.builtin:
            raise StrategyError(f"strategy {strategy.name!r} registered by {origin} would replace the built-in "
                                f"strategy of that name; choose another name")
        known, known_origin = self._registered.get(strategy.name, (strategy, origin))
        if known != strategy:
            raise StrategyError(f"strategy {strategy.name!r} registered by {origin} is already registered by "
                                f"{known_origin}")
        self._registered[strategy.name] = (strategy, origin)

    def unregister(self, name: str) -> None:
        self._registered.pop(name, None)

    def reset(self) -> None:
        """Forget every registration and read the entry points again on next use."""
        self._registered.clear()
        self._entry_points_loaded = False

    def begin_session(self) -> None:
        """A pytest session starts, before its conftests are imported: what was registered before (an outer
        in-process session) is set aside until end_session()."""
        self._saved.append((dict(self._registered), self._entry_points_loaded))
        self.reset()

    def end_session(self) -> None:
        if self._saved:
            self._registered, self._entry_points_loaded = self._saved.pop()

    def load_entry_points(self) -> None:
        """Load the group once; a broken entry point raises StrategyError naming it and its distribution."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            where = f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP!r}, distribution {dist})"
            try:
                obj = ep.load()
            except Exception as e:  # anything the library's import raises
                self._entry_points_loaded = False  # report it again next time, not silently drop it
                raise StrategyError(f"{where} cannot be loaded: {type(e).__name__}: {e}") from None
            try:
                if isinstance(obj, Strategy) and obj.name != ep.name:  # not a Strategy: register() says so
                    raise StrategyError(f"{where} names a Strategy called {obj.name!r}; the entry point's name "
                                        f"must be the strategy's name")
                self.register(obj, origin=where)
            except StrategyError:
                self._entry_points_loaded = False
                raise


def validate_options(strategy: Strategy, options: dict[str, Any]) -> dict[str, Any]:
    defaults = strategy.defaults()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise StrategyError(f"strategy {strategy.name!r} has no option(s) {', '.join(map(repr, unknown))}; "
                            f"its options are: {', '.join(sorted(defaults))}")
    merged = {**defaults, **options}
    if strategy.check:
        strategy.check(merged)
    return merged
