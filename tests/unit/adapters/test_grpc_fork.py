"""A process that has imported bksim can start children that run Python before their exec (subprocess.Popen with
preexec_fn, as PySpark starts its JVM) while gRPC threads are busy: none of them dies before its exec. With gRPC's
fork handlers on, about 1 in 40 did (grpc/grpc#43055)."""
from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r'''
import bksim  # before grpc
import subprocess, sys, threading
from concurrent import futures
import grpc
from bksim.gen import perf_echo_pb2, perf_echo_pb2_grpc

class Echo(perf_echo_pb2_grpc.PerfEchoServicer):
    def Echo(self, requests, context):
        for r in requests:
            yield perf_echo_pb2.EchoAck(batch_id=r.batch_id)

server = grpc.server(futures.ThreadPoolExecutor(4))
perf_echo_pb2_grpc.add_PerfEchoServicer_to_server(Echo(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
stop, answered = threading.Event(), threading.Event()

def stream():
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    def requests():
        i = 0
        while not stop.is_set():
            i += 1
            yield perf_echo_pb2.EchoRequest(batch_id=i)
    for ack in perf_echo_pb2_grpc.PerfEchoStub(channel).Echo(requests()):
        answered.set()

threading.Thread(target=stream, daemon=True).start()
if not answered.wait(30):  # the stream runs: gRPC's threads are busy while the children are forked
    sys.exit("the echo stream never answered")
failed = sum(subprocess.Popen(["/bin/true"], preexec_fn=lambda: None).wait() != 0 for _ in range(int(sys.argv[1])))
print(f"failed {failed}", flush=True)
stop.set()
server.stop(None)
'''


def test_children_forked_while_grpc_is_busy_all_reach_their_exec():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, "300"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed 0" in done.stdout, done.stdout + done.stderr[-2000:]
