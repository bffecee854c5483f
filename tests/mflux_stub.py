"""A stand-in for mflux-generate that honours its arguments, for the external backend's tests.

It is a real program run as a subprocess, as mflux would be. `--behave`
chooses how it ends: ok (a PNG of the requested size), fail (exit 3 with a
message), nothing (exit 0 without writing), hang (print one step, then sleep).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from PIL import Image


def main() -> int:
    parser = argparse.ArgumentParser(prog="mflux-generate")
    parser.add_argument("--base-model", choices=["dev", "schnell", "z-image-turbo"], required=True)
    parser.add_argument("--model")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--guidance", type=float, default=3.5)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--behave", choices=["ok", "fail", "nothing", "hang"], default="ok")
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    if args.behave == "fail":
        print("RuntimeError: out of memory while loading the transformer", file=sys.stderr)
        return 3
    if args.behave == "hang":
        print("  0%|          | 1/10 [00:01<00:09]", file=sys.stderr, flush=True)
        time.sleep(600)
    for step in range(1, args.steps + 1):
        # tqdm redraws its bar in place with carriage returns.
        print(
            f"\r{step * 100 // args.steps}%| | {step}/{args.steps} [00:00]", end="", file=sys.stderr
        )
        sys.stderr.flush()
        time.sleep(0.01)
    print(file=sys.stderr)
    if args.behave == "ok":
        key = f"{args.base_model}|{args.model}|{args.prompt}|{args.seed}".encode()
        colour = tuple(hashlib.sha256(key).digest()[:3])
        Image.new("RGB", (args.width, args.height), colour).save(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
