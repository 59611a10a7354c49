"""``namespace`` on cgroup v1 (this host) and cgroup v2 (a rollbox microVM guest), each
beside raw bubblewrap in the same run on the same kernel.

* create -> first exec result of ``true`` vs raw
  ``bwrap --bind LAYER / --dev /dev --proc /proc --unshare-all --die-with-parent true``
  (alternating, so both see the same load): the same <= 3x bar on both versions;
* exec round trip of ``true`` in a running sandbox.

The same measuring code (``tests/v2/guest_driver.py``'s ``bench``) runs on the host and in
the guest. The guest is the cgroup-v2 test guest of ``tests/v2`` (Debian cloud kernel,
cgroup2 only, TCG: absolute guest figures are an emulated CPU's; compare the ratios).

Usage (root, from the repository root): ``.venv/bin/python benchmarks/cgroup_v2.py [-n N]``;
writes ``benchmarks/results/cgroup_v2.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from rollbox.config import Home  # noqa: E402
from v2 import guest_driver  # noqa: E402
from v2.guest import boot  # noqa: E402

RESULTS = Path(__file__).with_name("results") / "cgroup_v2.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="samples per figure")
    args = ap.parse_args()
    shared = Home(Path(os.environ.get("ROLLBOX_TEST_HOME", "/var/tmp/rollbox-test"))).ensure()
    with tempfile.TemporaryDirectory(prefix="rbx-bench-v2-") as tmp:
        root = Path(tmp) / "home"
        root.mkdir()
        for name in ("oci", "layers", "baselines", "cache"):
            (shared.root / name).mkdir(exist_ok=True)
            (root / name).symlink_to(shared.root / name)
        host = asyncio.run(guest_driver.bench(args.n, str(root)))
    print("host:", json.dumps(host), flush=True)
    t0 = time.monotonic()
    with boot(shared) as g:
        boot_s = time.monotonic() - t0
        guest = g.driver("bench", str(args.n))
    print("guest:", json.dumps(guest), flush=True)
    doc = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "load_avg": os.getloadavg(),
        "host_v1": host,
        "guest_v2": {**guest, "guest_boot_and_upload_s": round(boot_s, 1)},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
