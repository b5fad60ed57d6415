#!/usr/bin/env bash
# Set up a fresh Debian machine for vllm-provision: the Debian packages the lab needs, and a
# virtual environment in .venv with the project (and its test extra) and the lab (lab/).
# Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/setup.sh: run as root (the lab needs root to boot hosts with systemd-nspawn)." >&2
    exit 1
fi

packages=(mmdebstrap systemd-container systemd-journal-remote zstd iptables iproute2 openssh-client python3-venv ca-certificates)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "Installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# both distributions of this repository, editable: the operator's tool (.) with the stack extra
# (uv, for provision stack lock) and the lab (lab/, which adds `provision lab`; the operator's
# wheel carries no lab)
.venv/bin/pip install -q --disable-pip-version-check -e '.[test,stack]' -e ./lab
# byte-compile both editable trees: pip compiled what it installed, but an editable project's
# modules are compiled on import, and where PYTHONDONTWRITEBYTECODE is set (as on some CI and
# container images) every process compiled them again: about 0.7 s of CPU per `provision` call,
# hundreds of calls in the lab tests. Python checks each .pyc against its source, so an edited
# module is still read from its source.
.venv/bin/python -m compileall -q -j 0 vllm_provision lab/vllm_provision_lab >/dev/null
# a real Prometheus and promtool for the monitoring tests: Debian's package, unpacked under
# /var/cache/vllm-provision-lab/prometheus, never installed (lab/vllm_provision_lab/prometheus.py)
.venv/bin/python -m vllm_provision_lab.prometheus >/dev/null
# the front door's router as wheels for the lab hosts (no index there): vllm-router 0.1.17 and its
# pinned dependencies, under /var/cache/vllm-provision-lab (lab/vllm_provision_lab/router_wheels.py)
.venv/bin/python -m vllm_provision_lab.router_wheels >/dev/null
echo "Ready: .venv/bin/provision --help"
