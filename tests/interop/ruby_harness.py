"""Running tests/interop/client.rb (the Ruby client built on the protos) from the interop tests.

- `ensure_ruby()`: `make -s interop-deps` (Debian's ruby-grpc and ruby-grpc-tools when missing, the Ruby stubs
  of proto/*.proto in build/ruby); quick when both are there.
- `ruby(*argv, broker=..., expect=0)`: one run as a subprocess with a timeout; its JSON output (stdout), after
  checking its exit status (0, or 2 for a refusal the test expects).
- `payloads(seed, n)`: binary payloads for round trips (every byte value, an empty one, one that is not UTF-8).

Invariants: every run is bounded (RUBY_TIMEOUT_S, and the client's own gRPC deadlines); nothing sleeps.
"""
from __future__ import annotations

import base64
import json
import os
import random
import subprocess

RUBY_TIMEOUT_S = 30.0    # one client.rb run, start to exit (its calls have 15 s deadlines of their own)
DEPS_TIMEOUT_S = 600.0   # make interop-deps on a machine without Ruby: apt-get update and install
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT_RB = os.path.join(REPO, "tests", "interop", "client.rb")


def ensure_ruby() -> None:
    subprocess.run(["make", "-s", "interop-deps"], cwd=REPO, check=True, timeout=DEPS_TIMEOUT_S)


def ruby(*argv: str, broker: str, expect: int = 0) -> dict:
    p = subprocess.run(["ruby", CLIENT_RB, "--broker", broker, *argv], capture_output=True, text=True,
                       timeout=RUBY_TIMEOUT_S)
    assert p.returncode == expect, f"client.rb {' '.join(argv)} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def payloads(seed: int, n: int) -> list[bytes]:
    """`n` >= 3 binary payloads of 0..1500 bytes: every byte value, an empty one, one that is not UTF-8."""
    rng = random.Random(seed)
    return [bytes(range(256)), b"", b"\xff\xfe\x00 not utf-8"] + [rng.randbytes(rng.randint(1, 1500))
                                                                 for _ in range(n - 3)]


def write_json(path, value) -> str:
    path.write_text(json.dumps(value))
    return str(path)
