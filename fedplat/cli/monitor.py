"""``fedplat monitor``: the Streamlit monitor of a store, read-only.

The monitor shows what clients and peers wrote (names, messages, reasons), so it
is hardened like any page showing untrusted text (see docs/monitor.md,
"Security"): Streamlit runs with XSRF and CORS protection, a Host allow-list
against DNS rebinding, no file watcher, no developer toolbar and no error
details in the browser. Without a login it serves only on loopback unless
``--insecure-no-login`` says the operator means it.
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedplat.cli.common import CliError

#: Names a browser on this host uses for a loopback-bound monitor.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Binding to one of these serves every interface.
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")


def _die_with_parent() -> None:
    """In the Streamlit child: get SIGTERM when ``fedplat monitor`` dies.

    A monitor killed outright (SIGKILL, the OOM killer, a test's teardown) cannot
    forward a signal; without this its Streamlit server lives on as an orphan,
    holding the port. Linux only (prctl); elsewhere nothing changes.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def is_loopback(address: str) -> bool:
    """Whether binding ``address`` serves this host only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def allowed_hosts(address: str, extra: list[str]) -> list[str]:
    """``server.allowedHosts``: the Host names the WebSocket accepts.

    Loopback names, the bound address and ``--allowed-host`` names; an empty list
    (any Host) only for a wildcard bind without ``--allowed-host``, where the
    names browsers use cannot be guessed. A page on another site that rebinds its
    own name to this host's address is refused by this list.
    """
    if address in WILDCARD_ADDRESSES and not extra:
        return []
    hosts = [*LOOPBACK_HOSTS, *extra]
    if address not in WILDCARD_ADDRESSES:
        hosts.append(address.strip("[]"))
    return list(dict.fromkeys(hosts))


def _say(lines: list[str]) -> None:
    bar = "!" * 78
    print("\n".join([bar, *lines, bar]), file=sys.stderr, flush=True)


def check_bind(address: str, login: bool, insecure_no_login: bool) -> bool:
    """Whether to serve on ``address``; says loudly why not, or what it risks."""
    if is_loopback(address):
        return True
    where = address or "every interface"
    if not login and not insecure_no_login:
        _say(
            [
                f"fedplat: REFUSING to serve the monitor on {where} without a login.",
                "Anyone who reaches the port would read every run, client name "
                "and message in the store.",
                "Give --password-file FILE (see --hash-password), or keep the "
                "default --address 127.0.0.1",
                "behind a TLS reverse proxy (docs/monitor.md), or pass "
                "--insecure-no-login if something",
                "else guards the port (an authenticating proxy, a container "
                "published on loopback).",
            ]
        )
        return False
    if not login:
        _say(
            [
                f"fedplat: WARNING: the monitor serves {where} WITHOUT A LOGIN "
                "(--insecure-no-login).",
                "Anyone who reaches the port reads the whole store.",
            ]
        )
    else:
        print(
            "fedplat: the monitor serves plain HTTP: the password crosses the "
            "network in clear unless a TLS reverse proxy is in front "
            "(docs/monitor.md).",
            file=sys.stderr,
        )
    return True


def _password_file(args: argparse.Namespace) -> Path | None:
    """The validated password file, or ``None``; :class:`CliError` if bad."""
    from fedplat.ui import PASSWORD_FILE_ENV
    from fedplat.ui.auth import (
        PasswordFileError,
        load_password_file,
        readable_by_others,
    )

    given = args.password_file or os.environ.get(PASSWORD_FILE_ENV)
    if not given:
        return None
    path = Path(given).expanduser().resolve()
    try:
        load_password_file(path)
    except PasswordFileError as exc:
        raise CliError(str(exc)) from None
    if readable_by_others(path):
        print(
            f"fedplat: warning: {path} is readable by other users (chmod 600 it)",
            file=sys.stderr,
        )
    return path


def _known(options: dict[str, str]) -> dict[str, str]:
    """``options`` less those the installed Streamlit lacks (an unknown one
    would stop it at start), saying which protections that costs."""
    from streamlit import config

    known, missing = {}, []
    for key, value in options.items():
        try:
            config.get_option(key)
        except RuntimeError:
            missing.append(key)
        else:
            known[key] = value
    if missing:
        print(
            f"fedplat: warning: this Streamlit lacks {', '.join(missing)}; "
            "upgrade it for the monitor's full hardening (docs/monitor.md)",
            file=sys.stderr,
        )
    return known


def streamlit_command(args: argparse.Namespace, app: Path) -> list[str]:
    """The ``streamlit run`` command line, with every hardening option.

    Options on the command line outrank ``STREAMLIT_*`` variables and
    ``.streamlit/config.toml`` files, so a stray config cannot undo them.
    """
    cmd = [sys.executable, "-m", "streamlit", "run", str(app)]
    hosts = allowed_hosts(args.address, args.allowed_host)
    options: dict[str, str] = {
        "server.headless": "true",
        "server.address": args.address,
        "server.port": str(args.port),
        "browser.gatherUsageStats": "false",
        # A monitor is for watching runs: no Deploy button or developer menu,
        # whichever address the browser comes from.
        "client.toolbarMode": "viewer",
        # Exception types only: messages and tracebacks (paths, SQL, stored
        # text) go to this process's log, not to every viewer.
        "client.showErrorDetails": "type",
        "server.enableXsrfProtection": "true",
        "server.enableCORS": "true",
        "server.enableStaticServing": "false",
        "server.fileWatcherType": "none",
        "server.runOnSave": "false",
        "server.enableAgentApi": "false",
        "global.developmentMode": "false",
        # A list: given once per host below.
        "server.allowedHosts": "",
    }
    for key, value in _known(options).items():
        if key == "server.allowedHosts":
            for host in hosts:
                cmd += [f"--{key}", host]
        else:
            cmd += [f"--{key}", value]
    return cmd


def _store_problem(db: str) -> str | None:
    """Why ``db`` cannot be a store to watch, or ``None``: a SQLite file that does
    not exist (the page would only say so, and opening it would create an empty
    one). Server databases are not reached here: the page reports them."""
    from fedplat.ui import DB_ENV, sqlite_file

    try:
        path = sqlite_file(db)
    except Exception as exc:
        # Not the URL, nor the parser's message quoting it: it may hold a password.
        name = type(exc).__name__
        return f"cannot parse the database URL ({name}); check --db or ${DB_ENV}"
    if path is not None and not path.is_file():
        return (
            f"no store at {path}: the coordinator creates it when it starts "
            "(check the path given to --db)"
        )
    return None


def _print_hash() -> int:
    from fedplat.ui.auth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("Monitor password: ")
        if getpass.getpass("Again: ") != password:
            raise CliError("the passwords differ")
    else:
        password = sys.stdin.readline().strip()
    if not password:
        raise CliError("the password is empty")
    print(hash_password(password))
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    """Serve the Streamlit monitor (``fedplat.ui``) on a store, read-only."""
    import importlib.util

    if args.hash_password:
        return _print_hash()
    if importlib.util.find_spec("streamlit") is None:
        print(
            "fedplat: the monitor needs the ui extra: pip install 'fedplat[ui]'",
            file=sys.stderr,
        )
        return 2
    from fedplat.ui import (
        APP_PATH,
        DB_ENV,
        PASSWORD_FILE_ENV,
        REFRESH_ENV,
        display_url,
    )

    db = args.db or os.environ.get(DB_ENV)
    if not db:
        print(f"fedplat: give --db URL or set {DB_ENV}", file=sys.stderr)
        return 2
    problem = _store_problem(db)
    if problem is not None:
        print(f"fedplat: {problem}", file=sys.stderr)
        return 2
    password = _password_file(args)
    if not check_bind(args.address, password is not None, args.insecure_no_login):
        return 2
    # The URL travels in the environment, not argv: a PostgreSQL password would
    # otherwise be visible to every user through ps. So does the password file's
    # path (never the password).
    env = {**os.environ, DB_ENV: db, REFRESH_ENV: str(args.refresh)}
    env.pop(PASSWORD_FILE_ENV, None)
    if password is not None:
        env[PASSWORD_FILE_ENV] = str(password)
    proc = subprocess.Popen(
        streamlit_command(args, APP_PATH), env=env, preexec_fn=_die_with_parent
    )

    def _forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    login = "password" if password is not None else "no login"
    print(
        f"monitor on http://{args.address}:{args.port} (store {display_url(db)}, "
        f"{login})",
        flush=True,
    )
    return proc.wait()


def register(sub: Any) -> None:
    """Add ``fedplat monitor``."""
    m = sub.add_parser("monitor", help="web monitor of a store (Streamlit, read-only)")
    m.add_argument(
        "--db", help="store URL or SQLite path (default: $FEDPLAT_MONITOR_DB)"
    )
    m.add_argument("--port", type=int, default=8501, help="port to serve on")
    m.add_argument(
        "--address",
        default="127.0.0.1",
        help="interface to bind (default 127.0.0.1; any other needs "
        "--password-file or --insecure-no-login)",
    )
    m.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between live refreshes"
    )
    m.add_argument(
        "--password-file",
        metavar="FILE",
        help="ask every browser session for the password in FILE: the password "
        "or a line from --hash-password (default: $FEDPLAT_MONITOR_PASSWORD_FILE)",
    )
    m.add_argument(
        "--hash-password",
        action="store_true",
        help="read a password (prompt, or a line on stdin), print the line to "
        "put in a --password-file, and exit",
    )
    m.add_argument(
        "--insecure-no-login",
        action="store_true",
        help="serve a non-loopback --address without a login (something else "
        "must guard the port)",
    )
    m.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers use to reach the monitor (repeatable); "
        "others are refused, against DNS rebinding",
    )
    m.set_defaults(func=cmd_monitor)
