"""``vllm`` entry point of the stand-in: ``vllm --version`` and ``vllm serve MODEL [flags]``."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from .args import ConfigError, ServeConfig, parse, resolve
from .common import STANDIN_NOTE, load_spec, log


def main(argv: list[str] | None = None) -> int:
    """Run the stand-in ``vllm`` command; return the process exit status."""
    argv = sys.argv[1:] if argv is None else argv
    spec = load_spec()
    if argv[:1] in (["--version"], ["-v"]):
        log("INFO", "__init__.py:1", STANDIN_NOTE)
        print(spec["vllm"])
        return 0
    if argv[:1] != ["serve"]:
        sys.stderr.write("usage: vllm [-h] [-v] {serve} ...\n"
                         f"vllm: error: argument subparser: invalid choice: "
                         f"'{argv[0] if argv else ''}' (lab stand-in knows: 'serve')\n")
        return 2
    namespace = parse(argv[1:], spec)
    log("INFO", "__init__.py:1", f"vLLM {spec['vllm']}: {STANDIN_NOTE}")
    try:
        config = resolve(namespace, spec)
    except ConfigError as exc:
        log("ERROR", "serve.py:1", "Error in vllm serve")
        sys.stderr.write(f"ValueError: {exc}\n")
        return 1
    log("INFO", "api_server.py:1", f"vLLM API server version {spec['vllm']}")
    log("INFO", "utils.py:1", f"non-default args: {vars(namespace)}")
    try:
        if config.headless or (config.node_rank > 0 and not config.hybrid):
            from .mp import run_headless

            return run_headless(config, spec)
        return serve(config, spec)
    except Exception as exc:  # noqa: BLE001 - Ray's errors too; vLLM also ends with one line
        log("ERROR", "core.py:1", "EngineCore failed to start.")
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1


def serve(config: ServeConfig, spec: dict[str, Any]) -> int:
    """Bring the engine up (rendezvous or Ray placement, then load), then serve HTTP."""
    from .server import Api, make_server

    start = time.monotonic()
    if config.backend == "ray":
        from .ray_engine import RayEngine

        engine: Any = RayEngine(config, spec)
        engine.start()
        step = engine.step
    elif config.nnodes > 1 and config.node_rank > 0:
        from .mp import HybridMember

        engine = HybridMember(config, spec)
        engine.join()
        step = engine.step
    elif config.nnodes > 1:
        from .mp import Master

        engine = Master(config, spec)
        engine.rendezvous()
        step = engine.step
    else:
        from .mp import load

        load(spec, config, "rank 0")

        def step() -> None:
            return None

    def on_dead() -> None:
        log("ERROR", "async_llm.py:1", "AsyncLLM output_handler failed. EngineDeadError: "
            "EngineCore encountered an issue. See stack trace (above) for the root cause.")
        time.sleep(1.0)
        log("INFO", "launcher.py:1", "Shutting down FastAPI HTTP server.")
        os._exit(0)  # measured: rank 0 exits with status 0 after a peer died

    api = Api(config, spec, step, on_dead)
    server = make_server(api)
    log("INFO", "core.py:1", "init engine (profile, create kv cache, warmup model) took "
        f"{time.monotonic() - start:.2f} s")
    host = config.host or "0.0.0.0"
    log("INFO", "entry.py:1", f"Starting vLLM server on http://{host}:{config.port}")

    def shutdown(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    log("INFO", "launcher.py:1", "Application startup complete.")
    server.serve_forever()
    log("INFO", "launcher.py:1", "Shutting down FastAPI HTTP server.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
