"""The backend contract's door, registry, typed configs and the public API's shape
(issue 10 items 3, 5, 6) — what can be checked without root."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import TypeAdapter

from rollbox.backends import registry
from rollbox.backends.base import Backend, MemorySnapshots, memory_snapshots
from rollbox.backends.config import (
    ENV_OVERRIDES,
    BackendConfig,
    GVisorConfig,
    MicroVMConfig,
    NamespaceConfig,
    config_for,
    parse_config,
)
from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.errors import (
    CapabilityError,
    InvalidInputError,
    IsADirectoryInSandboxError,
    NotFoundError,
    PathEscapeError,
    RollboxError,
    SandboxFileNotFoundError,
    UnsupportedOperationError,
)
from rollbox.ids import new_id
from rollbox.models import Capabilities
from rollbox.sandbox import AsyncSandbox, Sandbox


def test_file_errors_are_builtin_file_errors_too() -> None:
    e = SandboxFileNotFoundError("no such file in the sandbox: /x")
    assert isinstance(e, FileNotFoundError) and isinstance(e, NotFoundError)
    assert isinstance(e, LookupError) and e.exit_code == 2
    assert str(e) == "no such file in the sandbox: /x"
    d = IsADirectoryInSandboxError("/etc is a directory in the sandbox")
    assert isinstance(d, IsADirectoryError) and isinstance(d, InvalidInputError)
    assert isinstance(PathEscapeError("x"), PermissionError)
    with pytest.raises(FileNotFoundError):
        raise e


def test_errors_carry_the_sandbox_once_set() -> None:
    e = RollboxError("boom")
    assert e.sandbox_id is None and e.backend is None
    e.on_sandbox("sbx-1", "namespace")
    e.on_sandbox("sbx-2", "gvisor")  # the first (innermost) sandbox is kept
    assert (e.sandbox_id, e.backend) == ("sbx-1", "namespace")


def test_unsupported_operation_names_backend_and_operation() -> None:
    e = UnsupportedOperationError("gvisor", "memory_snapshot", hint="use backend microvm")
    assert isinstance(e, CapabilityError) and e.exit_code == 2
    assert (e.backend, e.operation) == ("gvisor", "memory_snapshot")
    assert e.one_line() == (
        "backend 'gvisor' does not support memory_snapshot (use backend microvm)"
    )


def test_require_checks_every_capability(tmp_path: Path) -> None:
    class NoExtras(NamespaceBackend):
        name: ClassVar[str] = "test-noextras"
        capabilities: ClassVar[Capabilities] = Capabilities(
            snapshot=False, fork=False, pause=False, users=False
        )

    be = NoExtras(Home(tmp_path))
    for op in ("snapshot", "memory_snapshot", "fork", "pause", "users"):
        with pytest.raises(UnsupportedOperationError) as err:
            be.require(op)  # type: ignore[arg-type]
        assert err.value.operation == op and err.value.backend == "test-noextras"
    NamespaceBackend(Home(tmp_path)).require("fork")  # declared: no error
    with pytest.raises(UnsupportedOperationError):
        memory_snapshots(NamespaceBackend(Home(tmp_path)))


def test_memory_snapshots_interface_is_microvms(tmp_path: Path) -> None:
    vm = registry.backend_class("microvm")(Home(tmp_path))
    assert isinstance(vm, MemorySnapshots) and memory_snapshots(vm) is vm
    assert vm.list_snapshots() == []
    with pytest.raises(NotFoundError):
        vm.load_snapshot(new_id("snap"))


def test_destroy_by_id_is_in_the_contract_on_every_builtin(tmp_path: Path) -> None:
    for name in ("namespace", "gvisor", "microvm"):
        cls = registry.backend_class(name)
        assert "destroy_by_id" in Backend.__abstractmethods__
        sig = inspect.signature(cls.destroy_by_id)
        assert sig.return_annotation in ("list[str]", list[str]), name
    # nothing of that id: nothing removed, no error, same type everywhere
    assert registry.new_backend("namespace", Home(tmp_path)).destroy_by_id("sbx-nothing") == []


def test_detached_is_a_constructor_argument(tmp_path: Path) -> None:
    for name in ("namespace", "gvisor", "microvm"):
        assert registry.new_backend(name, Home(tmp_path), detached=True).detach is True
        assert registry.backend_class(name)(Home(tmp_path)).detach is False


def test_builtins_come_through_the_entry_point_group() -> None:
    import importlib.metadata

    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=registry.GROUP)}
    assert {k: declared[k] for k in registry.BUILTINS} == registry.BUILTINS
    assert registry.names()[:3] == ["namespace", "gvisor", "microvm"]


def test_decorator_registers_and_refuses_a_second_class_of_the_same_name() -> None:
    @registry.register_backend
    class Mine(NamespaceBackend):
        name: ClassVar[str] = "test-decorated"

    assert registry.backend_class("test-decorated") is Mine
    assert "test-decorated" in registry.names()

    class Other(NamespaceBackend):
        name: ClassVar[str] = "test-decorated"

    with pytest.raises(ValueError, match="already registered"):
        registry.register_backend(Other)
    with pytest.raises(TypeError):
        registry.register_backend(int)  # type: ignore[type-var]


def test_unknown_backend_is_one_line() -> None:
    from rollbox.errors import UnknownBackendError

    with pytest.raises(UnknownBackendError) as err:
        registry.backend_class("nope")
    assert "\n" not in err.value.one_line() and "namespace" in err.value.one_line()


def test_configs_are_discriminated_strict_and_documented() -> None:
    adapter: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)
    for cls, name in (
        (NamespaceConfig, "namespace"),
        (GVisorConfig, "gvisor"),
        (MicroVMConfig, "microvm"),
    ):
        assert isinstance(adapter.validate_python({"type": name}), cls)
        for field, info in cls.model_fields.items():
            assert info.description, f"{cls.__name__}.{field} has no docstring"
    with pytest.raises(InvalidInputError, match="boot_timeout"):
        parse_config({"type": "microvm", "boot_timeout": 5})  # extra="forbid"
    with pytest.raises(InvalidInputError):
        parse_config({"type": "firecracker"})
    with pytest.raises(InvalidInputError):
        parse_config({"type": "microvm", "boot_timeout_s": 0})


def test_environment_variables_override_the_config() -> None:
    base = MicroVMConfig(boot_timeout_s=60, split_memory=True)
    env = {"ROLLBOX_MICROVM_BOOT_TIMEOUT": "7.5", "ROLLBOX_MICROVM_SPLIT_MEMORY": "0"}
    got = config_for("microvm", base, env)
    assert isinstance(got, MicroVMConfig)
    assert (got.boot_timeout_s, got.split_memory, got.boot_snapshots) == (7.5, False, True)
    assert config_for("microvm", base, {}) == base
    with pytest.raises(InvalidInputError, match="ROLLBOX_MICROVM_BOOT_TIMEOUT"):
        config_for("microvm", None, {"ROLLBOX_MICROVM_BOOT_TIMEOUT": "soon"})
    with pytest.raises(InvalidInputError, match="config was given"):
        config_for("microvm", NamespaceConfig(), {})


def test_a_backend_instance_uses_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLBOX_MICROVM_BOOT_TIMEOUT", raising=False)
    vm = registry.backend_class("microvm")(Home(tmp_path), config=MicroVMConfig(boot_timeout_s=9))
    assert vm.vm_config.boot_timeout_s == 9  # type: ignore[attr-defined]
    monkeypatch.setenv("ROLLBOX_MICROVM_BOOT_TIMEOUT", "3")
    vm2 = registry.backend_class("microvm")(Home(tmp_path), config=MicroVMConfig(boot_timeout_s=9))
    assert vm2.vm_config.boot_timeout_s == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "method", ["create", "connect", "exec", "snapshot", "snapshot_memory", "fork"]
)
def test_sync_facade_has_the_async_signatures(method: str) -> None:
    sync = inspect.signature(getattr(Sandbox, method))
    aio = inspect.signature(getattr(AsyncSandbox, method))
    assert not any(p.kind is p.VAR_KEYWORD for p in sync.parameters.values())
    assert list(sync.parameters) == list(aio.parameters)
    for name, p in sync.parameters.items():
        assert p.annotation == aio.parameters[name].annotation, name
        assert p.default == aio.parameters[name].default, name


def test_no_aio_object_of_the_facade_loop() -> None:
    assert not hasattr(Sandbox, "aio")
    assert inspect.iscoroutinefunction(Sandbox.to_async)


def test_every_microvm_environment_knob_is_a_config_field() -> None:
    import re

    src = Path(__file__).parents[3] / "src" / "rollbox" / "backends"
    used = set()
    for path in src.rglob("*.py"):
        used |= set(re.findall(r"ROLLBOX_MICROVM_[A-Z_]+", path.read_text()))
    declared = {var for var, _ in ENV_OVERRIDES["microvm"].values()}
    assert used == declared, used ^ declared
    env = {
        "ROLLBOX_MICROVM_ACCEL": "tcg",
        "ROLLBOX_MICROVM_KVM_DEVICE": "/dev/null",
        "ROLLBOX_MICROVM_PROBE_TIMEOUT": "1.5",
        "ROLLBOX_MICROVM_TB_MB": "16",
        "ROLLBOX_MICROVM_ASLR": "1",
    }
    got = config_for("microvm", None, env)
    assert isinstance(got, MicroVMConfig)
    assert (got.accel, got.kvm_device, got.probe_timeout_s, got.tb_mb, got.aslr) == (
        "tcg",
        "/dev/null",
        1.5,
        16,
        True,
    )
    assert config_for("microvm", None, {"ROLLBOX_MICROVM_ACCEL": "bogus"}).accel == "auto"  # type: ignore[union-attr]


def test_vm_command_line_follows_the_config() -> None:
    from rollbox.backends.microvm import qemu

    def argv(**kw: object) -> str:
        cfg = qemu.VMConfig(
            name="t",
            accel="tcg",
            memory_mb=256,
            cpus=1,
            kernel="k",
            initrd="i",
            base_image="b",
            disk="d",
            run_dir="/tmp/x",
            console_log="c",
            tsc_khz=1,
            **kw,  # type: ignore[arg-type]
        )
        return " ".join(cfg.argv())

    assert "tb-size=16" in argv(tb_mb=16) and "norandmaps" in argv(aslr=False)
    assert "norandmaps" not in argv(aslr=True)


def test_hardware_virtualization_is_asked_through_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollbox.backends.microvm import probe
    from rollbox.rollouts import backend_choice

    ns = registry.new_backend("namespace", Home(tmp_path))
    assert ns.hardware_virtualized()[0] is False
    vm = registry.new_backend("microvm", Home(tmp_path))
    for accel, want in (("kvm", True), ("tcg", False)):
        vm._accel = probe.ProbeResult(accel, f"probe said {accel}", 0.0)  # type: ignore[attr-defined]
        monkeypatch.setattr(type(vm), "prepare", lambda self: None)
        assert vm.hardware_virtualized() == (want, f"probe said {accel}")
        monkeypatch.setattr(backend_choice, "get_backend", lambda name, home: vm)
        assert backend_choice._kvm_verdict(Home(tmp_path)) == (want, f"probe said {accel}")


def test_check_refuses_a_user_without_the_users_capability(tmp_path: Path) -> None:
    from rollbox.models import SandboxSpec

    class Rootonly(NamespaceBackend):
        name: ClassVar[str] = "test-rootonly"
        capabilities: ClassVar[Capabilities] = Capabilities(users=False)

    be = Rootonly(Home(tmp_path))
    be.check(SandboxSpec(baseline="sha256:" + "0" * 64, backend=be.name, user="root"))
    with pytest.raises(UnsupportedOperationError, match="users"):
        be.check(SandboxSpec(baseline="sha256:" + "0" * 64, backend=be.name, user="1000"))


def test_a_declared_backend_that_cannot_load_is_reported_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollbox.cli.cleanup import cleanup
    from rollbox.errors import BackendUnavailableError

    site = tmp_path / "site"
    dist = site / "rbx_broken-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rbx-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rollbox.backends]\next-gone = rbx_gone_mod:Gone\n")
    monkeypatch.syspath_prepend(str(site))
    assert "ext-gone" in registry.names()
    with pytest.raises(BackendUnavailableError, match="rbx_gone_mod"):
        registry.get_backend("ext-gone", Home(tmp_path / "h"))
    monkeypatch.setattr("rollbox.cli.cleanup.names", lambda: ["ext-gone"])
    problems: list[str] = []
    cleanup(Home(tmp_path / "h"), dry_run=True, problems=problems)
    assert len(problems) == 1 and "ext-gone not loaded" in problems[0], problems


def test_reconfigure_replaces_the_tuning_env_still_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLBOX_MICROVM_TB_MB", raising=False)
    vm = registry.new_backend("microvm", Home(tmp_path))
    vm.reconfigure(MicroVMConfig(tb_mb=16))
    assert vm.vm_config.tb_mb == 16  # type: ignore[attr-defined]
    monkeypatch.setenv("ROLLBOX_MICROVM_TB_MB", "8")
    vm.reconfigure(MicroVMConfig(tb_mb=16))
    assert vm.vm_config.tb_mb == 8  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError):
        vm.reconfigure(GVisorConfig())


def test_a_sandbox_follows_asyncio_run_but_refuses_a_live_foreign_loop(tmp_path: Path) -> None:
    import threading

    from rollbox.models import ExecResult

    class Handle:
        id = "sbx-double"

        async def exec(self, cmd: object, **_kw: object) -> ExecResult:
            return ExecResult(exit_code=0, stdout="ok", stderr="", duration_s=0.0)

    sbx = AsyncSandbox(Handle(), registry.new_backend("namespace", Home(tmp_path)))  # type: ignore[arg-type]
    assert asyncio.run(sbx.exec("true")).stdout == "ok"
    assert asyncio.run(sbx.exec("true")).stdout == "ok"  # the first loop is closed: rebinds
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(sbx.exec("true"), other).result(5)  # binds there
        with pytest.raises(InvalidInputError, match="another event loop") as err:
            asyncio.run(sbx.exec("true"))
        assert err.value.sandbox_id == "sbx-double" and err.value.backend == "namespace"
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()


def test_an_outside_backend_has_no_borrowed_config() -> None:
    with pytest.raises(InvalidInputError, match="no config model"):
        config_for("ext-thing", None, {})
    with pytest.raises(InvalidInputError, match="config was given"):
        config_for("ext-thing", MicroVMConfig(), {})
