#!/bin/bash
# Named rewards in reward.json: the headline "reward" plus one per check.
python3 - <<'PY'
import json, os
checks = {}
try:
    doc = json.load(open("/app/out/report.json"))
    checks["files"] = float(doc.get("files") == 2)
    checks["lines"] = float(doc.get("lines") == 4)
except Exception as exc:
    print("report.json:", exc)
    checks["files"] = checks["lines"] = 0.0
checks["log"] = float(os.path.isfile("/app/out/build.log") and os.path.getsize("/app/out/build.log") > 0)
checks["reward"] = float(all(v == 1.0 for v in checks.values()))
print(checks)
json.dump(checks, open("/logs/verifier/reward.json", "w"))
PY
