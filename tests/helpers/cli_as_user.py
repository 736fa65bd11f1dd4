"""`python tests/helpers/cli_as_user.py USER HOME ARGS...`: the real CLI as another account, in
this process, on this process's terminal (for a terminal multiplexer's pane: tmux runs it).

Other accounts cannot read the interpreter's files under /root, so everything the command needs
is imported first, as root; then the process becomes USER (groups, gid, uid: for good) and runs
`iadeep ARGS...` against the state directory HOME. Its stdin/stdout/stderr are the terminal
it was started on (the pane), which it keeps after dropping privileges."""
import os
import pwd
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.accounts import warm_cli

if __name__ == "__main__":
    user, home, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    warm_cli(*argv)   # lazy imports loaded (the command fails there: no controller)
    import termios  # noqa: F401  (what `run --pty` loads only once its job runs)
    import tty  # noqa: F401

    from iadeep_cli.cli import runpty  # noqa: F401
    from iadeep_cli.cli.main import main

    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user, IADEEP_HOME=home)
    os.chdir("/")
    sys.argv = ["iadeep", *argv]
    main()
