"""Pure parts of the gvisor backend: timeout victim selection and the OCI bundle."""

from __future__ import annotations

from pathlib import Path

from rollbox.backends.common.bundle import oci_config
from rollbox.backends.gvisor.backend import exec_victims
from rollbox.models import Limits

# (pid, ppid, command) as `runsc ps` lists them: 1 is the agent, 3 and 9 agent sessions.
PROCS = [
    (1, 0, "agent"),
    (2, 1, "sleep"),  # daemon left by an earlier, finished exec
    (3, 1, "agent"),  # session of the timed-out exec
    (4, 3, "sh"),  # the timed-out command
    (5, 4, "sleep"),  # its child
    (6, 1, "sleep"),  # a setsid daemon it started (re-parented to PID 1)
    (7, 6, "sleep"),  # that daemon's child
    (9, 1, "agent"),  # session of another running exec
    (10, 9, "python3"),  # that exec's command
    (11, 10, "sleep"),
]


def test_victims_are_the_tree_and_its_later_orphans() -> None:
    assert exec_victims(PROCS, 4, {10}) == [4, 5, 6, 7]


def test_other_running_execs_and_earlier_daemons_are_spared() -> None:
    victims = exec_victims(PROCS, 4, {10})
    assert not {1, 2, 3, 9, 10, 11} & set(victims)
    # Without knowing about the other exec, its tree is still not an orphan of ours.
    assert exec_victims(PROCS, 4, set()) == [4, 5, 6, 7]


def test_nothing_left_means_no_victims() -> None:
    assert exec_victims([(1, 0, "agent"), (2, 1, "sleep")], 4, set()) == []


def test_bundle_config() -> None:
    cfg = oci_config(
        rootfs=Path("/s/rootfs"),
        args=["/run/.rollbox/uds-listen", "/run/rollbox/agent.sock", "--", "agent"],
        hostname="box",
        limits=Limits(nofile=77),
        cgroups_path="/rollbox-abc/sbx-1",
        ro_binds={"/run/.rollbox/agent": Path("/h/agent")},
        rw_binds={"/run/rollbox": Path("/s/run")},
    )
    assert cfg["root"] == {"path": "/s/rootfs", "readonly": False}
    assert cfg["process"]["noNewPrivileges"] is True
    assert "CAP_SYS_ADMIN" not in cfg["process"]["capabilities"]["bounding"]
    assert "CAP_MKNOD" not in cfg["process"]["capabilities"]["bounding"]
    assert {"type": "RLIMIT_NOFILE", "hard": 77, "soft": 77} in cfg["process"]["rlimits"]
    assert cfg["linux"]["cgroupsPath"] == "/rollbox-abc/sbx-1"
    assert {"type": "network"} in cfg["linux"]["namespaces"]
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/run/.rollbox/agent"]["options"] == ["rbind", "ro"]
    assert mounts["/run/rollbox"]["source"] == "/s/run"
    assert mounts["/run"]["type"] == "tmpfs"  # runtime mount points never hit the upper
    joined = oci_config(
        rootfs=Path("/r"),
        args=["x"],
        hostname="h",
        limits=Limits(),
        cgroups_path=None,
        ro_binds={},
        rw_binds={},
        new_netns=False,
    )
    assert not any(n["type"] == "network" for n in joined["linux"]["namespaces"])
    assert "cgroupsPath" not in joined["linux"]


def test_gvisor_and_namespace_share_a_base_not_each_other() -> None:
    """Both backends are OverlayBackends with their own handle class; neither subclasses
    the other, each implements every abstract hook (so it can be instantiated), and the
    runtime start is the one hook they both define (no override detection, no bwrap or
    seccomp fields on gVisor)."""
    from rollbox.backends.common.overlay_backend import OverlayBackend
    from rollbox.backends.common.overlay_sandbox import OverlaySandbox
    from rollbox.backends.gvisor.backend import GVisorBackend, GVisorSandbox
    from rollbox.backends.namespace.backend import NamespaceBackend, NamespaceSandbox

    assert not issubclass(GVisorBackend, NamespaceBackend)
    assert not issubclass(GVisorSandbox, NamespaceSandbox)
    for be, sbx in ((GVisorBackend, GVisorSandbox), (NamespaceBackend, NamespaceSandbox)):
        assert issubclass(be, OverlayBackend) and issubclass(sbx, OverlaySandbox)
        assert be.sandbox_class is sbx
        assert not be.__abstractmethods__ and not sbx.__abstractmethods__, be
        assert "_start" in vars(be) and "exec" in vars(sbx), be
    assert "_bwrap" not in GVisorBackend.__init__.__code__.co_names
    assert "_seccomp" not in GVisorBackend.prepare.__code__.co_names
