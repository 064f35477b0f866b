"""python -m flagos_core info | routes [PATTERN] | ops | trace [--json] -- script.py args...

Shows the flagos setup and where each ATen overload goes. Errors print one
line on stderr and exit with status 2.
"""

import argparse
import contextlib
import fnmatch
import json
import os
import runpy
import sys
import traceback

import torch

import flagos_core
from flagos_core import _C, _conf

FALLBACK = _conf.FALLBACK


class CliError(Exception):
    pass


def table(rows, header=None):
    """Rows as aligned text lines; columns of whole numbers align right."""
    rows = [[str(cell) for cell in row] for row in rows]
    everything = ([list(header)] if header else []) + rows
    if not everything:
        return []
    widths = [max(len(row[i]) for row in everything) for i in range(len(everything[0]))]
    numeric = [bool(rows) and all(row[i].isdigit() for row in rows) for i in range(len(widths))]
    return [
        "  ".join(cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(row, widths, numeric)).rstrip()
        for row in everything
    ]


def show(lines):
    for line in lines:
        print(line)


def cmd_info(args):
    rt = flagos_core.runtime()
    plugins = flagos_core.plugins()
    rows = [
        ("torch", torch.__version__),
        ("flagos-core", flagos_core.__version__),
        ("runtime", f"{rt['name']} (from {rt['plugin']} {rt['version']})"),
        ("plugins", len(plugins) or "none"),
    ]
    rows += [(f"  {p.get('name', '?')}", _plugin_text(p)) for p in plugins]
    rows += [
        ("providers", ", ".join(flagos_core.providers())),
        ("devices", torch.flagos.device_count()),
    ]
    rows += [(f"  flagos:{i}", torch.flagos.get_device_name(i)) for i in range(torch.flagos.device_count())]
    show(table(rows))


def _plugin_text(plugin):
    """'0.1.0, loaded, runtime host' or '0.2.0, refused: why'."""
    parts = [str(plugin.get("version", "?"))]
    parts.append("loaded" if plugin.get("loaded") else f"refused: {plugin.get('reason') or 'unknown reason'}")
    if plugin.get("runtime"):
        parts.append(f"runtime {plugin['runtime']}")
    parts += plugin.get("problems") or []
    return ", ".join(parts)


def cmd_routes(args):
    names = sorted(name for name in _C._slot_names() if fnmatch.fnmatchcase(name, args.pattern))
    if not names:
        raise CliError(f"no overload matches {args.pattern!r}")
    show(table(((name, _C._route(name), _C._route_layer(name)) for name in names), ("overload", "provider", "layer")))


def cmd_ops(args):
    names = _C._slot_names()
    providers = flagos_core.providers()
    serves = {p: {name for name in names if _C._can_serve(name, p)} for p in providers}
    show(table(((p, len(serves[p])) for p in providers), ("provider", "can serve")))
    print(f"of {len(names)} routable overloads")
    others = set().union(*(serves[p] for p in providers if p != FALLBACK))
    only_fallback = sorted(serves.get(FALLBACK, set()) - others)
    unserved = [name for name in names if not any(name in s for s in serves.values())]
    print(f"\noverloads only {FALLBACK} serves (host round trip): {len(only_fallback) or 'none'}")
    show("  " + name for name in only_fallback)
    print(f"overloads no live provider serves: {len(unserved) or 'none'}")


def cmd_trace(args):
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise CliError("trace needs a script: python -m flagos_core trace [--json] -- script.py args...")
    script = argv[0]
    if not os.path.isfile(script):
        raise CliError(f"no such script: {script}")
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    # With --json, stdout carries only the report; the script prints to stderr.
    redirect = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    exit_code = 0
    with flagos_core.trace() as t, redirect:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:  # as the interpreter reads it: None is 0, a message is printed and is 1
            exit_code = e.code
            if exit_code is None:
                exit_code = 0
            elif not isinstance(exit_code, int):
                print(exit_code, file=sys.stderr)
                exit_code = 1
        except Exception:  # the script's own failure (a ConfError too): its traceback, as python would show it
            traceback.print_exc()
            return 1
    report = {
        "script": script,
        "args": argv[1:],
        "exit_code": exit_code,
        "providers": t.by_provider(),
        "calls": [
            {"overload": op, "provider": provider, "calls": calls}
            for (op, provider), calls in sorted(t.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "fallbacks": t.fallbacks,
    }
    show([json.dumps(report, indent=2)] if args.json else _trace_text(report, t))
    return exit_code


def _trace_text(report, t):
    lines = ["calls per provider"]
    lines += table(sorted(report["providers"].items(), key=lambda kv: -kv[1]), ("provider", "calls"))
    lines += ["", "calls per overload"]
    lines += table(((c["overload"], c["provider"], c["calls"]) for c in report["calls"]), ("overload", "provider", "calls"))
    fallbacks = [(op, t.counts[(op, FALLBACK)]) for op in report["fallbacks"]]
    lines += ["", f"through {FALLBACK} (copied to the host and back): {len(fallbacks) or 'none'}"]
    lines += ["  " + line for line in table(fallbacks, ("overload", "calls"))] if fallbacks else []
    return lines


def parser():
    p = argparse.ArgumentParser(prog="python -m flagos_core", description="Where each op of the flagos device goes.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="torch, runtime, plugins, providers, devices").set_defaults(run=cmd_info)
    routes = sub.add_parser("routes", help="provider and layer of each overload")
    routes.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern over overload names")
    routes.set_defaults(run=cmd_routes)
    sub.add_parser("ops", help="how many overloads each provider can serve").set_defaults(run=cmd_ops)
    trace = sub.add_parser("trace", help="run a script and count which provider served each call")
    trace.add_argument("--json", action="store_true", help="print the report as JSON")
    trace.add_argument("argv", nargs=argparse.REMAINDER, help="-- script.py args...")
    trace.set_defaults(run=cmd_trace)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_usage(sys.stderr)
        return 2
    try:
        if _conf.import_error is not None:
            raise _conf.import_error
        return args.run(args) or 0
    except (CliError, flagos_core.ConfError) as e:
        print(f"flagos: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `| head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
