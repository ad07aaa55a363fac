"""``python -m lab.k8s``: run the Kubernetes API emulator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from .server import load_token_file, serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.k8s", description="Kubernetes API emulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file")
    p.add_argument("--seed", action="append", default=[], help="objects/fleet file (JSON or YAML); repeatable")
    p.add_argument("--state-file", help="load at start if present, save on SIGTERM/SIGINT")
    p.add_argument("--pod-start-seconds", type=float)
    p.add_argument("--grace-scale", type=float)
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--token-auth-file",
        help="CSV token,user,uid (kube-apiserver's): audit entries name each caller; other tokens answer 401",
    )
    a = p.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = {}
    if a.pod_start_seconds is not None:
        cfg["podStartSeconds"] = a.pod_start_seconds
    if a.grace_scale is not None:
        cfg["graceScale"] = a.grace_scale
    users = load_token_file(a.token_auth_file) if a.token_auth_file else None
    asyncio.run(serve(a.host, a.port, a.ready_file, a.seed, a.state_file, cfg, users))
    return 0


if __name__ == "__main__":
    sys.exit(main())
