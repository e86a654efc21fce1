"""`python -m harness view PATH [--out FILE] [--serve [--port N]]`: write the page for a
sweep or run folder, print where it is, and optionally serve its folder on 127.0.0.1."""

from __future__ import annotations

import argparse
import sys

import polars as pl
import pyarrow as pa

from harness.errors import HarnessError

USAGE_EPILOG = """examples:
  python -m harness view evidence/smoke                   # the sweep: evidence/smoke/view/index.html
  python -m harness view evidence/local/<run_id>          # one run: evidence/local/<run_id>/view/index.html
  python -m harness view evidence/smoke --out /tmp/smoke.html --serve --port 8765"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness view", epilog=USAGE_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="A static HTML page (no server needed, works offline) from a "
                                                 "sweep folder (evidence/<sweep>) or a run folder "
                                                 "(evidence/<sweep>/<run_id>).")
    parser.add_argument("path", help="evidence/<sweep> or evidence/<sweep>/<run_id>")
    parser.add_argument("--out", default=None, help="the page to write (default: PATH/view/index.html); a sweep's run "
                                                    "pages go to runs/ beside it")
    parser.add_argument("--serve", action="store_true", help="then serve the page's folder on 127.0.0.1 until Ctrl-C")
    parser.add_argument("--port", type=int, default=0, help="port for --serve (default 0: any free port)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: expected 0 to 65535")
    return args


def main(argv: list[str]) -> int:
    from harness.view.build import build

    args = parse_args(argv)
    try:
        written = build(args.path, args.out)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (pl.exceptions.PolarsError, pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        # evidence the checks did not foresee: still one line, never a traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: cannot build the page from {args.path}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2
    size = written.bytes / 2**20
    print(f"wrote {written.index} ({written.pages} page{'s' if written.pages > 1 else ''}, {size:.1f} MiB)")
    if not args.serve:
        return 0
    from harness.view.serve import make_server

    try:
        server = make_server(written.index.parent, args.port)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    port = server.server_address[1]
    print(f"serving {written.index.parent} at http://127.0.0.1:{port}/{written.index.name} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
