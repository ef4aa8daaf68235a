"""Starting, probing and stopping the testbed's server processes.

Each server runs in its own session (``start_new_session``) so that ``kubecell testbed up`` can return
while they keep running, and logs to a file in the state directory. A process is identified by its pid
*and* its executable, so ``down`` never signals an unrelated process that reused a pid after a reboot.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from kubecell.core.errors import KubecellError


class TestbedError(KubecellError):
    """A testbed server failed to start or answer; the message names the log to read."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def spawn(command: Sequence[str], log: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


def alive(pid: int, executable: str | None = None) -> bool:
    """Whether ``pid`` runs (and, when given, runs ``executable``; zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if executable is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and os.path.basename(cmdline[0].decode(errors="replace")) == os.path.basename(executable)


def stop(pid: int, executable: str | None = None, *, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; a no-op for a process that is gone."""
    if not alive(pid, executable):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def terminate(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, SIGKILL after ``grace`` s; by the Popen object, so a process is never mistaken for another."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def tail(log: Path, lines: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_http(url: str, *, process: subprocess.Popen[bytes] | None, log: Path, timeout: float,
              token: str | None = None, ca: Path | None = None, verify: bool = True) -> None:
    """Poll ``url`` until it answers 200; fail early with the log when the process dies.

    ``verify=False`` is for health probes of servers that serve a self-signed certificate of their own
    (kube-scheduler's secure port), where the probe only asks whether the process is up."""
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise TestbedError(f"{log.stem} exited with status {process.returncode} "
                               f"while starting (log {log}):\n{tail(log)}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2,
                                        context=context) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            last = f"HTTP {error.code}"
        except (OSError, ssl.SSLError) as error:
            last = str(error)
        time.sleep(0.2)
    raise TestbedError(f"{url} not ready after {timeout:.0f} s ({last}); log {log}:\n{tail(log)}")
