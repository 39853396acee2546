"""csi/paths.py: only absolute, normalised paths strictly under an allowed root pass, once every
symbolic link in them is followed; a path that is a link is refused; creating and removing at a checked
path follows no link planted since the check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from csi import publishing
from csi.failures import InvalidParameterError
from csi.mount import Mounter
from csi.paths import (
    check_path,
    check_reaches,
    found_parent,
    made_parent,
    make_dirs,
    recheck,
    under_roots,
    with_resolved,
)
from tests.fake_runner import FakeRunner

ROOTS = ("/var/lib/kubelet", "/srv/csi")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/var/lib/kubelet/pods/uid/volumes/x/mount", id="kubelet-pod-path"),
        pytest.param("/srv/csi/staging", id="extra-prefix"),
        pytest.param("/var/lib/kubelet/plugins/a b/globalmount", id="space-in-name"),
    ],
)
def test_accepted(path: str) -> None:
    assert check_path(path, "target_path", ROOTS) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        pytest.param("", "required", id="empty"),
        pytest.param("var/lib/kubelet/x", "absolute", id="relative"),
        pytest.param("some/path", "absolute", id="relative-short"),
        pytest.param("/var/lib/kubelet/../../etc", "'..'", id="dotdot"),
        pytest.param("/var/lib/kubelet/x/..", "'..'", id="trailing-dotdot"),
        pytest.param("/var/lib/kubelet/./x", "normalised", id="dot"),
        pytest.param("/var/lib/kubelet//x", "normalised", id="double-slash"),
        pytest.param("/var/lib/kubelet/x/", "normalised", id="trailing-slash"),
        pytest.param("/etc/passwd", "outside", id="outside-roots"),
        pytest.param("/var/lib/kubelet", "outside", id="root-itself"),
        pytest.param("/var/lib/kubeletx/y", "outside", id="sibling-prefix"),
        pytest.param("/var/lib/kubelet/x\n", "control", id="newline"),
        pytest.param("/var/lib/kubelet/x\x00y", "control", id="nul"),
        pytest.param("/var/lib/kubelet/" + "a" * 5000, "longer", id="too-long"),
    ],
)
def test_rejected(path: str, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        check_path(path, "target_path", ROOTS)


# ---------------------------------------------------------------------------- symbolic links


class Tree(NamedTuple):
    """A kubelet dir reached through a symlinked parent (`var` -> `elsewhere`, as /var/lib on some
    distros), with links under it that lead out of it (the audit's cases A-E) or stay inside."""

    tmp: Path
    kubelet: str  # as configured: through the `var` link
    real: str  # the kubelet dir resolved
    outside: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    (tmp_path / "elsewhere" / "lib" / "kubelet").mkdir(parents=True)
    (tmp_path / "var").symlink_to(tmp_path / "elsewhere")
    outside = tmp_path / "outside"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "passwd").write_text("root:x:0:0\n")
    (outside / "victimdir").mkdir()
    k = tmp_path / "var" / "lib" / "kubelet"
    for sub in ("plugins/a", "pods/real"):
        (k / sub).mkdir(parents=True)
    (k / "plugins" / "a" / "globalmount").symlink_to(outside / "etc")
    (k / "plugins" / "b").symlink_to(outside)
    (k / "pods" / "evil").symlink_to(outside)
    (k / "pods" / "alias").symlink_to(k / "pods" / "real")
    (k / "pods" / "leaf").symlink_to(k / "pods" / "real")
    (k / "pods" / "loop").symlink_to(k / "pods" / "loop")
    (k / "pods" / "dangling").symlink_to(tmp_path / "nowhere")
    return Tree(tmp_path, str(k), str(tmp_path.resolve() / "elsewhere" / "lib" / "kubelet"), outside)


@pytest.mark.parametrize(
    ("path", "resolved"),
    [
        pytest.param("pods/real/mount", "pods/real/mount", id="root-reached-through-a-link"),
        pytest.param("pods/alias/mount", "pods/real/mount", id="link-that-stays-inside"),
        pytest.param("pods/new/volumes/mount", "pods/new/volumes/mount", id="missing-directories"),
    ],
)
def test_accepted_paths_come_back_resolved(tree: Tree, path: str, resolved: str) -> None:
    """The node acts on the resolved path, the form the mount table shows."""
    assert check_path(f"{tree.kubelet}/{path}", "target_path", (tree.kubelet,)) == f"{tree.real}/{resolved}"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        pytest.param("plugins/a/globalmount", "is a symbolic link", id="A-staging-is-a-link-to-outside-etc"),
        pytest.param("plugins/b/newdir", "resolves to .*outside", id="B-staging-under-a-linked-parent"),
        pytest.param("pods/evil/etc", "resolves to .*outside", id="C-target-over-outside-etc"),
        pytest.param("pods/evil/created/mount", "resolves to .*outside", id="C2-target-created-outside"),
        pytest.param("pods/evil/victimdir", "resolves to .*outside", id="D-target-removed-outside"),
        pytest.param("pods/evil/blk", "resolves to .*outside", id="E-block-target-outside"),
        pytest.param("pods/leaf", "is a symbolic link", id="link-inside-the-root"),
        pytest.param("pods/loop/mount", "does not resolve", id="link-loop"),
        pytest.param("pods/dangling/mount", "resolves to .*nowhere", id="dangling-link-out"),
    ],
)
def test_links_that_lead_out_or_are_the_path_are_refused(tree: Tree, path: str, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        check_path(f"{tree.kubelet}/{path}", "target_path", (tree.kubelet,))


def test_the_resolved_roots_are_matched_too(tree: Tree) -> None:
    """The mount table names mount points resolved; with_resolved lets both forms match."""
    roots = with_resolved((tree.kubelet,))
    assert roots == (tree.kubelet, tree.real)
    assert under_roots(f"{tree.real}/pods/real/mount", roots)
    assert check_path(f"{tree.real}/pods/real/mount", "target_path", roots) == f"{tree.real}/pods/real/mount"


# ---------------------------------------------------------------------------- a link planted after the check


def _swap_for_link(directory: Path, to: Path) -> None:
    """What a racing writer does: the directory moves away and a symlink takes its name."""
    directory.rename(directory.with_name(directory.name + ".moved"))
    directory.symlink_to(to)


def _make_dirs(target: str, roots: tuple[str, ...]) -> None:
    make_dirs(target, roots)


def _create_target(target: str, roots: tuple[str, ...]) -> None:
    with made_parent(target, roots) as parent:
        publishing._create_target(parent, target, block=True)


def _remove_target(target: str, roots: tuple[str, ...]) -> None:
    with found_parent(target, roots) as parent:
        assert parent is not None
        publishing._remove_target(parent, target)


def _recheck(target: str, roots: tuple[str, ...]) -> None:
    recheck(target, roots)


@pytest.mark.parametrize(
    ("act", "name"),
    [
        pytest.param(_make_dirs, "newdir", id="staging-directory-created"),
        pytest.param(_create_target, "blk", id="block-target-file-created"),
        pytest.param(_remove_target, "victimdir", id="target-removed"),
        pytest.param(_recheck, "etc", id="unmount-or-bind-rechecked"),
    ],
)
def test_a_link_planted_after_the_check_redirects_nothing(
    tree: Tree, act: Callable[[str, tuple[str, ...]], None], name: str
) -> None:
    """Checked, then a parent is swapped for a link to outside/: the act refuses, outside/ unchanged."""
    roots = (tree.kubelet,)
    target = check_path(f"{tree.kubelet}/pods/real/{name}", "target_path", roots)
    before = sorted(str(p) for p in tree.outside.rglob("*"))
    _swap_for_link(Path(tree.real) / "pods" / "real", tree.outside)
    with pytest.raises(InvalidParameterError, match="symbolic link"):
        act(target, roots)
    assert sorted(str(p) for p in tree.outside.rglob("*")) == before


def test_a_target_swapped_after_it_was_created_is_not_bound(tree: Tree) -> None:
    """check_reaches, right before the bind: the path no longer leads to the directory the walk holds."""
    roots = (tree.kubelet,)
    target = check_path(f"{tree.kubelet}/pods/real/volumes/mount", "target_path", roots)
    with made_parent(target, roots) as parent:
        assert publishing._create_target(parent, target, block=False)
        check_reaches(target, parent)
        _swap_for_link(Path(tree.real) / "pods" / "real" / "volumes", tree.outside)
        with pytest.raises(InvalidParameterError, match="symbolic link"):
            check_reaches(target, parent)


def test_publish_binds_nothing_when_a_link_is_planted_after_the_target_was_made(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publisher.publish re-checks right before binding: the race lands between creating the target
    and binding it; nothing is mounted and the target it created is removed (where it really is)."""
    roots = (tree.kubelet,)
    target = check_path(f"{tree.kubelet}/pods/real/volumes/blk", "target_path", roots)
    volumes = Path(tree.real) / "pods" / "real" / "volumes"
    create = publishing._create_target

    def racing(parent: int, path: str, block: bool) -> bool:
        created = create(parent, path, block)
        _swap_for_link(volumes, tree.outside)
        return created

    monkeypatch.setattr(publishing, "_create_target", racing)
    mountinfo = tree.tmp / "mountinfo"
    mountinfo.write_text("1 0 254:0 / / rw - ext4 /dev/vda rw\n")
    runner = FakeRunner()
    publisher = publishing.Publisher(Mounter(runner, syscalls=False, mountinfo_path=str(mountinfo)), roots)
    pub = publishing.Publication(f"{tree.real}/plugins/s", target, True, False, [], False)
    with pytest.raises(InvalidParameterError, match="symbolic link"):
        publisher.publish("v", publishing.Source("/dev/loop7", (7, 7), "/loop7"), pub)
    assert "mount" not in runner.programs()
    assert not (tree.outside / "blk").exists()
    assert list(volumes.with_name("volumes.moved").iterdir()) == []
