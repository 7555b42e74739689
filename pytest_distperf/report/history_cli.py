"""`python -m pytest_distperf history URL ...`: print (and render) the trend of each metric with its change points.

Exit status: 0; 1 when no series matches the filters (--test, --job, --metric, --machine-class: the message names
them), or the history holds none; 2 for a usage error, a history that cannot be read or an output that cannot be
written (the message names the argument).
"""

from __future__ import annotations

import argparse
import sys

from pytest_distperf.errors import FileError
from pytest_distperf.store.history import HistoryError, database_file, trends
from pytest_distperf.store.outputs import OutputPathError
from pytest_distperf.store.history.trend import Trend, render_text

URL_HELP = ("the history: a file path (history.db, /abs/path/history.db), sqlite:///relative/path.db or "
            "sqlite:////abs/path/history.db (SQLAlchemy's form: three slashes, then the path, so an absolute path "
            "has four; sqlite:///tmp/x.db is tmp/x.db under the current folder), or "
            "postgresql://user:password@host:port/db")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help=URL_HELP)
    parser.add_argument("--test", help="only tests whose node id contains this")
    parser.add_argument("--job", help="only jobs whose label contains this")
    parser.add_argument("--metric", help="only metrics whose name contains this (step_time, peak_memory, comms. ...)")
    parser.add_argument("--machine-class", help="only machine classes that contain this")
    parser.add_argument("--html", metavar="PATH", help="also write the trends as one self-contained HTML file")
    parser.add_argument("--json", metavar="PATH", help="also write the trends and change points as JSON")
    parser.add_argument("--points", action="store_true", help="list every session's value")
    parser.add_argument("--alpha", type=_probability, default=0.001,
                        help="t-test significance a change point needs (default 0.001)")
    parser.add_argument("--min-size", type=_at_least_two, default=3,
                        help="sessions needed on each side of a change point (default 3)")
    parser.add_argument("--min-change", type=_fraction, default=0.0,
                        help="also require |after/before - 1| >= this, e.g. 0.02 (default 0: significance alone)")


def run(args: argparse.Namespace) -> int:
    outputs = [(flag, path) for flag, path in (("--json", args.json), ("--html", args.html)) if path]
    try:
        _check_outputs(outputs, args.url)  # before the history is read and printed, not after
        found = trends(args.url, test=args.test, job=args.job, metric=args.metric, machine_class=args.machine_class,
                       alpha=args.alpha, min_size=args.min_size, min_change=args.min_change,
                       option="history URL")
    except (HistoryError, OutputPathError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not found:
        print(f"error: {_no_match(args)}", file=sys.stderr)
        return 1
    sys.stdout.write(render_text(found, points=args.points))
    for flag, path, write in (("--json", args.json, _write_json), ("--html", args.html, _write_html)):
        if not path:
            continue
        try:
            write(path, found)
        except FileError as e:  # the user's to fix (the message names the file): one line, not a traceback
            print(f"error: {flag}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
    return 0


FILTERS = (("--test", "test"), ("--job", "job"), ("--metric", "metric"), ("--machine-class", "machine_class"))


def _no_match(args: argparse.Namespace) -> str:
    """Why nothing is printed: the filters that matched nothing, or an empty history."""
    given = [f"{flag} {getattr(args, dest)!r}" for flag, dest in FILTERS if getattr(args, dest) is not None]
    if not given:
        return f"the history {args.url} holds no series (no session with measured jobs was recorded)"
    return (f"no series matches {' and '.join(given)} in the history {args.url} (each filter keeps the series "
            f"whose field contains it; run without it to list them all)")


def _check_outputs(outputs: list[tuple[str, str]], url: str) -> None:
    """Each output can be written as a file (as the pytest options' are checked), none over another or over the
    history database read: OutputPathError naming the option."""
    from pytest_distperf.store.outputs import check_apart, check_file

    for flag, path in outputs:
        check_file(path, flag)
    database = database_file(url, "history URL") if outputs else None
    check_apart(outputs, history=("history URL", database) if database else None)


def _write_json(path: str, found: list[Trend]) -> None:
    from pytest_distperf.fs.jsonio import write_json_atomic

    write_json_atomic(path, {"trends": [t.to_dict() for t in found]}, lock=False)  # one writer, as every report


def _write_html(path: str, found: list[Trend]) -> None:
    from pytest_distperf.report import html as report_html
    from pytest_distperf.report.charts import trend_series

    report_html.write_text(path, report_html.render_history(trend_series(found)))


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must lie between 0 and 1")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must not be negative")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text}: a t-test needs at least 2 sessions a side")
    return value
