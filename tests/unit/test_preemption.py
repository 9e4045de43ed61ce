"""StopRequest (train/preemption.py) on its own. Each case runs in a fresh process, so the signals
it sends itself and the handlers it installs touch no test runner."""

import json
import signal
import subprocess
import sys

from helpers import REPO, process_env

from tfm_jax.train import preemption

SCRIPT = """
import json, os, signal, sys
from tfm_jax.train import preemption

out = {}
if sys.argv[1] in ("several_hosts", "service_off"):
    # JAX's preemption service owns SIGTERM on several hosts; a Python handler stands in for it
    caught = []
    signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    preemption.jax.process_count = lambda: 2  # as jax.distributed.initialize leaves it
    stop = preemption.StopRequest()
    stop.request_everywhere(signal.SIGPIPE, "stdout's reader went away (SIGPIPE)")
    stop.request_everywhere(signal.SIGPIPE, "stdout's reader went away (SIGPIPE)")
    out["sigterms_sent"] = len(caught)
    out["stops_alone"] = stop.requested  # it must not: the other hosts would hang
    stop.arm_for_save(signal.SIGTERM)  # what the loop does once the service agrees on a step
    out["stopped_by"] = stop.name
elif sys.argv[1] == "one_host":
    before = signal.getsignal(signal.SIGTERM)
    with preemption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.request(signal.SIGPIPE, "too late")  # the first stop's reason is kept
        out["stopped_by"] = stop.name
    out["handler_restored"] = signal.getsignal(signal.SIGTERM) is before
elif sys.argv[1] == "one_host_reader_gone":
    caught = []
    signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    with preemption.StopRequest() as stop:
        stop.request_everywhere(signal.SIGPIPE, "stdout's reader went away (SIGPIPE)")
        out["stopped_by"] = stop.name  # at once: no other host to agree with
    out["sigterms_sent"] = len(caught)
elif sys.argv[1] == "twice":
    with preemption.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        out["survived"] = True
print(json.dumps(out))
"""


def run(case: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = process_env(**env_vars)
    return subprocess.run([sys.executable, "-c", SCRIPT, case], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_closed_stdout_on_several_hosts_asks_every_host_once_and_the_lead_says_sigpipe():
    p = run("several_hosts")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == {
        "sigterms_sent": 1,
        "stops_alone": False,
        "stopped_by": "SIGPIPE",
    }
    assert p.stderr.count("stopping every host at a step they agree on") == 1, p.stderr
    assert preemption.EXIT_CODES["SIGPIPE"] == 141 and preemption.EXIT_CODES["SIGTERM"] == 75


def test_with_jaxs_preemption_service_off_a_closed_stdout_sends_no_sigterm():
    """SIGTERM would then kill the lead alone and hang the other hosts: it trains on, as it says."""
    p = run("service_off", JAX_ENABLE_PREEMPTION_SERVICE="false")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == {
        "sigterms_sent": 0,
        "stops_alone": False,
        "stopped_by": "SIGPIPE",
    }
    assert "training on without progress lines, as JAX's preemption service is off" in p.stderr


def test_a_closed_stdout_on_one_host_stops_it_at_once_without_a_signal():
    p = run("one_host_reader_gone")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == {"stopped_by": "SIGPIPE", "sigterms_sent": 0}
    assert "stdout's reader went away (SIGPIPE): stopping after this step" in p.stderr


def test_one_host_keeps_the_first_stops_reason_and_restores_the_handler():
    p = run("one_host")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == {"stopped_by": "SIGTERM", "handler_restored": True}
    assert "SIGTERM: stopping after this step with a checkpoint" in p.stderr, p.stderr


def test_a_second_signal_exits_at_once():
    p = run("twice")
    assert p.returncode == 128 + signal.SIGINT, (p.returncode, p.stderr[-3000:])
    assert p.stdout == ""  # it never got past the second signal
    assert "SIGINT again: exiting now without finishing the checkpoint" in p.stderr, p.stderr
