"""What the fixture needs to build jobs on a user's code: factories named by module and qualified name (every rank
imports them; the pytest process imports them once to fail here, naming the test), strategies resolved through the
registry, the launch choice. Every error is a UsageError whose message starts with the test's node id.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from typing import Any, Callable, Iterator

from pytest_distperf.errors import UsageError, WorkloadError
from pytest_distperf.spec import profiles
from pytest_distperf.spec.job import FunctionRef, ScriptRef, file_sha256


@contextlib.contextmanager
def naming(nodeid: str) -> Iterator[None]:
    """Prefix a usage error raised inside with the test's node id (the same error: type and attributes kept)."""
    __tracebackhide__ = True  # the test's call is the error's place
    try:
        yield
    except UsageError as e:
        if not str(e).startswith(nodeid):
            e.args = (f"{nodeid}: {e}",)
        raise  # the same error: contextlib gives back its own traceback, without this frame and contextlib's


def hides_usage_error(excinfo: Any) -> bool:
    """A __tracebackhide__ for the checks of the user's arguments: their usage errors point at the test's call, any
    other error keeps the frame."""
    return excinfo.errisinstance(UsageError)


def function_ref(obj: Callable[..., Any] | str, where: str, kind: str) -> FunctionRef:
    """A module-level function, or "module:qualname", as a FunctionRef the ranks resolve; checked here."""
    if isinstance(obj, str):
        module_name, sep, qualname = obj.partition(":")
        if not sep or not module_name or not qualname:
            raise WorkloadError(f"{where}: expected 'module:function' (e.g. 'mypkg.bench:make_workload') or the "
                                f"function itself, got {obj!r}")
        target, module = _resolve(obj, kind)
        if not callable(target):
            raise WorkloadError(f"{kind} {obj!r} is not callable")
        return FunctionRef(module=module_name, qualname=qualname, file=_source_file(target, module))
    if not callable(obj):
        raise WorkloadError(f"{where}: expected a module-level function or 'module:function', got {obj!r}")
    qualname = getattr(obj, "__qualname__", "")
    if "<locals>" in qualname or getattr(obj, "__name__", "") == "<lambda>" or not qualname:
        raise WorkloadError(f"{where} needs a module-level function (ranks import it by name); {qualname or obj!r} "
                            f"is not")
    return FunctionRef(module=obj.__module__, qualname=qualname, file=_source_file(obj, None))


def _resolve(obj: str, kind: str) -> tuple[Any, Any]:
    """What "module:qualname" names, and its module; WorkloadError naming the `kind` of function where it cannot."""
    module_name, _, qualname = obj.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise WorkloadError(f"{kind} {obj!r} cannot be imported: {e}") from None
    target: Any = module
    for part in qualname.split("."):
        if not hasattr(target, part):
            raise WorkloadError(f"{kind} {obj!r}: module {module_name} has no attribute {qualname!r}")
        target = getattr(target, part)
    return target, module


def check_call(obj: Callable[..., Any] | str, args: tuple, kwargs: dict[str, Any], kind: str, given: str) -> None:
    """Bind the arguments the ranks will call a factory with to its signature here: a wrong keyword fails naming
    the factory's parameters before any rank starts. `given` says where they came from, e.g. 'workload_kwargs'."""
    target = _resolve(obj, kind)[0] if isinstance(obj, str) else obj
    name = obj if isinstance(obj, str) else f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', obj)}"
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: the ranks will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        params = list(signature.parameters.values())
        names = ", ".join(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)) or "none"
        takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
        keyword_ok = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        unknown = [k for k in kwargs if k not in keyword_ok] if not takes_any else []
        if unknown:
            what = (f"has no parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                    f"(given in {given})")
        else:
            what = f"cannot be called with {given}: {e}"
        raise WorkloadError(f"{kind} {name} {what}; its parameters are: {names}") from None


def _source_file(obj: Any, module: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return getattr(module, "__file__", None)


def strategy_fields(strategy: str, full_options: dict[str, Any], launch: str, where: str) -> dict[str, Any]:
    """The JobSpec fields the ranks need about a strategy: adapter module, full options, launch profile."""
    from pytest_distperf import strategies

    record = strategies.REGISTRY.get(strategy)
    return dict(adapter=record.adapter, full_options=full_options, **launch_fields(launch, record.user_launch, where))


def launch_fields(launch: str, user_launch: str, where: str) -> dict[str, str]:
    launch = profiles.check_choice(launch, f"{where}(launch=...)")
    return dict(launch=launch, launch_profile=profiles.resolve(launch, user_launch).name)


def check_step_arguments(args: Any, kwargs: Any, where: str) -> tuple[tuple, dict[str, Any]]:
    if not isinstance(args, tuple):
        raise UsageError(f"{where}(args=...) must be a tuple of the factory's positional arguments, got "
                         f"{type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UsageError(f"{where}(kwargs=...) must be a dict, got {type(kwargs).__name__}")
    return args, dict(kwargs or {})


def strategy_options(strategy: str, options: dict[str, Any] | None) -> dict[str, Any]:
    if options is not None and not isinstance(options, dict):
        raise UsageError(f"distperf.job({strategy!r}, options=...): expected a dict, got {type(options).__name__}")
    return dict(options or {})


def script_ref(script: Any, args: Any, launcher: str, env: Any, cwd: Any, device: str,
               root: str | None = None) -> ScriptRef:
    """A script job's script, checked here, named relative to the project's root (the folder the baselines folder
    starts from, the working folder by default): the same name in every checkout, from whichever folder pytest
    runs. A relative script or `cwd` is found from that root too, so the path and the name agree."""
    import os

    __tracebackhide__ = hides_usage_error
    where = "distperf.script_job"
    root = os.path.abspath(root or os.getcwd())
    path = os.path.normpath(os.path.join(root, os.fspath(script)))  # an absolute script stays as it is
    if not os.path.isfile(path):
        raise UsageError(f"{where}({os.fspath(script)!r}): no such file ({path}; a relative path is found from the "
                         f"project root, {root})")
    if launcher not in profiles.SCRIPT_LAUNCHERS:
        raise UsageError(f"{where}(launcher={launcher!r}) is not one of "
                         f"{', '.join(map(repr, profiles.SCRIPT_LAUNCHERS))}")
    if launcher == "deepspeed" and device != "cuda":
        raise UsageError(f"{where}(launcher='deepspeed') counts GPUs, and this test runs on {device}: run the "
                         f"script with launcher='torchrun' there (DeepSpeed's engine runs under torchrun too)")
    if not isinstance(args, (tuple, list)) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"{where}(args=...) must be a tuple of strings, as on the command line, got {args!r}")
    if env is not None and (not isinstance(env, dict)
                            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise UsageError(f"{where}(env=...) must be a dict of strings, got {env!r}")
    folder = os.path.normpath(os.path.join(root, os.fspath(cwd))) if cwd is not None else None
    if folder is not None and not os.path.isdir(folder):
        raise UsageError(f"{where}(cwd={os.fspath(cwd)!r}): no such folder ({folder}; a relative path is found from "
                         f"the project root)")
    name = os.path.relpath(path, root)
    name = path if name.startswith("..") else name
    return ScriptRef(path=path, name=name, args=tuple(args), launcher=launcher,
                     env=tuple(sorted((env or {}).items())), cwd=folder,
                     sha256=file_sha256(path))
