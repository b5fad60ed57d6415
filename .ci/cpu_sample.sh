#!/usr/bin/env bash
# CPU accounting for .ci/times.py: every 10 s, one line "<unix s> root=<usec> <cgroup>=<usec> ..."
# with the machine's CPU time (cgroup v2 cpu.stat usage_usec at the root of the unified
# hierarchy) and each lab host's (the lab puts every host of instance NAME in
# vllm-provision-NAME/<host>: its systemd, services, SSH sessions). Exits quietly where there is
# no cgroup v2 cpu.stat to read.
set -u
root=""
for candidate in /sys/fs/cgroup/unified /sys/fs/cgroup; do
    [ -r "$candidate/cpu.stat" ] && { root=$candidate; break; }
done
[ -n "$root" ] || exit 0
usage() { awk '$1 == "usage_usec" {print $2}' "$1/cpu.stat" 2>/dev/null; }
while true; do
    line="$(date +%s) root=$(usage "$root")"
    for instance in "$root"/vllm-provision-*/; do
        [ -r "$instance/cpu.stat" ] || continue
        name=$(basename "$instance")
        line+=" ${name#vllm-provision-}=$(usage "$instance")"
    done
    echo "$line"
    sleep 10
done
