"""Download sources other than a peer agent: the Hugging Face Hub and the demo import.

Each fills the job's work directory and returns the manifest of what it wrote, verified
against the job's manifest when the control plane gave one (a difference fails the job as
a mismatch naming the files). The peer source lives in `transfer`.
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from orchestrator.agent.capped import CappedWriter
from orchestrator.agent.copy.blocks import hash_file
from orchestrator.agent.hub import endpoint, hub_error, list_repo
from orchestrator.agent.jobs import Cancelled, DownloadError, Job
from orchestrator.agent.programs import child_env, pipeserve_command
from orchestrator.agent.schemas import DemoSource, FileEntry, HubSource, Manifest
from orchestrator.logs import EventLogger

# Sizes of the demo import (SmolLM2-135M-Instruct) plus the wheel it is converted from.
HUB_CHUNK = 1 << 20
DEMO_BYTES = {"float32": 545_000_000 + 100_000_000, "bfloat16": 275_000_000 + 100_000_000}


def _compare(job: Job, got: dict[str, FileEntry]) -> None:
    """Raise a mismatch naming the files when `got` differs from the job's manifest."""
    if job.manifest is None:
        return
    want = job.manifest.files
    bad = sorted({p for p in want if got.get(p) != want[p]} | {p for p in got if p not in want})
    if bad:
        raise DownloadError(f"mismatch: {', '.join(bad)} differ from the manifest", "mismatch", bad)


def _git_blob_sha1(path: Path) -> str:
    """The git object id of a file (how the Hub identifies a small, non-LFS file)."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, sha: str | None, blob_id: str | None) -> tuple[bool, FileEntry]:
    """(matches what the hub announced, its manifest entry) of a downloaded file: LFS files by
    sha256, small files by their git blob id, so every byte is checked before the model appears.
    The entry's blocks come from the same pass as its sha256 (`blocks.hash_file`)."""
    digest, blocks = hash_file(path)
    entry = FileEntry(size=path.stat().st_size, sha256=digest, blocks=blocks)
    if sha is not None:
        return digest == sha, entry
    return (blob_id is None or _git_blob_sha1(path) == blob_id), entry


def _hub_file(job: Job, repo_id: str, commit: str, rel: str, size: int, path: Path, progress: type) -> None:
    """One file with huggingface_hub's own HTTP download (auth headers, retries, Range resume)
    into `<path>.part`, renamed to `path` once complete. The `.part` survives an agent restart:
    the next fetch continues it where it stopped (huggingface_hub's own temporary files do not)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.exists() else 0
    if offset > size:
        part.unlink()
        offset = 0
    with job.lock:
        job.current_bytes = offset
        job.resumed_bytes += offset
    with open(part, "ab") as f:
        # Capped at the listed size: a hub that streams more than it announced writes no more
        # than the disk space the job was admitted with (200 MiB per file once, kept on disk).
        http_get(hf_hub_url(repo_id, rel, revision=commit, endpoint=endpoint()), CappedWriter(f, size, rel),
                 resume_size=offset, headers=build_hf_headers(), expected_size=size, tqdm_class=progress)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def fetch_hub(job: Job, source: HubSource, files_dir: Path, log: EventLogger) -> Manifest:
    """Download a repository snapshot with huggingface_hub (HF_ENDPOINT honoured), file by file.

    The file list, sizes and hashes come from the Hub first (pinned to one commit): a repo
    that is not an MLX model, or a gated one without a token, is refused before anything is
    written, and free disk space is checked for the whole listing. Each file is verified
    (sha256 for LFS files, git blob id otherwise) and fetched again once from scratch if it
    differs. An interrupted file resumes from its `.part` file (Range), also after a restart.
    """
    from huggingface_hub import constants as hf_constants
    from huggingface_hub.utils import tqdm as hf_tqdm

    # huggingface_hub hands bytes over (to the progress bar and the file) in chunks of this
    # size: its 10 MiB default makes progress jumpy and loses up to 10 MiB on an interruption.
    # Process-wide, but this agent is the only user of the library in its process.
    hf_constants.DOWNLOAD_CHUNK_SIZE = HUB_CHUNK

    class Progress(hf_tqdm):  # type: ignore[misc, valid-type]
        """Counts bytes into the job and stops the download when it is cancelled."""

        def update(self, n: float | None = 1) -> bool | None:
            if job.cancel.is_set():
                raise Cancelled
            job.transferred(int(n or 0))
            return super().update(n)

    try:
        listing = list_repo(source.repo_id, source.revision, files_dir, read_config=False)
        if not listing.mlx:
            raise DownloadError(f"{source.repo_id}: {listing.reason}", "not_mlx")
        if listing.gated and not listing.token:
            raise DownloadError(f"{source.repo_id} is a gated repository and this agent has no hub token: accept "
                                "its terms on the Hub, then set HF_TOKEN in the agent's environment", "hub_gated")
        revision = listing.commit  # pin the commit so every file comes from one snapshot
        wanted = {f.path: (f.size, f.sha256, f.blob_id) for f in listing.files}
        for name in listing.skipped:
            log.warning("download.skipped_file", model=job.model_id, file=name)
        if job.manifest is not None:
            # The hub's own sizes must agree before a byte is fetched (a different revision).
            bad = sorted(rel for rel, e in job.manifest.files.items() if rel not in wanted or wanted[rel][0] != e.size)
            if bad:
                raise DownloadError(f"mismatch: {', '.join(bad)} differ in {source.repo_id}@{listing.commit[:12]}",
                                    "mismatch", bad)
            wanted = {rel: (e.size, e.sha256, None) for rel, e in job.manifest.files.items()}
        with job.lock:
            job.total_bytes, job.files_total = sum(v[0] for v in wanted.values()), len(wanted)
        job.require_space(job.total_bytes)  # counts the downloads in progress too
        got: dict[str, FileEntry] = {}
        for rel, (size, sha, blob_id) in wanted.items():
            if job.cancel.is_set():
                raise Cancelled
            with job.lock:
                job.current_file = rel
            path = files_dir / rel
            if path.exists():  # completed before an interruption (renamed from .part only when whole)
                ok, entry = _verified(path, sha, blob_id)
                if ok and entry.size == size:
                    got[rel] = entry
                    job.file_done(size, "resumed")
                    job.offer(rel, got[rel])
                    continue
                path.unlink()
            for attempt in range(2):
                _hub_file(job, source.repo_id, revision, rel, size, path, Progress)
                ok, entry = _verified(path, sha, blob_id)
                if ok:
                    break
                path.unlink()
                log.warning("download.corrupt_file", model=job.model_id, file=rel, attempt=attempt + 1)
            else:
                raise DownloadError(f"mismatch: {rel} from the hub differs from its announced hash (fetched twice)",
                                    "mismatch", [rel])
            got[rel] = entry
            job.file_done(got[rel].size)
            job.offer(rel, got[rel])  # verified: peers following this download may copy it now
    except (Cancelled, DownloadError):
        raise
    # HfHubHTTPError, its HTTP client's connection errors, OSError: one clear failure
    except Exception as exc:  # noqa: BLE001
        raise hub_error(exc, source.repo_id, source.revision) from None
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
    got = {}
    for p in sorted(files_dir.rglob("*")):
        if p.is_file():
            digest, blocks = hash_file(p)  # the blocks from the same pass (see `blocks`)
            got[p.relative_to(files_dir).as_posix()] = FileEntry(size=p.stat().st_size, sha256=digest, blocks=blocks)
    with job.lock:
        job.total_bytes, job.files_total = sum(e.size for e in got.values()), len(got)
        job.completed_bytes, job.files_done = job.total_bytes, len(got)
    _compare(job, got)
    log.info("download.imported", model=job.model_id, dtype=source.dtype, bytes=job.total_bytes)
    return Manifest(files=got)
