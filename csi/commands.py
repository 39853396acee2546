"""The subcommands of `ballast-csi` (the flags of the driver itself are in csi/config.py).

- `demo`: a full volume lifecycle on the local backend, each step printed (csi/demo.py);
- `recover-state`: rebuild a local data dir's state database from its files;
- `clear-health`: drop the DATA_LOSS marks of local volumes whose data an operator has checked;
- `snapshot-diff`: ask a running driver for the changed blocks between two snapshots (a client).
"""

from __future__ import annotations

import argparse

from csi import flagtypes


def add_subcommands(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run a full volume lifecycle on the local backend and print each step")
    demo.add_argument(
        "--data-dir",
        dest="demo_data_dir",
        default="",
        help="state and volume files for the demo (default: a temporary directory)",
    )
    demo.add_argument("--keep", action="store_true", help="keep the demo's data dir afterwards")
    recover = sub.add_parser(
        "recover-state",
        help="rebuild the local backend's state database from the volume and snapshot files in a data dir",
    )
    recover.add_argument(
        "--data-dir",
        dest="recover_data_dir",
        default="",
        help="the data dir to rebuild (default: the main --data-dir); stop every driver using it first",
    )
    clear = sub.add_parser(
        "clear-health",
        help="local backend: clear the DATA_LOSS health marks of volumes whose data you have checked "
        "(safe while the driver runs)",
    )
    clear.add_argument("volume_ids", nargs="+", metavar="VOLUME_ID", help="the volumes to clear")
    clear.add_argument(
        "--data-dir",
        dest="clear_data_dir",
        default="",
        help="the data dir of the volumes (default: the main --data-dir)",
    )
    _snapshot_diff(sub)


def _snapshot_diff(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    diff = sub.add_parser(
        "snapshot-diff",
        help="print the ranges that changed between two snapshots of a volume (GetMetadataDelta of a "
        "running driver)",
    )
    diff.add_argument("base", metavar="BASE", help="id of the earlier snapshot")
    diff.add_argument("target", metavar="TARGET", help="id of the later snapshot of the same volume")
    diff.add_argument(
        "--endpoint",
        dest="diff_endpoint",
        type=flagtypes.endpoint_or_default,
        default="",
        help="the driver's controller endpoint, unix:///path.sock (default: the main --endpoint)",
    )
    diff.add_argument("--output", choices=("table", "json"), default="table", help="table (default) or json")
    diff.add_argument(
        "--starting-offset",
        type=flagtypes.whole_number(flagtypes.INT64_MAX),
        default=0,
        help="resume from this byte offset (the end of the last range received); default 0",
    )
    diff.add_argument(
        "--max-results",
        type=flagtypes.whole_number(flagtypes.INT32_MAX),
        default=0,
        help="ranges per streamed message; 0 lets the driver choose",
    )
    diff.add_argument(
        "--secrets-file",
        default="",
        help="a JSON object of strings sent as the request's secrets (a file, so they stay out of the "
        "process list)",
    )
    diff.add_argument(
        "--timeout",
        type=flagtypes.seconds,
        default=600.0,
        help="seconds the whole stream may take (default 600)",
    )
