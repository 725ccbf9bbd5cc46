"""tests/gpu_workers/run_pair.py: the pair starts again on other ports when the coordinator's
port was taken before it bound (nothing ran), and only then. Real processes, on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_workers"))

import run_pair as pairs  # noqa: E402

# Each rank records its attempt; on the attempts listed in FAIL it fails with MESSAGE before any
# RESULT line, as a coordinator whose port was taken does; otherwise it reports its port.
WORKER = '''
import json, sys
from pathlib import Path
rank, port, directory, message, fail = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], sys.argv[5]
attempt = len(list(directory.glob(f"rank{rank}-*")))
(directory / f"rank{rank}-{attempt}").write_text(port)
if str(attempt) in fail.split(","):
    print(message)
    sys.exit(1)
print("RESULT " + json.dumps({"rank": int(rank), "port": port, "attempt": attempt}))
'''


def start(tmp_path, message: str, fail: str):
    worker = tmp_path / "pair_worker"   # a script (Python runs it by path, extension or not)
    worker.write_text(WORKER)
    marks = tmp_path / "marks"
    marks.mkdir()
    results, logs = pairs.run_pair(str(worker), [str(marks), message, fail], timeout=60)
    return results, logs, sorted(p.name for p in marks.iterdir()), marks


def test_a_taken_port_starts_the_pair_again_on_other_ports(tmp_path):
    taken = "Failed to add port to server: Error in bind for address '[::]:44253': Address already in use"
    results, logs, marks, directory = start(tmp_path, taken, "0")
    assert marks == ["rank0-0", "rank0-1", "rank1-0", "rank1-1"]
    assert sorted((r["rank"], r["attempt"]) for r in results) == [(0, 1), (1, 1)]
    first, second = (directory / "rank0-0").read_text(), (directory / "rank0-1").read_text()
    assert first != second   # other ports the second time
    assert all(r["port"] == second for r in results)


def test_a_port_taken_every_time_gives_up_after_the_attempts(tmp_path):
    taken = "Address already in use"
    results, logs, marks, _ = start(tmp_path, taken, ",".join(map(str, range(pairs.PORT_ATTEMPTS + 1))))
    assert results == []
    assert len(marks) == 2 * pairs.PORT_ATTEMPTS
    assert all(taken in log for log in logs)


def test_another_failure_is_not_run_again(tmp_path):
    results, logs, marks, _ = start(tmp_path, "RuntimeError: NCCL error", "0")
    assert results == []
    assert marks == ["rank0-0", "rank1-0"]
    assert all("NCCL error" in log for log in logs)


def test_free_port_is_free_on_the_wildcard_address():
    import socket

    port = pairs.free_port()
    with socket.socket() as s:
        s.bind(("", port))   # the coordinator binds the wildcard: the port must be free there
