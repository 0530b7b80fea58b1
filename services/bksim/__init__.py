"""bksim: a faithful, runnable Apache BookKeeper cluster."""
import os as _os

# gRPC's fork handlers, run when a process with gRPC threads forks a child that runs Python before it execs
# (subprocess.Popen with preexec_fn, as PySpark starts its JVM), can make that child die before its exec
# (grpc/grpc#43055: about 1 in 40 such children here). No bksim process forks a child that uses gRPC, so the
# handlers are off unless the environment says otherwise. Read when gRPC initialises: set before it is imported.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
