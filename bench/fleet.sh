#!/bin/sh
# The fleet scenario of docs/upgrade.md on the lab (root, the lab instance's settings exported):
# 16 hosts as 8 replicas of 2 nodes; up of 1 replica and of 8, then rolling upgrades with
# --serial 1 and --serial 2, each recording the capacity probe, then a failed upgrade (a flag the
# stand-in rejects, on the third replica only). Results in bench/results/fleet-*.
#   sh bench/fleet.sh          # everything
#   sh bench/fleet.sh fail     # only the failed upgrade (boots the lab and deploys the fleet)
set -eu
out=bench/results; mkdir -p "$out"
P=.venv/bin/provision
PY=.venv/bin/python
scenario=${1:-all}
/usr/bin/time -v $P lab up --hosts 16 2> "$out/fleet-lab-up.time"
inv="$VLLM_PROVISION_LAB_DIR/inventory/lab-fleet.yml"
cp "$inv" "$out/fleet-inventory.yml"

# set_args ARGS [REPLICA BAD_ARGS]: every replica's vllm_extra_args, and one replica's own
set_args() {
  $PY - "$inv" "$@" <<'PY'
import sys, yaml
path, args, *rest = sys.argv[1:]
data = yaml.safe_load(open(path))
replicas = data["all"]["children"]["vllm_replicas"]
replicas["vars"]["vllm_extra_args"] = args.split() if args else []
for name, group in replicas["children"].items():
    group.pop("vars", None)
    if rest and name == rest[0]:
        group["vars"] = {"vllm_extra_args": rest[1].split()}
open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
PY
}

if [ "$scenario" = all ]; then
  # one replica alone, then all 8 (forks = hosts, so every host starts at once)
  $P up -i "$inv" -l r1 --yes --json > "$out/fleet-up-1.json"
  $P down -i "$inv" --yes > /dev/null
fi
$P up -i "$inv" -f 16 --yes --json > "$out/fleet-up-8.json"
free -m > "$out/fleet-memory.txt"
if [ "$scenario" = all ]; then
  for serial in 1 2; do
    set_args "--max-num-seqs $((64 / serial))"
    $P upgrade -i "$inv" --serial "$serial" -f 16 --yes --json > "$out/fleet-upgrade-serial$serial.json"
  done
fi
# the new version fails on r3 only: the upgrade stops there and rolls r3 back
set_args "--max-num-seqs 48" r3 "--max-num-seqs 48 --no-such-engine-flag"
$P upgrade -i "$inv" --serial 1 -f 16 --yes --json > "$out/fleet-upgrade-fail.json" || true
$P status -i "$inv" --json > "$out/fleet-status-after-fail.json" || true
$PY - "$out" "$scenario" <<'PY'
import json, sys
out, scenario = sys.argv[1:]
names = ["fleet-up-1", "fleet-up-8"] if scenario == "all" else ["fleet-up-8"]
for name in names:
    d = json.load(open(f"{out}/{name}.json"))
    print(name, "duration", d.get("duration_s"), "served", sum(r["served"] for r in d["replicas"]))
for serial in ((1, 2) if scenario == "all" else ()):
    d = json.load(open(f"{out}/fleet-upgrade-serial{serial}.json"))
    c = d["capacity"]
    print(f"serial {serial}: {d['duration_s']} s, recap {d['recap']}, min serving "
          f"{c['min_serving']} of {c['replicas']} over {len(c['samples'])} samples")
d = json.load(open(f"{out}/fleet-upgrade-fail.json"))
c = d["capacity"]
print(f"failed upgrade: {d['duration_s']} s, recap {d['recap']}, min serving "
      f"{c['min_serving']} of {c['replicas']}")
PY
$P down -i "$inv" --yes > /dev/null
