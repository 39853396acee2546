"""Driver configuration: flags with environment fallbacks, grouped by the part of the driver they steer.

`parse_args(argv)` builds a frozen Config or exits 2 with a message naming the offending flag (and its
environment variable when that gave the value: csi/envflags.py checks those exactly like the flag).
Nothing here touches the filesystem or network; `Config.validate()` checks values only.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from csi import backend_registry as registry
from csi import flagtypes
from csi.commands import add_subcommands
from csi.envflags import EnvArgumentParser, EnvDefault

MODES = ("all", "controller", "node")
DEFAULT_ENDPOINT = "unix:///run/csi/socket.sock"


@functools.cache
def version() -> str:
    """The installed package version (from package metadata; read once, on first use)."""
    from importlib import metadata

    try:
        return metadata.version("ballast-csi")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


class ServerConfig(NamedTuple):
    mode: str = "all"
    endpoint: str = DEFAULT_ENDPOINT
    workers: int = 16
    metrics_address: str = ""
    log_format: str = "text"
    log_level: str = "info"
    snapshot_metadata_block_type: str = "variable"  # or "fixed"
    snapshot_metadata_block_size: int = 0  # 0: the backend's own granularity


class BackendConfig(NamedTuple):
    name: str = "local"
    driver_name: str = registry.BUILTIN["local"].driver_name
    data_dir: str = "/var/lib/ballast"
    zone: str = "local"
    region: str = ""
    capacity_bytes: int = 0  # 0: no limit beyond the data-dir filesystem
    aws_region: str = ""
    aws_endpoint_url: str = ""
    aws_describe_batch_window: float = 0.0  # seconds; 0: every Describe lookup is its own call
    aws_extra_tags: Mapping[str, str] = MappingProxyType({})  # on every volume and snapshot made
    aws_k8s_tag_cluster_id: str = ""  # "": no cluster tags
    aws_warn_on_invalid_tag: bool = False  # a class's tag that cannot be made: left off with a warning


class NodeConfig(NamedTuple):
    node_id: str = ""
    node_name: str = ""  # Kubernetes Node name, for the startup taint; empty: not handled
    max_volumes_per_node: int = 0  # 0: backend default
    kubelet_dir: str = "/var/lib/kubelet"
    allowed_path_prefixes: tuple[str, ...] = ()
    format_concurrency: int = 2

    @property
    def allowed_roots(self) -> tuple[str, ...]:
        """Directories under which staging and target paths may live."""
        return (self.kubelet_dir, *self.allowed_path_prefixes)


class Config(NamedTuple):
    server: ServerConfig = ServerConfig()
    backend: BackendConfig = BackendConfig()
    node: NodeConfig = NodeConfig()

    @property
    def runs_controller(self) -> bool:
        return self.server.mode in ("all", "controller")

    @property
    def runs_node(self) -> bool:
        return self.server.mode in ("all", "node")


class _VersionAction(argparse.Action):
    """--version, reading package metadata only when asked (it costs start-up time otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"ballast-csi {version()}")
        parser.exit()


def _backend(text: str) -> str:
    try:
        return registry.check_name(text)
    except registry.UnknownBackend as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The `ballast-csi` command line; each flag documents its environment fallback."""
    p = EnvArgumentParser(
        prog="ballast-csi",
        description="Ballast CSI driver (CSI v1.13): Identity, Controller, Node and SnapshotMetadata over a "
        "unix socket.",
    )
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    _server_flags(p.add_argument_group("server"))
    _backend_flags(p.add_argument_group("backend"))
    _node_flags(p.add_argument_group("node"))
    _metadata_flags(p.add_argument_group("snapshot metadata"))
    add_subcommands(p)
    return p


def _server_flags(srv: argparse._ArgumentGroup) -> None:
    srv.add_argument(
        "--mode",
        choices=MODES,
        default=EnvDefault("BALLAST_MODE", "all"),
        help="services to serve: all, controller or node [BALLAST_MODE] (default: all)",
    )
    srv.add_argument(
        "--endpoint",
        type=flagtypes.endpoint,
        default=EnvDefault("CSI_ENDPOINT", DEFAULT_ENDPOINT),
        help=f"gRPC endpoint, unix:///path.sock or loopback tcp:// [CSI_ENDPOINT] "
        f"(default: {DEFAULT_ENDPOINT})",
    )
    srv.add_argument(
        "--workers",
        type=flagtypes.positive,
        default=EnvDefault("BALLAST_WORKERS", "16"),
        help="gRPC worker threads [BALLAST_WORKERS] (default: 16)",
    )
    srv.add_argument(
        "--metrics-address",
        type=flagtypes.listen_address,
        default=EnvDefault("BALLAST_METRICS_ADDRESS", ""),
        help="host:port serving /metrics and /healthz; empty disables [BALLAST_METRICS_ADDRESS]",
    )
    srv.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=EnvDefault("BALLAST_LOG_FORMAT", "text"),
        help="log line format [BALLAST_LOG_FORMAT] (default: text)",
    )
    srv.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=EnvDefault("BALLAST_LOG_LEVEL", "info"),
        help="log level [BALLAST_LOG_LEVEL] (default: info)",
    )


def _backend_flags(be: argparse._ArgumentGroup) -> None:
    be.add_argument(
        "--backend",
        type=_backend,
        default=EnvDefault("BALLAST_BACKEND", "local"),
        help="cloud backend: local, aws, or one an installed package provides through the "
        f"'{registry.ENTRY_POINT_GROUP}' entry-point group [BALLAST_BACKEND] (default: local)",
    )
    be.add_argument(
        "--driver-name",
        type=flagtypes.driver_name,
        default=EnvDefault("BALLAST_DRIVER_NAME", ""),
        help="CSI driver name [BALLAST_DRIVER_NAME] (default per backend: "
        + ", ".join(f"{k}: {v.driver_name}" for k, v in registry.BUILTIN.items())
        + "; others: the backend's own)",
    )
    be.add_argument(
        "--data-dir",
        type=flagtypes.absolute,
        default=EnvDefault("BALLAST_DATA_DIR", "/var/lib/ballast"),
        help="local backend: volume files and state database [BALLAST_DATA_DIR] (default: /var/lib/ballast)",
    )
    be.add_argument(
        "--zone",
        type=flagtypes.zone,
        default=EnvDefault("BALLAST_ZONE", "local"),
        help="local backend: topology zone of this data dir [BALLAST_ZONE] (default: local)",
    )
    be.add_argument(
        "--region",
        type=flagtypes.label_value,
        default=EnvDefault("BALLAST_REGION", ""),
        help="local backend: optional topology region [BALLAST_REGION]",
    )
    be.add_argument(
        "--capacity",
        type=flagtypes.size,
        default=EnvDefault("BALLAST_CAPACITY", "0"),
        help="local backend: upper bound on the sizes of all volumes together, e.g. 100Gi; 0 = none "
        "(each volume must still fit in the data dir's free space) [BALLAST_CAPACITY]",
    )
    _aws_flags(be)


def _aws_flags(be: argparse._ArgumentGroup) -> None:
    be.add_argument(
        "--aws-region",
        type=flagtypes.aws_region,
        default=EnvDefault("AWS_REGION", ""),
        help="aws backend: region; empty = from instance metadata [AWS_REGION]",
    )
    be.add_argument(
        "--aws-endpoint-url",
        type=flagtypes.url,
        default=EnvDefault("AWS_ENDPOINT_URL_EC2", ""),
        help="aws backend: EC2 endpoint override (tests, private endpoints) [AWS_ENDPOINT_URL_EC2]",
    )
    be.add_argument(
        "--aws-describe-batch-window",
        type=flagtypes.batch_window,
        default=EnvDefault("BALLAST_AWS_DESCRIBE_BATCH_WINDOW", "0"),
        help="aws backend: seconds (0 to 0.5) concurrent Describe lookups of volumes and instances wait to "
        "share one EC2 call; 0 = off [BALLAST_AWS_DESCRIBE_BATCH_WINDOW] (default: 0)",
    )
    be.add_argument(
        "--aws-extra-tags",
        type=flagtypes.key_values,
        default=EnvDefault("BALLAST_AWS_EXTRA_TAGS", ""),
        help="aws backend: key=value,... tags for every volume and snapshot it makes; a class's "
        "tagSpecification_<n> wins [BALLAST_AWS_EXTRA_TAGS]",
    )
    be.add_argument(
        "--aws-k8s-tag-cluster-id",
        default=EnvDefault("BALLAST_AWS_K8S_TAG_CLUSTER_ID", ""),
        help="aws backend: cluster id X; volumes and snapshots get kubernetes.io/cluster/X=owned, "
        "Name=X-dynamic-<name> and (volumes) KubernetesCluster=X; empty = none "
        "[BALLAST_AWS_K8S_TAG_CLUSTER_ID]",
    )
    be.add_argument(
        "--aws-warn-on-invalid-tag",
        nargs="?",
        const="true",
        choices=("true", "false"),
        default=EnvDefault("BALLAST_AWS_WARN_ON_INVALID_TAG", "false"),
        help="aws backend: a class's tagSpecification_<n> with a reserved key or a template that cannot "
        "be rendered is left off with a warning instead of failing the request (a value without key= "
        "still fails) [BALLAST_AWS_WARN_ON_INVALID_TAG] (default: false)",
    )


def _metadata_flags(md: argparse._ArgumentGroup) -> None:
    md.add_argument(
        "--snapshot-metadata-block-type",
        choices=("variable", "fixed"),
        default=EnvDefault("BALLAST_SNAPSHOT_METADATA_BLOCK_TYPE", "variable"),
        help="how GetMetadataAllocated/GetMetadataDelta describe ranges: variable (merged ranges, "
        "VARIABLE_LENGTH) or fixed (one block per range, FIXED_LENGTH) "
        "[BALLAST_SNAPSHOT_METADATA_BLOCK_TYPE]",
    )
    md.add_argument(
        "--snapshot-metadata-block-size",
        type=flagtypes.block_size,
        default=EnvDefault("BALLAST_SNAPSHOT_METADATA_BLOCK_SIZE", "0"),
        help="block size of the changed-block metadata, a power of two from 4Ki to 1Mi; 0 = the backend's "
        "own (local: 64Ki, aws: 512Ki) [BALLAST_SNAPSHOT_METADATA_BLOCK_SIZE]",
    )


def _node_flags(nd: argparse._ArgumentGroup) -> None:
    nd.add_argument(
        "--node-id",
        type=flagtypes.node_id,
        default=EnvDefault("CSI_NODE_ID", ""),
        help="node id reported by NodeGetInfo [CSI_NODE_ID] (default: the host name; aws: instance id)",
    )
    nd.add_argument(
        "--node-name",
        default=EnvDefault("CSI_NODE_NAME", ""),
        help="Kubernetes Node this plugin serves; once registered it removes the startup taint "
        "<driver-name>/agent-not-ready from that Node; empty: leave taints alone [CSI_NODE_NAME]",
    )
    nd.add_argument(
        "--max-volumes-per-node",
        type=flagtypes.attach_limit,
        default=EnvDefault("BALLAST_MAX_VOLUMES_PER_NODE", "0"),
        help="attach limit per node; 0 = backend default [BALLAST_MAX_VOLUMES_PER_NODE]",
    )
    nd.add_argument(
        "--kubelet-dir",
        type=flagtypes.absolute,
        default=EnvDefault("BALLAST_KUBELET_DIR", "/var/lib/kubelet"),
        help="kubelet root; staging and target paths must be under it or an allowed prefix "
        "[BALLAST_KUBELET_DIR] (default: /var/lib/kubelet)",
    )
    nd.add_argument(
        "--allowed-path-prefix",
        action="append",
        type=flagtypes.absolute,
        default=EnvDefault("BALLAST_ALLOWED_PATH_PREFIXES", "", separator=":"),
        help="extra directory under which staging/target paths are allowed; repeatable "
        "[BALLAST_ALLOWED_PATH_PREFIXES, colon-separated]",
    )
    nd.add_argument(
        "--format-concurrency",
        type=flagtypes.positive,
        default=EnvDefault("BALLAST_FORMAT_CONCURRENCY", "2"),
        help="mkfs/fsck run at once on a node [BALLAST_FORMAT_CONCURRENCY] (default: 2)",
    )


def from_namespace(ns: argparse.Namespace) -> Config:
    """Build the frozen Config from parsed (already checked) flags."""
    driver_name = ns.driver_name or registry.default_driver_name(ns.backend)
    return Config(
        server=ServerConfig(
            mode=ns.mode,
            endpoint=ns.endpoint,
            workers=ns.workers,
            metrics_address=ns.metrics_address,
            log_format=ns.log_format,
            log_level=ns.log_level,
            snapshot_metadata_block_type=ns.snapshot_metadata_block_type,
            snapshot_metadata_block_size=ns.snapshot_metadata_block_size,
        ),
        backend=BackendConfig(
            name=ns.backend,
            driver_name=driver_name,
            data_dir=os.path.abspath(ns.data_dir),
            zone=ns.zone,
            region=ns.region,
            capacity_bytes=ns.capacity,
            aws_region=ns.aws_region,
            aws_endpoint_url=ns.aws_endpoint_url,
            aws_describe_batch_window=ns.aws_describe_batch_window,
            aws_extra_tags=ns.aws_extra_tags,
            aws_k8s_tag_cluster_id=ns.aws_k8s_tag_cluster_id,
            aws_warn_on_invalid_tag=ns.aws_warn_on_invalid_tag == "true",
        ),
        node=NodeConfig(
            node_id=ns.node_id or socket.gethostname(),
            node_name=ns.node_name,
            max_volumes_per_node=ns.max_volumes_per_node,
            kubelet_dir=ns.kubelet_dir,
            allowed_path_prefixes=tuple(ns.allowed_path_prefix),
            format_concurrency=ns.format_concurrency,
        ),
    )


def parse_args(argv: Sequence[str] | None = None) -> tuple[Config, argparse.Namespace]:
    """Parse the command line; exits 2 with a message naming the flag on bad input."""
    ns = build_parser().parse_args(argv)
    return from_namespace(ns), ns
