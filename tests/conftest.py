"""Session hooks: the CUDA simulator's tests start as soon as collection ends.

``test_cuda_sim.py::test_cuda_kernels_on_the_simulator`` runs ``tests/cudasim`` in
a subprocess (the simulator must be switched on before numba is imported). That
run is single-threaded Python and takes minutes, so it starts when collection
finishes, on whatever core the main run leaves idle, and the test only waits for
it and checks what it printed. A session that never reaches the test (``-x``,
Ctrl-C) ends the subprocess.
"""

from __future__ import annotations

import sys

SIMULATOR_TEST = "test_cuda_sim.py::test_cuda_kernels_on_the_simulator"


def pytest_collection_finish(session):
    if any(item.nodeid.endswith(SIMULATOR_TEST) for item in session.items):
        from test_cuda_sim import SIMULATOR_RUN, SimulatorRun
        session.config.stash[SIMULATOR_RUN] = SimulatorRun()


def pytest_sessionfinish(session):
    if "test_cuda_sim" not in sys.modules:
        return
    run = session.config.stash.get(sys.modules["test_cuda_sim"].SIMULATOR_RUN, None)
    if run is not None and run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()
