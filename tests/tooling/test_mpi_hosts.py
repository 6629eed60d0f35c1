"""Two MPI ranks on two "hosts": network namespaces joined by a veth pair, launched by hydra.

Each namespace has its own address (10.231.0.1 and 10.231.0.2, visible only inside the two
namespaces) and its own hostname (a UTS namespace), so hydra and MPICH see two hosts: hydra's
``ssh`` launcher is replaced (``-launcher-exec``) by a script that enters the host's
namespaces instead of logging in, exactly where ssh would run the proxy. ``UCX_TLS=tcp``
keeps UCX from its shared-memory transports (it would otherwise notice the one machine), so
the data really crosses the veth, which the test checks from the link's byte counters.
Skips, saying why, where namespaces cannot be made (not root, no ``ip`` or ``unshare``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from cli_helpers import mpiexec  # noqa: E402

FLAGS = ("--rounds", "3", "-H", "5", "--hidden-sizes", "16", "--seed", "4", "--save-params", "params.npz")
HOSTS = {"10.231.0.1": "a", "10.231.0.2": "b"}  # address -> namespace suffix

LAUNCHER = """#!/bin/sh
# hydra runs "THIS [-x] HOST COMMAND..." where it would run ssh: run COMMAND in HOST's namespaces.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case $host in
%s
  *) echo "no namespace for host $host" >&2; exit 1 ;;
esac
exec %s netns exec "$ns" %s --uts sh -c "hostname $ns && exec $*"
"""


def _tool(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """``{address: namespace}`` of two namespaces joined by a veth pair; deleted afterwards."""
    ip, unshare = _tool("ip"), _tool("unshare")
    if os.geteuid() != 0 or ip is None or unshare is None:
        pytest.skip("network namespaces need root, `ip` and `unshare`"
                    f" (euid {os.geteuid()}, ip {ip}, unshare {unshare})")
    tag = f"dl{os.getpid() % 100000}"
    spaces = {address: f"{tag}{suffix}" for address, suffix in HOSTS.items()}
    made = []
    try:
        for space in spaces.values():
            done = _run(ip, "netns", "add", space)
            if done.returncode != 0:
                pytest.skip(f"cannot make a network namespace: {done.stderr.strip()}")
            made.append(space)
        (first, a), (second, b) = spaces.items()
        steps = [("link", "add", f"{a}v", "type", "veth", "peer", "name", f"{b}v"),
                 ("link", "set", f"{a}v", "netns", a), ("link", "set", f"{b}v", "netns", b),
                 ("-n", a, "addr", "add", f"{first}/24", "dev", f"{a}v"),
                 ("-n", b, "addr", "add", f"{second}/24", "dev", f"{b}v"),
                 *[("-n", s, "link", "set", dev, "up") for s in (a, b) for dev in ("lo", f"{s}v")]]
        for step in steps:
            done = _run(ip, *step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield ip, unshare, spaces
    finally:
        for space in made:  # deleting a namespace deletes its end of the veth, and so the pair
            _run(ip, "netns", "del", space)


def _received(ip: str, space: str) -> int:
    stats = Path(f"/sys/class/net/{space}v/statistics/rx_bytes")  # not visible from here: ask inside
    done = _run(ip, "netns", "exec", space, "cat", str(stats))
    return int(done.stdout)


def _job(argv: list, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the MPI job hung:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_two_ranks_on_two_namespace_hosts_equal_the_one_host_run_bit_for_bit(two_hosts, tmp_path):
    ip, unshare, spaces = two_hosts
    cases = "\n".join(f"  {address}) ns={space} ;;" for address, space in spaces.items())
    launcher = tmp_path / "netns-launcher.sh"
    launcher.write_text(LAUNCHER % (cases, ip, unshare))
    launcher.chmod(0o755)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    command = [sys.executable, "-m", "diloco.tools.cli.mpi", *FLAGS]
    one = _job([mpiexec(), "-n", "2", *command], tmp_path / "one")
    assert one.returncode == 0, one.stderr
    (first, a), (second, _) = spaces.items()
    before = {space: _received(ip, space) for space in spaces.values()}
    hydra = [mpiexec(), "-hosts", f"{first},{second}", "-launcher", "ssh", "-launcher-exec", str(launcher),
             "-genv", "UCX_TLS", "tcp", "-n", "2", *command]
    two = _job([ip, "netns", "exec", a, unshare, "--uts", "sh", "-c",
                f"hostname {a} && exec {' '.join(hydra)}"], tmp_path / "two")
    assert two.returncode == 0, two.stderr
    assert "DiLoCo on 2 MPI processes" in two.stdout
    received = {space: _received(ip, space) - before[space] for space in spaces.values()}
    # 3 all-reduces of 16-wide digits MLP (1,210 float64 values): each rank receives
    # (K-1)/K N b twice (reduce-scatter, all-gather) = 9,680 bytes a round, over the veth.
    assert all(count > 3 * 9680 for count in received.values()), received
    with np.load(tmp_path / "one" / "params.npz") as want, np.load(tmp_path / "two" / "params.npz") as got:
        assert list(got) == list(want)
        assert all(got[key].tobytes() == want[key].tobytes() for key in want)
