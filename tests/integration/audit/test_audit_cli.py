"""``rollbox audit`` end to end on real sandboxes (reduced residue cycle count)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integration.clihelp import need_backend, run_cli
from rollbox.audit.runner import probe_names
from rollbox.config import Home

pytestmark = [pytest.mark.root]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["namespace", "gvisor"])
def test_audit_names_every_probe_and_finds_no_breach(shared_home: Home, backend: str) -> None:
    need_backend(backend, shared_home)
    r = run_cli(shared_home, "audit", "--backend", backend, "--cycles", "5", "--json")
    doc = json.loads(r.stdout)
    assert doc["kind"] == "rollbox-audit" and doc["backend"] == backend
    assert [p["name"] for p in doc["probes"]] == probe_names()
    for p in doc["probes"]:
        assert p["summary"] and p["status"] in {"pass", "breach", "error", "skip"}
    breaches = {p["name"]: p["summary"] for p in doc["probes"] if p["status"] == "breach"}
    errors = {p["name"]: p["summary"] for p in doc["probes"] if p["status"] == "error"}
    assert not breaches, breaches
    assert not errors, errors
    assert doc["host_leaks"] == {}
    assert r.returncode == 0


@pytest.mark.slow
def test_audit_exit_code_follows_breaches(shared_home: Home) -> None:
    """Exit 0 with all probes passing, and the JSON counts agree with the statuses."""
    need_backend("namespace", shared_home)
    r = run_cli(
        shared_home, "audit", "--backend", "namespace", "--probe", "inherited-fds",
        "--probe", "host-loopback-service", "--json",
    )  # fmt: skip
    doc = json.loads(r.stdout)
    assert [p["name"] for p in doc["probes"]] == ["inherited-fds", "host-loopback-service"]
    n_bad = doc["breaches"] + doc["errors"]
    assert (r.returncode == 0) == (n_bad == 0 and not doc["host_leaks"])
    assert doc["passed"] == sum(p["status"] == "pass" for p in doc["probes"])


@pytest.mark.slow
def test_audit_repro_identical(shared_home: Home) -> None:
    need_backend("namespace", shared_home)
    r = run_cli(shared_home, "audit", "--repro", "--k", "3", "--backend", "namespace", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["identical"] and doc["all_done"] and doc["k"] == 3
    assert len(doc["rollouts"]) == 3 and doc["fs_paths"] >= 3 and doc["differences"] == []
    assert {o["reward"] for o in doc["outcomes"].values()} == {1.0}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--backend", "nope"], "unknown backend"),
        (["--probe", "no-such-probe"], "unknown probe"),
        (["--cycles", "-1"], "--cycles"),
        (["--repro", "--k", "1"], "--k"),
    ],
)
def test_audit_bad_input_one_line_exit_2(shared_home: Home, args: list[str], needle: str) -> None:
    r = run_cli(shared_home, "audit", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]


@pytest.mark.slow
def test_audit_repro_names_what_differs(shared_home: Home, tmp_path: Path) -> None:
    """A task that writes the time and random bytes: repro must fail and name the paths."""
    need_backend("namespace", shared_home)
    task = tmp_path / "nondet"
    (task / "solution").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("write the time\n")
    (task / "task.toml").write_text('[task]\nname = "nondet"\n\n[agent]\ntimeout_sec = 60\n')
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/sh\ndate +%s%N > /root/now.txt\nhead -c 16 /dev/urandom > /root/rand.bin\n"
        "echo same > /root/same.txt\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/sh\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
    )
    for f in ("solution/solve.sh", "tests/test.sh"):
        (task / f).chmod(0o755)
    r = run_cli(
        shared_home, "audit", "--repro", "--k", "2", "--backend", "namespace",
        "--task", str(task), "--json",
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["all_done"] and not doc["identical"]
    what = {d["what"] for d in doc["differences"]}
    assert {"fs:/root/now.txt", "fs:/root/rand.bin"} <= what
    assert "fs:/root/same.txt" not in what and not any(w.startswith("outcome:") for w in what)
    d = next(d for d in doc["differences"] if d["what"] == "fs:/root/now.txt")
    assert len(set(d["values"].values())) == 2  # each rollout's value, side by side


@pytest.mark.slow
@pytest.mark.vm
def test_audit_microvm_kernel_surface(shared_home: Home) -> None:
    """In a microVM the guest kernel is the sandbox's own: what it accepts is recorded, and
    only host-visible effects are breaches."""
    need_backend("microvm", shared_home)
    probes = ["cross-sandbox-files", "mknod", "mount", "bpf", "proc-sys-write", "inherited-fds"]
    args = [x for p in probes for x in ("--probe", p)]
    r = run_cli(shared_home, "audit", "--backend", "microvm", *args, "--json", timeout=1200)
    doc = json.loads(r.stdout)
    assert doc["kernel"]["shared"] is False
    boot_id = "/proc/sys/kernel/random/boot_id"
    assert doc["kernel"]["sandbox"][boot_id] != doc["kernel"]["host"][boot_id]
    assert [p["name"] for p in doc["probes"]] == [n for n in probe_names() if n in probes]
    bad = {p["name"]: p["summary"] for p in doc["probes"] if p["status"] != "pass"}
    assert not bad, bad
    assert r.returncode == 0
