"""A worker dying mid-training with the hook registered: ddp-agent restarts the group and the job finishes."""

import re
from datetime import datetime

import pytest

from e2e_helpers import TRAIN, clean_env, collective_events, param_digests, run

STOP_TIMEOUT_S = 20


def log_time(stderr, pattern):
    """The time= of the first agent log line matching pattern."""
    for line in stderr.splitlines():
        if re.search(pattern, line):
            m = re.search(r"time=(\S+)", line)
            return datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    return None


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_worker_dies_agent_restarts(how, agent_bin, python, shim_path, tmp_path):
    """Rank 1 fails at step 12 while rank 0 is in the step's all-reduce.

    raise: RuntimeError, so the interpreter exits normally (atexit handlers,
    ddp_agent's included, run; none may wait for the peer). exit: os._exit(3),
    an abrupt death. Either way the agent sees the failure at once, the
    survivor stops within the grace period, and attempt 1 resumes from the
    step 10 checkpoint and finishes, the hook working again.
    """
    fail = ["--exit-code", "3"] if how == "exit" else []
    r = run([agent_bin, "run", "--standalone", "--nproc-per-node", "2", "--python", python, "--max-restarts", "1",
             "--stop-timeout", "%ds" % STOP_TIMEOUT_S,
             TRAIN, "--steps", "14", "--ckpt-every", "5", "--log-every", "5", "--ckpt-dir", str(tmp_path),
             "--comm-hook", "ddp-agent", "--fail-rank", "1", "--fail-at-step", "12", *fail],
            timeout=90, env=clean_env(),
            hint="(a normal run takes ~15 s: does a rank hang at exit, e.g. in an atexit handler waiting for its peer?)")
    assert r.returncode == 0, r.logs()
    out = r.output
    for want in ("injected failure on rank 1 at step 12", "restarting worker group", "resumed from step 10",
                 "[rank0]:done: steps=14"):
        assert want in out, "lacks %r\n%s" % (want, r.logs())
    # The survivor, blocked in the hook's all-reduce when its peer died, stopped within the grace period.
    assert "did not stop within the grace period" not in out, r.logs()
    failed = log_time(r.stderr, r'msg="worker failed"')
    restarted = log_time(r.stderr, r'msg="workers started".*attempt=1')
    assert failed and restarted, r.logs()
    gap = (restarted - failed).total_seconds()
    assert gap < STOP_TIMEOUT_S / 2, "restart took %.1fs after the failure\n%s" % (gap, r.logs())
    digests = param_digests(r.stdout)
    assert set(digests) == {0, 1} and digests[0] == digests[1], r.logs()
    # Both attempts' hooks reached the agent.
    events = {gen: received for gen, received, _ in collective_events(r.stderr)}
    assert events.get(0, 0) > 0 and events.get(1, 0) > 0, r.logs()
