"""The `ballast-csi` command: serve the driver (the default), or run one of its subcommands.

`main(argv)` parses the command line (csi/config.py, csi/commands.py), sets up logging and dispatches:
no subcommand -> csi.server.run; `demo` -> csi.demo; `recover-state` -> the local backend's recovery;
`clear-health` -> the local backend's health ledger; `snapshot-diff` -> csi.snapshot_diff (a client of a
running driver). Start-up failures end with one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Sequence

from csi import logs
from csi.config import parse_args

log = logging.getLogger("ballast.server")


def main(argv: Sequence[str] | None = None) -> int:
    config, ns = parse_args(argv)
    logs.setup(config.server.log_format, config.server.log_level)
    if ns.command is not None:
        gc.enable()  # only the server's start-up is worth holding collection off for
    if ns.command == "demo":
        from csi.demo import run_demo

        return run_demo(ns)
    if ns.command == "recover-state":
        from csi.backends.local.recovery import run_recover

        return run_recover(ns.recover_data_dir or config.backend.data_dir)
    if ns.command == "clear-health":
        from csi.backends.local.health import run_clear_health

        return run_clear_health(ns.clear_data_dir or config.backend.data_dir, ns.volume_ids)
    if ns.command == "snapshot-diff":
        from csi.snapshot_diff import run_snapshot_diff

        return run_snapshot_diff(ns, ns.diff_endpoint or config.server.endpoint)
    from csi.server import run

    try:
        return run(config)
    except SystemExit:
        raise
    except Exception as exc:
        log.error("start-up failed: %s", exc, exc_info=config.server.log_level == "debug")
        print(f"ballast-csi: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
