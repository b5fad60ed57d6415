#!/bin/sh
# The fleet scenario of docs/upgrade.md on the lab (root, the lab instance's settings exported):
# 16 hosts as 8 replicas of 2 nodes; up of 1 replica and of 8, then rolling upgrades with
# --serial 1 and --serial 2, each recording the capacity probe. Results in bench/results/fleet-*.
set -eu
out=bench/results; mkdir -p "$out"
P=.venv/bin/provision
/usr/bin/time -v $P lab up --hosts 16 2> "$out/fleet-lab-up.time"
inv="$VLLM_PROVISION_LAB_DIR/inventory/lab-fleet.yml"
cp "$inv" "$out/fleet-inventory.yml"
# one replica alone, then all 8 (forks = hosts, so every host starts at once)
$P up -i "$inv" -l r1 --yes --json > "$out/fleet-up-1.json"
$P down -i "$inv" --yes > /dev/null
$P up -i "$inv" -f 16 --yes --json > "$out/fleet-up-8.json"
free -m > "$out/fleet-memory.txt"
for serial in 1 2; do
  sed -i "s/^        vllm_cluster_interface: eth0$/        vllm_cluster_interface: eth0\n        vllm_extra_args: [--max-num-seqs, '$((64 / serial))']/" "$inv"
  $P upgrade -i "$inv" --serial "$serial" -f 16 --yes --json > "$out/fleet-upgrade-serial$serial.json"
  sed -i '/vllm_extra_args: \[--max-num-seqs/d' "$inv"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("fleet-up-1", "fleet-up-8"):
    d = json.load(open(f"{out}/{name}.json"))
    print(name, "duration", d.get("duration_s"), "served", sum(r["served"] for r in d["replicas"]))
for serial in (1, 2):
    d = json.load(open(f"{out}/fleet-upgrade-serial{serial}.json"))
    c = d["capacity"]
    print(f"serial {serial}: {d['duration_s']} s, recap {d['recap']}, min serving "
          f"{c['min_serving']} of {c['replicas']} over {len(c['samples'])} samples")
PY
$P down -i "$inv" --yes > /dev/null
