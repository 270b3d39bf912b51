"""Download sources other than a peer agent: the Hugging Face Hub and the demo import.

Each fills the job's work directory and returns the manifest of what it wrote, verified
against the job's manifest when the control plane gave one (a difference fails the job as
a mismatch naming the files). The peer source lives in `transfer`.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from ..logs import EventLogger
from .commands import child_env, pipeserve_command
from .inventory import sha256_file
from .names import InvalidName, check_relpath
from .schemas import DemoSource, FileEntry, HubSource, Manifest
from .jobs import Cancelled, DownloadError, Job

# Sizes of the demo import (SmolLM2-135M-Instruct) plus the wheel it is converted from.
DEMO_BYTES = {"float32": 545_000_000 + 100_000_000, "bfloat16": 275_000_000 + 100_000_000}


def _compare(job: Job, got: dict[str, FileEntry]) -> None:
    """Raise a mismatch naming the files when `got` differs from the job's manifest."""
    if job.manifest is None:
        return
    want = job.manifest.files
    bad = sorted({p for p in want if got.get(p) != want[p]} | {p for p in got if p not in want})
    if bad:
        raise DownloadError(f"mismatch: {', '.join(bad)} differ from the manifest", "mismatch", bad)


def fetch_hub(job: Job, source: HubSource, files_dir: Path, log: EventLogger) -> Manifest:
    """Download a repository snapshot with huggingface_hub (HF_ENDPOINT honoured), file by file.

    Without a manifest the file list comes from the Hub (LFS files carry their sha256, which
    is checked); huggingface_hub resumes its own interrupted files.
    """
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.utils import tqdm as hf_tqdm

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, not when huggingface_hub was imported

    class Progress(hf_tqdm):  # type: ignore[misc, valid-type]
        """Counts bytes into the job and stops the download when it is cancelled."""

        def update(self, n: float | None = 1) -> bool | None:
            if job.cancel.is_set():
                raise Cancelled
            job.transferred(int(n or 0))
            return super().update(n)

    try:
        revision = source.revision
        if job.manifest is not None:
            wanted = {rel: (e.size, e.sha256) for rel, e in job.manifest.files.items()}
        else:
            info = HfApi(endpoint=endpoint).model_info(source.repo_id, revision=revision, files_metadata=True)
            revision = info.sha or revision  # pin the commit so every file comes from one snapshot
            wanted = {}
            for s in info.siblings or []:
                try:
                    wanted[check_relpath(s.rfilename)] = (s.size or 0, s.lfs.sha256 if s.lfs else None)
                except InvalidName:
                    log.warning("download.skipped_file", model=job.model_id, file=s.rfilename)
            with job.lock:
                job.total_bytes, job.files_total = sum(v[0] for v in wanted.values()), len(wanted)
        job.require_space(job.total_bytes)  # counts the downloads in progress too
        got: dict[str, FileEntry] = {}
        for rel, (size, sha) in wanted.items():
            if job.cancel.is_set():
                raise Cancelled
            with job.lock:
                job.current_file = rel
            for attempt in range(2):
                with job.lock:
                    job.current_bytes = 0
                path = hf_hub_download(source.repo_id, rel, revision=revision, local_dir=files_dir,
                                       endpoint=endpoint, tqdm_class=Progress, force_download=attempt > 0)
                digest = sha256_file(Path(path))
                if sha is None or digest == sha:
                    break
                log.warning("download.corrupt_file", model=job.model_id, file=rel, attempt=attempt + 1)
            else:
                raise DownloadError(f"mismatch: {rel} from the hub differs from the manifest", "mismatch", [rel])
            got[rel] = FileEntry(size=os.path.getsize(path), sha256=digest)
            job.file_done(got[rel].size)
    except (Cancelled, DownloadError):
        raise
    except Exception as exc:  # HfHubHTTPError, its HTTP client's connection errors, OSError: one clear failure
        raise DownloadError(f"hub {endpoint or 'https://huggingface.co'}: {type(exc).__name__}: {exc}",
                            "hub_error", keep_partial=True) from None  # huggingface_hub resumes its files
    shutil.rmtree(files_dir / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    _compare(job, got)
    return Manifest(files=got)


def import_demo(job: Job, source: DemoSource, files_dir: Path, log: EventLogger) -> Manifest:
    """Run `pipeserve import-demo-model` into the work directory (cancellable), then hash the result."""
    job.require_space(DEMO_BYTES[source.dtype])  # counts the downloads in progress too
    out = files_dir.parent / "import"
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen(pipeserve_command("import-demo-model", str(out), "--dtype", source.dtype),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=child_env(), start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=20)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            with job.lock:
                job.current_file = line.strip()[:200]

    reader = threading.Thread(target=read, daemon=True, name=f"import-{job.model_id}")
    reader.start()
    while proc.poll() is None:
        if job.cancel.wait(0.2):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            shutil.rmtree(out, ignore_errors=True)
            raise Cancelled
    reader.join(5)
    if proc.returncode != 0:
        raise DownloadError(f"import-demo-model exited with {proc.returncode}: " + " | ".join(tail), "import_failed")
    files_dir.rmdir()
    os.rename(out, files_dir)
    got = {p.relative_to(files_dir).as_posix(): FileEntry(size=p.stat().st_size, sha256=sha256_file(p))
           for p in sorted(files_dir.rglob("*")) if p.is_file()}
    with job.lock:
        job.total_bytes, job.files_total = sum(e.size for e in got.values()), len(got)
        job.completed_bytes, job.files_done = job.total_bytes, len(got)
    _compare(job, got)
    log.info("download.imported", model=job.model_id, dtype=source.dtype, bytes=job.total_bytes)
    return Manifest(files=got)
