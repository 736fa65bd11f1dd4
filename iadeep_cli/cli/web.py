"""`iadeep web`: the monitor as a read-only web page.

The server (``web/server.py``, the standard library's HTTP server) and the page
(``web/view.py``, its files under ``web/static/``) are imported inside the command only, so no
other command pays for them at start-up.
"""
from __future__ import annotations

import sys

import typer

from ..errors import InputError
from .root import app

DEFAULT_LISTEN = "127.0.0.1:8237"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); InputError when malformed."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InputError(f"--listen {text!r} is not HOST:PORT",
                         hint=f"e.g. --listen {DEFAULT_LISTEN} (port 0: any free port)")
    return host, int(port)


@app.command("web")
def web(listen: str = typer.Option(DEFAULT_LISTEN, "--listen", metavar="HOST:PORT",
                                   help="Address to serve on; the default serves only this "
                                        "machine (reach it through an SSH tunnel)."),
        host_name: list[str] = typer.Option([], "--host-name", metavar="NAME",
                                            help="Also answer requests addressed to NAME (the "
                                                 "name in the browser's address bar); IP "
                                                 "addresses and localhost always are, any "
                                                 "other name gets 421. Repeatable.")) -> None:
    """Serve the monitor as a read-only web page (nodes, GPUs, queue, impact, users)."""
    from ..web.server import serve

    host, port = parse_listen(listen)
    names = list(host_name)
    if host not in ("127.0.0.1", "localhost", "::1"):   # reached by this machine's name too
        import socket
        names += [socket.gethostname(), socket.getfqdn()]
    server = serve(host, port, tuple(names))
    real_host, real_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{real_host}]" if ":" in real_host else real_host
    print(f"serving http://{shown}:{real_port}/ (read-only; Ctrl-C stops)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print("note: anyone who can reach this address can read the queue and the cluster",
              file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
