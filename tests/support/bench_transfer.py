"""Copy throughput between two agents on loopback vs a plain file copy on the same disk.

    .venv/bin/python tests/support/bench_transfer.py [--model DIR] [--runs 3] [--before DIR] [--no-plain] [--warmup 1]

`--warmup N` untimed copies per side come first. `--before DIR`: a checkout of an earlier
pipeserve (`git worktree add DIR <commit>`) whose agents are measured in the same run,
alternating with this one's, for a before/after under the same load. Contenders: one
source agent, and two source agents holding the same model (the copy takes files or byte
ranges from both).

Default model: the SmolLM2 demo import in the pipeserve cache (~540 MB; made with
`pipeserve import-demo-model` when absent). Both sides run with a warm page cache (the
source files were just read), so the comparison is of the copy paths, not of the disk. The
agent copy includes what a real transfer does: HTTP streaming, sha256 of every byte on the
receiver, fsync, and the atomic move into place.

Where the time goes (this checkout's receiver only: its `copy.timing` log line per copy):
`last byte` and `verified` are when the last byte landed and the last block/file matched,
from the copy's start; `hash` is the hashers' busy time summed over threads; `fsync` and
`rename` the installs'; [CPU s] the receiver and hasher threads' own CPU time; `rest` is
the job around the copy (request, ticket, the model directory's move into place and
manifest record, the client's progress polls)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.proc import free_port


def default_model() -> Path:
    from orchestrator.models.demo import cache_root, import_demo_model

    found = sorted(cache_root().glob("demo-model-float32-*"))
    if found and (found[-1] / "config.json").is_file():
        return found[-1]
    return import_demo_model(cache_root() / "demo-model-float32-bench", dtype="float32")


def plain_copy(src: Path, dst: Path, fsync: bool) -> float:
    t0 = time.perf_counter()
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
        if fsync:
            fd = os.open(dst / f.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return time.perf_counter() - t0


def start_agent(root: Path, name: str, code: Path | None = None) -> tuple[subprocess.Popen, AgentClient]:
    port = free_port()
    (root / name / "models").mkdir(parents=True, exist_ok=True)
    log = open(root / f"{name}.log", "wb")
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None  # that checkout's agent
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "agent", "--port", str(port), "--name", name,
                             "--models-dir", str(root / name / "models"), "--state-dir", str(root / name / "state"),
                             "--no-advertise"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=code, env=env)
    client = AgentClient(f"http://127.0.0.1:{port}", timeout=600)
    for _ in range(400):
        try:
            client.identity()
            break
        except AgentError:
            time.sleep(0.05)
    token = re.search(r"pairing token: (\S+)", (root / f"{name}.log").read_text()).group(1)
    client.pair(token)
    return proc, client


def start_side(root: Path, model: Path, code: Path | None, tag: str) -> dict:
    """Three agents of one checkout: a and c hold the model (hard links), b receives copies."""
    agents = {n: start_agent(root / tag, n, code) for n in ("a", "b", "c")}
    for n in ("a", "c"):
        shutil.copytree(model, root / tag / n / "models" / "m", copy_function=os.link)
    clients = {n: c for n, (_, c) in agents.items()}
    manifest = clients["a"].model("m").manifest
    clients["c"].model("m")  # both sources hash once, before any clock runs
    return {"tag": tag, "root": root / tag, "agents": agents, "manifest": manifest, "multi": code is None}


TIMING = re.compile(r"copy\.timing .*")


def last_timing(log: Path) -> dict[str, float]:
    """The fields of the receiver's latest `copy.timing` line (empty for a checkout without it)."""
    lines = TIMING.findall(log.read_text(errors="replace"))
    if not lines:
        return {}
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:] if "=" in kv)
    return {k: float(v) for k, v in fields.items() if re.fullmatch(r"[0-9.]+", v)}


def copy_once(side: dict, size: int, breakdown: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """One verified copy to b from a, then (this checkout only) from a and c at once."""
    a, b, c = (side["agents"][n][1] for n in ("a", "b", "c"))
    out = {}
    for sources in ([a], [a, c]) if side["multi"] else ([a],):
        shutil.rmtree(side["root"] / "b" / "models" / "m", ignore_errors=True)
        t0 = time.perf_counter()
        if len(sources) > 1:
            b.fetch_from_peers("m", sources, side["manifest"])
        else:
            b.fetch_from_peer("m", a, side["manifest"])
        done = b.wait_download("m", timeout=600, poll_s=0.02)
        key = f"{side['tag']} {len(sources)} peer{'s' if len(sources) > 1 else ''}"
        out[key] = time.perf_counter() - t0
        assert done.state == "done" and done.transferred_bytes >= size, done
        timing = last_timing(side["root"] / "b.log")
        if timing:
            breakdown.setdefault(key, []).append({**timing, "wall": out[key]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path.home(),
                        help="where the copies go (default: home, the disk of the pipeserve cache)")
    parser.add_argument("--before", type=Path, default=None, help="an earlier checkout to compare with")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain file copies")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed copies per side first (an agent's first copy pays one-time costs: 2.3-2.8 s "
                             "instead of ~0.9 s for the old agent)")
    args = parser.parse_args()
    model = args.model or default_model()
    size = sum(f.stat().st_size for f in model.iterdir() if f.is_file())
    mb = size / 1e6
    print(f"model {model} ({mb:.0f} MB, {len(list(model.iterdir()))} files) -> copies in {args.dir}")
    with tempfile.TemporaryDirectory(prefix="bench-transfer-", dir=args.dir) as tmp:
        root = Path(tmp)
        for f in model.iterdir():  # warm the page cache for every contender alike
            f.read_bytes()
        results: dict[str, list[float]] = {"copyfile": [], "copyfile+fsync": []}
        for i in range(0 if args.no_plain else args.runs):
            results["copyfile"].append(plain_copy(model, root / f"plain{i}", fsync=False))
            shutil.rmtree(root / f"plain{i}")
            results["copyfile+fsync"].append(plain_copy(model, root / f"sync{i}", fsync=True))
            shutil.rmtree(root / f"sync{i}")
        load = [os.getloadavg()[0]]
        breakdown: dict[str, list[dict[str, float]]] = {}
        sides = [start_side(root, model, code, tag) for code, tag in
                 (((args.before, "before"),) if args.before else ()) + ((None, "now"),)]
        try:
            for _ in range(args.warmup):
                for side in sides:
                    copy_once(side, size, {})
            # One copy of each side at a time, alternating, so both see the same machine load.
            for _ in range(args.runs):
                for side in sides:
                    for key, t in copy_once(side, size, breakdown).items():
                        results.setdefault(key, []).append(t)
                load.append(os.getloadavg()[0])
        finally:
            for side in sides:
                for proc, _ in side["agents"].values():
                    proc.terminate()
                    proc.wait(30)
        for name, times in results.items():
            if not times:
                continue
            med = statistics.median(times)
            runs = ", ".join(f"{t:.2f}" for t in times)
            print(f"{name:>16}: median {med:.2f} s = {mb / med:6.0f} MB/s   (runs: {runs})")
        print(f"load average (1 min) during the agent copies: {min(load):.2f}-{max(load):.2f} "
              f"on {os.cpu_count()} cores")
        if breakdown:
            print("where the time goes (medians, s): last byte | verified | hash (all threads) | fsync | rename | rest"
                  "   [CPU s: receivers, hashers]")
        for name, rows in breakdown.items():
            med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0]}
            print(f"{name:>16}: {med.get('last_byte_s', 0):.2f} | {med.get('last_verified_s', 0):.2f} | "
                  f"{med.get('hash_s', 0):.2f} | {med.get('fsync_s', 0):.2f} | {med.get('rename_s', 0):.3f} | "
                  f"{statistics.median(r['wall'] - r.get('seconds', 0) for r in rows):.2f}"
                  f"   [{med.get('recv_cpu_s', 0):.2f}, {med.get('hash_cpu_s', 0):.2f}]"
                  f"   (copy {med.get('seconds', 0):.2f} of {med['wall']:.2f}; blocks {med.get('blocks', 0):.0f})")


if __name__ == "__main__":
    main()
