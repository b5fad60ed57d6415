# ruff: noqa: UP004, UP021, UP022, UP031, UP041  (must stay valid on Python 3.8)
"""Remote fact probe: run on a host as ``python -c '<loader>' '<json config>'``; prints ONE
JSON document.

Sent inside one command over the existing SSH connection (compressed, as the argument of
``python -c``: ``facts/gather.py``, ``probe_command``), so gathering facts costs one round
trip per host. Standard library only; must run on any Python >= 3.8 (no 3.9+ syntax or APIs here).
It returns raw command outputs; the controller parses them (``facts/parsers.py``) where that
is easier to test. It changes nothing on the host except a short-lived TCP listener when the
controller asks for a reachability test.
"""

import glob
import hashlib
import importlib.metadata
import io
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import threading
import time

ERRORS = []
# name -> the source of a fact module's probe function (vllm_provision/facts/extra/), added
# to this script when it is sent (facts.extra.probe_additions), before main() runs; each is
# compiled and run on its own, so one that does not compile here costs only its fact
EXTRA_FACTS = {}
# the most a fact's answer may hold, as JSON: one fact cannot crowd out the document
FACT_MAX_BYTES = 1024 * 1024
# the longest a fact's probe may run (seconds): one fact cannot hold up the others
FACT_TIMEOUT_S = 20


def run(argv, timeout=20):
    """Run a command; return {rc, stdout, stderr}; rc 127 when the program is missing."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, universal_newlines=True)
        return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    except FileNotFoundError:
        return {"rc": 127, "stdout": "", "stderr": "%s: command not found" % argv[0]}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": "%s: timed out after %ss" % (argv[0], timeout)}
    except OSError as exc:
        return {"rc": 126, "stdout": "", "stderr": "%s: %s" % (argv[0], exc)}


def sshd_version():
    """``sshd -V`` (OpenSSH >= 9.x prints its version); older sshd reject -V but print the
    version in their usage text. Both go to stderr. sshd may be outside a user's PATH."""
    for program in ("sshd", "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        result = run([program, "-V"], timeout=10)
        if result["rc"] != 127:
            return result
    return result


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def package_versions(names):
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
        except Exception as exc:  # a broken dist-info must not stop the probe
            versions[name] = None
            ERRORS.append("reading the version of %s failed: %s" % (name, exc))
    return versions


def torch_runtime(want_nccl, want_cuda):
    """Import torch only when asked: torch.cuda.nccl.version() and torch.version.cuda."""
    result = {"nccl_loaded": None, "torch_cuda_runtime": None}
    if not (want_nccl or want_cuda):
        return result
    try:
        import torch  # noqa: F401  (only when the controller asked for the loaded NCCL)

        if want_cuda:
            result["torch_cuda_runtime"] = torch.version.cuda
        if want_nccl:
            version = torch.cuda.nccl.version()
            if isinstance(version, tuple):
                version = ".".join(str(part) for part in version)
            result["nccl_loaded"] = str(version)
    except Exception as exc:
        ERRORS.append("import torch / torch.cuda.nccl.version() failed: %s" % exc)
    return result


def model_manifest(path, want_sha256, max_files):
    if not path:
        return {"exists": False, "files": [], "truncated": False}
    if not os.path.isdir(path):
        return {"exists": os.path.exists(path), "is_dir": False, "files": [], "truncated": False}
    files = []
    truncated = False
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            relative = os.path.relpath(full, path)
            try:
                size = os.path.getsize(full)
            except OSError as exc:
                ERRORS.append("model file %s unreadable: %s" % (full, exc))
                continue
            digest = ""
            if want_sha256:
                sha = hashlib.sha256()
                with open(full, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        sha.update(chunk)
                digest = sha.hexdigest()
            files.append([relative, size, digest])
            if len(files) >= max_files:
                truncated = True
                break
        if truncated:
            break
    return {"exists": True, "is_dir": True, "files": files, "truncated": truncated}


# safetensors format: an 8-byte little-endian header length, then that many bytes of JSON
# (name -> {dtype, shape, data_offsets}); the format caps the header at 100 MB
# (safetensors docs, "Format"). Only headers are read, never the weights (but for the content
# fingerprint's few samples, below).
SAFETENSORS_HEADER_MAX = 100000000
# The content fingerprint (docs/preflight.md, "Model content"): config.json and the index are
# hashed whole up to this size (a 1 TB MoE checkpoint's index is a few MB); a larger one is an
# error reported as a fact.
MODEL_JSON_MAX = 64 * 1024 * 1024
# ... and every safetensors file by its header plus CONTENT_SAMPLES blocks of CONTENT_SAMPLE
# bytes spread evenly over its data (the first and the last included): a revision that only
# changes weights keeps the headers but not the data.
CONTENT_SAMPLES = 4
CONTENT_SAMPLE = 64 * 1024


def read_safetensors_header(handle, budget):
    """Read one safetensors header from an open binary file at offset 0: the raw JSON bytes, or
    raise ValueError naming what is wrong. ``budget`` bounds the bytes read."""
    first = handle.read(8)
    if len(first) < 8:
        raise ValueError("shorter than the 8-byte safetensors header length")
    length = int.from_bytes(first, "little")
    if length > SAFETENSORS_HEADER_MAX or length > budget:
        raise ValueError("header length %d is not a safetensors header (limit %d)"
                         % (length, min(SAFETENSORS_HEADER_MAX, budget)))
    raw = handle.read(length)
    if len(raw) < length:
        raise ValueError("header cut short (%d of %d bytes)" % (len(raw), length))
    return raw


def parse_safetensors_header(raw):
    """A header's JSON bytes -> [[name, dtype, shape, nbytes], ...]; ValueError when malformed."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ValueError("header is not JSON: %s" % exc) from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            tensors.append([name, str(entry["dtype"]), [int(d) for d in entry["shape"]],
                            int(end) - int(begin)])
        except (KeyError, TypeError, ValueError):
            raise ValueError("tensor %r has no dtype, shape or data_offsets" % name) from None
    return tensors


def safetensors_header(path, budget):
    """Read one safetensors header: ([[name, dtype, shape, nbytes], ...], header bytes read) or
    raise ValueError naming what is wrong. ``budget`` bounds the bytes read."""
    with open(path, "rb") as handle:
        raw = read_safetensors_header(handle, budget)
    return parse_safetensors_header(raw), len(raw) + 8


def sample_data(handle, digest, start, size):
    """Feed ``digest`` CONTENT_SAMPLES blocks of the data between ``start`` and ``size`` (all of
    it when shorter), spread evenly, first and last block included; return the bytes read."""
    span = size - start
    if span <= CONTENT_SAMPLES * CONTENT_SAMPLE:
        offsets = [start] if span > 0 else []
        length = span
    else:
        step = (span - CONTENT_SAMPLE) // (CONTENT_SAMPLES - 1)
        offsets = [start + i * step for i in range(CONTENT_SAMPLES)]
        length = CONTENT_SAMPLE
    read = 0
    for offset in offsets:
        handle.seek(offset)
        block = handle.read(length)
        digest.update(block)
        read += len(block)
    return read


def read_json_file(path, limit):
    """A small JSON file's bytes (None when absent); ValueError when larger than ``limit``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError("unreadable: %s" % exc) from None
    if len(data) > limit:
        raise ValueError("larger than %d bytes" % limit)
    return data


def model_content(path, max_bytes, want_weights, max_config_bytes=1 << 20):
    """One read of the model folder for two facts: its content fingerprint (every node) and,
    with ``want_weights``, what the memory estimate reads (rank 0).

    Read: ``config.json`` and ``model.safetensors.index.json`` (whole, up to MODEL_JSON_MAX),
    and every top-level ``*.safetensors`` file vLLM loads (with an index only the shards its
    ``weight_map`` names: ``filter_duplicate_safetensors_files``,
    vllm/model_executor/model_loader/weight_utils.py): its header (``max_bytes`` bounds all
    headers together) and, for the fingerprint, CONTENT_SAMPLES samples of its data. File names
    are data: listed with os.listdir, opened by path, never passed to a shell.

    Returns {"fingerprint": {"files": [[name, sha256 hex], ...], "errors": [...],
    "bytes_read": n}, "weights": {"config", "files", "errors"} or None}; ``fingerprint`` is
    None when ``path`` is not a folder.
    """
    weights = {"config": None, "files": [], "errors": []} if want_weights else None
    if not path or not os.path.isdir(path):
        return {"fingerprint": None, "weights": weights}
    hashes = []
    errors = []
    read = 0
    config_bytes = None
    try:
        config_bytes = read_json_file(os.path.join(path, "config.json"), MODEL_JSON_MAX)
    except ValueError as exc:
        errors.append("config.json: %s" % exc)
    if config_bytes is not None:
        hashes.append(["config.json", hashlib.sha256(config_bytes).hexdigest()])
        read += len(config_bytes)
    if weights is not None:
        if config_bytes is None:
            weights["errors"].append("config.json is missing")
        elif len(config_bytes) > max_config_bytes:
            weights["errors"].append("config.json is larger than %d bytes" % max_config_bytes)
        else:
            try:
                weights["config"] = json.loads(config_bytes.decode("utf-8", "replace"))
            except ValueError as exc:
                weights["errors"].append("config.json is not JSON: %s" % exc)
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors")
                       and os.path.isfile(os.path.join(path, n)))
    except OSError as exc:
        errors.append("cannot list %s: %s" % (path, exc))
        names = []
    index = "model.safetensors.index.json"
    try:
        index_bytes = read_json_file(os.path.join(path, index), MODEL_JSON_MAX)
    except ValueError as exc:
        errors.append("%s: %s" % (index, exc))
        index_bytes = None
    if index_bytes is not None:
        hashes.append([index, hashlib.sha256(index_bytes).hexdigest()])
        read += len(index_bytes)
        try:
            wanted = set((json.loads(index_bytes.decode("utf-8", "replace"))
                          .get("weight_map") or {}).values())
            names = [n for n in names if n in wanted]
        except (ValueError, AttributeError) as exc:
            if weights is not None:
                weights["errors"].append("%s is not JSON: %s" % (index, exc))
    budget = max_bytes
    for name in names:
        full = os.path.join(path, name)
        try:
            with open(full, "rb") as handle:
                raw = read_safetensors_header(handle, budget)
                digest = hashlib.sha256(len(raw).to_bytes(8, "little"))
                digest.update(raw)
                size = os.fstat(handle.fileno()).st_size
                sampled = sample_data(handle, digest, 8 + len(raw), size)
        except (OSError, ValueError) as exc:
            errors.append("%s: %s" % (name, exc))
            if weights is not None:
                weights["errors"].append("%s: %s" % (name, exc))
            continue
        budget -= len(raw) + 8
        read += len(raw) + 8 + sampled
        hashes.append([name, digest.hexdigest()])
        if weights is not None:
            try:
                weights["files"].append({"name": name, "tensors": parse_safetensors_header(raw)})
            except ValueError as exc:
                weights["errors"].append("%s: %s" % (name, exc))
    return {"fingerprint": {"files": hashes, "errors": errors, "bytes_read": read},
            "weights": weights}


def model_weights(path, max_bytes, max_config_bytes=1 << 20):
    """The model's config.json and every ``*.safetensors`` header vLLM loads (headers only):
    ``model_content(...)["weights"]`` ({"config", "files", "errors"})."""
    return model_content(path, max_bytes, True, max_config_bytes)["weights"]


def statvfs_bytes(path):
    try:
        stat = os.statvfs(path)
        return {"size": stat.f_blocks * stat.f_frsize, "free": stat.f_bavail * stat.f_frsize}
    except OSError:
        return None


def existing_parent(path):
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def logind_texts():
    texts = []
    main = read_text("/etc/systemd/logind.conf")
    if main is not None:
        texts.append(main)
    drop_ins = []
    for directory in ("/usr/lib/systemd/logind.conf.d", "/run/systemd/logind.conf.d",
                      "/etc/systemd/logind.conf.d"):
        drop_ins.extend(glob.glob(os.path.join(directory, "*.conf")))
    # Drop-ins apply in lexical order of their file names, whatever the directory (logind.conf(5)).
    for path in sorted(drop_ins, key=os.path.basename):
        text = read_text(path)
        if text is not None:
            texts.append(text)
    return texts


def service_user(name):
    if not name:
        return {"exists": False, "uid": None}
    try:
        entry = pwd.getpwnam(name)
        return {"exists": True, "uid": entry.pw_uid}
    except KeyError:
        return {"exists": False, "uid": None}


def nccl_settings(venv):
    env = dict((k, v) for k, v in os.environ.items() if k.startswith("NCCL_"))
    for line in (read_text("/etc/environment") or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.startswith("NCCL_"):
            env[key] = value.strip().strip('"')
    patterns = [
        "/usr/lib/libnccl-net*.so*", "/usr/lib64/libnccl-net*.so*",
        "/usr/lib/x86_64-linux-gnu/libnccl-net*.so*", "/usr/lib/aarch64-linux-gnu/libnccl-net*.so*",
        "/usr/local/lib/libnccl-net*.so*", "/opt/*/lib/libnccl-net*.so*",
    ]
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:
            patterns.append(os.path.join(directory, "libnccl-net*.so*"))
    if venv:
        patterns.append(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "*",
                                     "lib", "libnccl-net*.so*"))
    plugins = set()
    for pattern in patterns:
        plugins.update(glob.glob(pattern))
    return {"env": env, "conf": read_text("/etc/nccl.conf"), "plugins": sorted(plugins)}


def resolve_hostname():
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
        addresses = sorted(set(info[4][0] for info in infos))
    except OSError as exc:
        addresses = []
        ERRORS.append("hostname %s does not resolve: %s" % (name, exc))
    # which running system this is: machine-id(5) names the installation, the boot id the boot
    return {"hostname": name, "addresses": addresses,
            "machine_id": (read_text("/etc/machine-id") or "").strip()[:64],
            "boot_id": (read_text("/proc/sys/kernel/random/boot_id") or "").strip()[:64]}


class Listener(object):
    """A short-lived TCP listener on the master: peers connect to it to prove reachability."""

    def __init__(self, address, port, expect, timeout_s):
        self.address, self.port, self.expect = address, port, expect
        self.deadline = time.time() + timeout_s
        self.accepted = []
        self.error = ""
        self.sock = None
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(16)
            sock.settimeout(0.2)
            self.sock = sock
            self.thread = threading.Thread(target=self.serve)
            self.thread.daemon = True
            self.thread.start()
        except OSError as exc:
            self.error = str(exc)

    def serve(self):
        while time.time() < self.deadline and len(self.accepted) < self.expect:
            try:
                conn, peer = self.sock.accept()
                self.accepted.append(peer[0])
                conn.close()
            except socket.timeout:
                continue
            except OSError:
                break

    def finish(self):
        if self.sock is not None:
            self.thread.join(max(0.0, self.deadline - time.time()) + 0.5)
            self.sock.close()
        return {"address": self.address, "port": self.port, "bound": self.sock is not None,
                "accepted": self.accepted, "error": self.error}


def connect_until(address, port, timeout_s, result):
    start = time.time()
    last = ""
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=1.0)
            sock.close()
            result.update(address=address, port=port, ok=True, error="",
                          elapsed_s=round(time.time() - start, 3))
            return
        except OSError as exc:
            last = str(exc)
        if time.time() - start >= timeout_s:
            break
        time.sleep(0.2)
    result.update(address=address, port=port, ok=False, error=last,
                  elapsed_s=round(time.time() - start, 3))


def net_speeds():
    """/sys/class/net/<if>/speed text by interface (None when unreadable: link down)."""
    speeds = {}
    for path in sorted(glob.glob("/sys/class/net/*")):
        speeds[os.path.basename(path)] = read_text(os.path.join(path, "speed"))
    return speeds


def infiniband():
    """/sys/class/infiniband: fw_ver and each port's state, link_layer and rate (raw text)."""
    devices = {}
    for path in sorted(glob.glob("/sys/class/infiniband/*")):
        ports = {}
        for port in sorted(glob.glob(os.path.join(path, "ports", "*"))):
            ports[os.path.basename(port)] = dict(
                (name, (read_text(os.path.join(port, name)) or "").strip())
                for name in ("state", "link_layer", "rate"))
        devices[os.path.basename(path)] = {
            "fw_ver": (read_text(os.path.join(path, "fw_ver")) or "").strip(), "ports": ports}
    return devices


def kernel_xid_lines():
    """NVRM Xid lines of the kernel log of the last 24 hours (journalctl, else dmesg)."""
    result = run(["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso",
                  "--since", "-24h"], timeout=15)
    if result["rc"] != 0:
        result = run(["dmesg"], timeout=10)
    lines = [line for line in result["stdout"].splitlines() if "NVRM: Xid" in line]
    return {"rc": result["rc"], "stdout": "\n".join(lines[-50:]), "stderr": result["stderr"]}


def fabric_manager():
    """NVSwitch count and, where there are NVSwitches, nvidia-fabricmanager's unit state."""
    try:
        count = len(os.listdir("/proc/driver/nvidia-nvswitch/devices"))
    except OSError:
        count = 0
    state = None
    if count:
        state = run(["systemctl", "show", "nvidia-fabricmanager.service",
                     "-p", "LoadState", "-p", "ActiveState"], timeout=10)
    return {"nvswitch_count": count, "unit": state}


def clock_sync():
    """``timedatectl show`` and, where chronyc exists, ``chronyc -n tracking``."""
    return {"timedatectl": run(["timedatectl", "show"], timeout=10),
            "chronyc": run(["chronyc", "-n", "tracking"], timeout=5),
            "container": (read_text("/run/systemd/container") or "").strip()}


def vllm_venvs(patterns):
    """Virtual environments holding vLLM: every directory matching one of ``patterns`` (globs,
    ``~`` for the SSH user's home) with a ``bin/python`` and a ``vllm-*.dist-info`` in its
    ``lib/python3*/site-packages``, plus the environment of a ``vllm`` found on PATH.
    Returns [{"path", "vllm"}] sorted by path (``vllm``: the version from the dist-info name)."""
    candidates = set()
    for pattern in patterns:
        candidates.update(glob.glob(os.path.expanduser(pattern)))
    on_path = None
    for directory in os.environ.get("PATH", "").split(":"):
        if directory and os.path.isfile(os.path.join(directory, "vllm")):
            on_path = os.path.dirname(os.path.abspath(directory))
            break
    if on_path:
        candidates.add(on_path)
    found = []
    for path in sorted(set(os.path.normpath(c) for c in candidates)):
        if not os.path.isfile(os.path.join(path, "bin", "python")):
            continue
        infos = glob.glob(os.path.join(path, "lib", "python3*", "site-packages",
                                       "vllm-*.dist-info"))
        if infos:
            name = os.path.basename(sorted(infos)[-1])[len("vllm-"):-len(".dist-info")]
            found.append({"path": path, "vllm": name})
    return found


def pids_in(text):
    return set(int(pid) for pid in re.findall(r"pid=([0-9]+)", text))


def state_record(path):
    """The host's state record (``vllm_provision.state``) and, for every unit it snapshots
    (``started_from``), the unit's ActiveState and InvocationID now (systemd.exec(5),
    ``$INVOCATION_ID``); {"record": None} when the file is absent."""
    if not path:
        return {"record": None}
    text = read_text(path)
    if text is None:
        return {"record": None}
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the recursion limit
        return {"record": None, "error": "%s is not JSON (or nested too deeply)" % path}
    if not isinstance(record, dict):
        return {"record": None, "error": "%s is not a JSON object" % path}
    units = set()
    for entry in (record.get("hosts") or {}).values():
        if isinstance(entry, dict) and isinstance(entry.get("started_from"), dict):
            units.update(str(u) for u in entry["started_from"])
    invocations = {}
    for unit in sorted(units):
        out = run(["systemctl", "show", "-p", "ActiveState", "-p", "InvocationID", "--", unit])
        values = dict(line.split("=", 1) for line in out["stdout"].splitlines() if "=" in line)
        invocations[unit] = {"active": values.get("ActiveState", ""),
                             "invocation": values.get("InvocationID", "")}
    return {"record": record, "invocations": invocations}


class FactTimeout(Exception):
    """A fact module's probe ran past FACT_TIMEOUT_S."""


def _fact_timed_out(signum, frame):
    raise FactTimeout("it ran past %ss" % FACT_TIMEOUT_S)


def extra_facts(config):
    """Run every fact module's probe: name -> what it returned, as its own JSON text (the
    controller parses each apart, so one fact's answer, nested too deep for instance, cannot
    spoil the document), or None with a line of ERRORS where its source does not compile on
    this Python, it raised, exited or ran past FACT_TIMEOUT_S (timed in the main thread), or
    it returned what JSON cannot write or more than FACT_MAX_BYTES of it: one fact never costs
    the host its other facts. What a probe writes to standard output, from Python or from a
    program it runs, is dropped: standard output is the document's."""
    found = {}
    timed = hasattr(signal, "setitimer") and (
        threading.current_thread() is threading.main_thread())
    for name in sorted(EXTRA_FACTS):
        text = None
        try:
            namespace = {"__name__": "fact_" + name}
            exec(compile(EXTRA_FACTS[name], "<fact %s>" % name, "exec"), namespace)
            value = _quietly(namespace["probe_" + name], config, timed)
            text = json.dumps(value)
            if len(text) > FACT_MAX_BYTES:
                raise ValueError("its answer is %d bytes of JSON, over %d" % (len(text),
                                                                            FACT_MAX_BYTES))
        except (Exception, SystemExit) as exc:  # a fact module's fault: the probe goes on
            ERRORS.append("fact %s failed on the host: %s: %s"
                          % (name, type(exc).__name__, str(exc)[:500]))
            text = None
        found[name] = text
    return found


def _quietly(probe, config, timed):
    """probe(config) with standard output, Python's and file descriptor 1, sent to
    /dev/null, and under a FACT_TIMEOUT_S timer where ``timed``."""
    sys.stdout.flush()
    saved_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    saved, sys.stdout = sys.stdout, io.StringIO()
    os.dup2(null, 1)
    previous = signal.signal(signal.SIGALRM, _fact_timed_out) if timed else None
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, FACT_TIMEOUT_S)
        return probe(config)
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        sys.stdout = saved
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        os.close(null)


def main():
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    started = time.time()
    listener = None
    if config.get("listen"):
        spec = config["listen"]
        listener = Listener(spec["address"], int(spec["port"]), int(spec.get("expect", 1)),
                            float(spec.get("timeout_s", 10)))
    # The other ports this node serves its peers (API, watchdog): same short-lived listeners.
    listeners = [Listener(spec["address"], int(spec["port"]), int(spec.get("expect", 1)),
                          float(spec.get("timeout_s", 10))) for spec in config.get("listens", [])]
    reach_threads = []
    for target in config.get("connect", []):
        result = {}
        thread = threading.Thread(target=connect_until, args=(
            target["address"], int(target["port"]), float(target.get("timeout_s", 10)), result))
        thread.daemon = True
        thread.start()
        reach_threads.append((thread, result, target))

    smi = {}

    def smi_calls():
        smi["query_gpu"] = run(["nvidia-smi", "--query-gpu=" + config.get(
            "gpu_fields", "index,name,driver_version,memory.total,uuid,pci.bus_id"),
            "--format=csv,noheader,nounits"])
        if smi["query_gpu"]["rc"] == 127:
            return
        smi["health"] = run(["nvidia-smi", "--query-gpu=" + config.get(
            "health_fields", "index,memory.used,ecc.errors.uncorrected.aggregate.total,"
            "persistence_mode,mig.mode.current"), "--format=csv,noheader,nounits"])
        smi["header"] = run(["nvidia-smi"])
        smi["compute_apps"] = run(["nvidia-smi", "--query-compute-apps=" + config.get(
            "apps_fields", "pid,process_name,used_memory,gpu_uuid"),
            "--format=csv,noheader,nounits"])

    smi_thread = threading.Thread(target=smi_calls)
    smi_thread.daemon = True
    smi_thread.start()

    venv = config.get("venv", "")
    out = {
        "probe_version": 1,
        "probe_pid": os.getpid(),
        "python": {"executable": sys.executable, "version": sys.version},
        "venv_found": bool(config.get("venv_found")),
        "packages": package_versions(config.get("packages", [])),
        "hostname": resolve_hostname(),
        "ip_addr": run(["ip", "-j", "addr"]),
        "routes": dict((peer, run(["ip", "-j", "route", "get", peer]))
                       for peer in config.get("peers", [])),
        "shm": statvfs_bytes("/dev/shm"),
        "meminfo": read_text("/proc/meminfo") or "",
        "disk": statvfs_bytes(existing_parent(config.get("model_path") or "/")),
        "cpu_count": os.cpu_count(),
        "model": model_manifest(config.get("model_path", ""), bool(config.get("sha256")),
                                int(config.get("max_files", 20000))),
        "ss": run(["ss", "-Hltnp"]),
        "logind": logind_texts(),
        "login_defs": read_text("/etc/login.defs") or "",
        "user": service_user(config.get("service_user", "")),
        "nccl": nccl_settings(venv),
        "systemctl_version": run(["systemctl", "--version"]),
        "sshd_version": sshd_version(),
        "state": state_record(config.get("state_file", "")),
        "net_speeds": net_speeds(),
        "infiniband": infiniband(),
        "modules": read_text("/proc/modules") or "",
        "kernel_release": os.uname()[2],
        "os_release": read_text("/etc/os-release") or read_text("/usr/lib/os-release") or "",
        "xid": kernel_xid_lines(),
        "fabric": fabric_manager(),
        "clock": clock_sync(),
    }
    # the content fingerprint on every node, and on rank 0 the memory estimate's config.json
    # and headers, in one read of each file
    content = {"fingerprint": None, "weights": None}
    if config.get("content_max_bytes") or config.get("weights"):
        content = model_content(config.get("model_path", ""),
                                max(int(config.get("content_max_bytes", 0)),
                                    int(config.get("weights_max_bytes", 0))),
                                bool(config.get("weights")))
    out["content"] = content["fingerprint"] if config.get("content_max_bytes") else None
    out["weights"] = content["weights"]
    if config.get("venv_search"):
        out["venvs"] = vllm_venvs(config["venv_search"])
    out.update(torch_runtime(bool(config.get("nccl_loaded")),
                             bool(config.get("torch_cuda_runtime"))))
    smi_thread.join(60)
    out["nvidia_smi"] = smi
    cgroup_pids = pids_in(out["ss"]["stdout"])
    for line in smi.get("compute_apps", {}).get("stdout", "").splitlines():
        first = line.split(",")[0].strip()
        if first.isdigit():
            cgroup_pids.add(int(first))
    # null: the process exited between `ss` and this read (a unit restarting), so it holds
    # nothing any more (facts.gather drops its sockets)
    out["cgroups"] = dict((str(pid), read_text("/proc/%d/cgroup" % pid))
                          for pid in sorted(cgroup_pids))
    for thread, _result, target in reach_threads:
        thread.join(float(target.get("timeout_s", 10)) + 2)
    out["reach"] = [result for _thread, result, _target in reach_threads if result]
    out["listener"] = listener.finish() if listener is not None else None
    out["listeners"] = [item.finish() for item in listeners]
    out["extra"] = extra_facts(config)
    out["errors"] = ERRORS
    out["elapsed_s"] = round(time.time() - started, 3)
    # on a line of its own, whatever was written before it: the controller reads the last line
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
