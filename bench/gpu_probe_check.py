"""Real-GPU check of the host agent's probe: NVML snapshot (and optionally a load window), judged, as JSON.

    python -m bench.gpu_probe_check                               # snapshot + verdict
    python -m bench.gpu_probe_check --expected-count 8 --expected-model H200 --stress 30
    python -m bench.gpu_probe_check --stress 120 --dcgm-level 1   # dcgmi diag -r 1 when dcgmi is on PATH

Runs `activities.gpu.activities.NvmlProbe` directly (no Temporal): what `host_gpu_check` / `host_gpu_stress` would see on
this machine. Prints one JSON document {"host", "snapshot", "stress", "verdict", "unsupported", "errors"} on
stdout, progress on stderr. Exit code: 0 verdict passed, 1 verdict failed, 2 NVML unavailable (no driver).
Not a test: it asserts nothing about the hardware.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import socket
import sys

from activities.gpu.activities import LoadWindow
from activities.gpu.models import GpuCheckRequest, StressRequest
from activities.gpu.nvml import NvmlProbe
from activities.gpu.probe import NvmlUnavailableError
from activities.gpu.verdict import gpu_verdict


async def main_async(args: argparse.Namespace) -> int:
    host = args.host or socket.gethostname()
    probe = NvmlProbe(stress_command=shlex.split(args.stress_command) if args.stress_command else None)
    expected = GpuCheckRequest(expected_count=args.expected_count, expected_model=args.expected_model,
                               expected_mig=None if args.any_mig else False)  # fmt: skip
    out: dict = {"host": host, "facts": await probe.host_facts(), "load_tools": probe.load_tools()}
    try:
        before = (await probe.snapshot()).model_copy(update={"host": host})
        stress = after = None
        if args.stress:

            def tick(progress: dict) -> None:
                print(f"load: {json.dumps(progress)}", file=sys.stderr, flush=True)

            window = LoadWindow(probe, StressRequest(seconds=args.stress, dcgm_level=args.dcgm_level), on_tick=tick)
            stress = (await window.run()).model_copy(update={"host": host})
            after = (await probe.snapshot()).model_copy(update={"host": host})
    except NvmlUnavailableError as err:
        out["nvml_error"] = str(err)
        print(json.dumps(out, indent=2))
        return 2
    verdict = gpu_verdict(expected, before, after, stress)
    out.update(
        snapshot=before.model_dump(mode="json"),
        after=after.model_dump(mode="json") if after else None,
        stress=stress.model_dump(mode="json") if stress else None,
        verdict=verdict.model_dump(mode="json"),
        summary=verdict.summary(),
        # what NVML could not answer on this GPU/driver, to compare with the simulated probe
        unsupported=sorted({f for g in before.gpus for f in g.unsupported}),
        errors=sorted({f"{k}: {v}" for g in before.gpus for k, v in g.errors.items()}),
    )
    print(json.dumps(out, indent=2))
    return 0 if verdict.passed else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_probe_check", description=__doc__.split("\n")[0])
    p.add_argument("--host", help="name to report (default: the hostname)")
    p.add_argument("--expected-count", type=int)
    p.add_argument("--expected-model", help="part of the NVML name, e.g. H200")
    p.add_argument("--any-mig", action="store_true", help="do not require MIG off")
    p.add_argument("--stress", type=float, default=0, metavar="SECONDS", help="also run a load window this long")
    p.add_argument("--dcgm-level", type=int, choices=[1, 2, 3, 4])
    p.add_argument("--stress-command", help="load command, '{seconds}' replaced (default: gpu_burn/dcgmproftester)")
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
