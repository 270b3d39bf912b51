"""Model downloads: one job per model, from a peer agent, the Hugging Face Hub, or the demo import.

Files are assembled in `<models>/.partial/<id>/files/` (a hidden name: never listed as a
model) and the directory is renamed into place only when every file is verified against
the manifest, so a half-done download is never visible as a model. Peer files stream over
HTTP with `Range` resume: an interrupted `.part` file (agent killed, network lost) is
re-hashed locally and continued where it stopped. A file whose sha256 differs is fetched
again once from scratch (with per-block digests, `blocks`: only the block that differs); a
second difference fails the job as a mismatch naming the file (and the block and peer).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import settings
from orchestrator.agent.copy.copier import copy_from_peers
from orchestrator.agent.copy.follow import follow_peer
from orchestrator.agent.inventory import Inventory, ModelNotFound
from orchestrator.agent.jobs import Cancelled, Conflict, DiskSpaceError, DownloadError, Job
from orchestrator.agent.schemas import DownloadInfo, FetchRequest, Manifest, OfferedFiles, PeerSource
from orchestrator.atomic_write import write_atomically
from orchestrator.logs import EventLogger
from orchestrator.units import format_bytes

DISK_MARGIN = 16 << 20  # keep this much free beyond the download (logs, caches)


class RateLimiter:
    """A token bucket shared by every upload of this agent (bytes per second)."""

    def __init__(self, rate_bps: float) -> None:
        self.rate = float(rate_bps)
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def acquire(self, n: int) -> None:
        """Block until `n` more bytes fit under the rate."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


# A source other than a peer: (job, source request, work files directory) -> the manifest of
# what it wrote, verified against the job's manifest when there is one.
SourceFn = Callable[[Job, object, Path], Manifest]


class Downloads:
    """The download jobs of one agent. Thread-safe; each running job has its own thread."""

    def __init__(self, inventory: Inventory, log: EventLogger,
                 other_sources: dict[str, SourceFn] | None = None,
                 users: Callable[[str], list[str]] | None = None, follow_deadline_s: float | None = None) -> None:
        self.inventory = inventory
        self.follow_deadline_s = settings.FOLLOW_DEADLINE_S.read() if follow_deadline_s is None else follow_deadline_s
        self._users = users or (lambda model_id: [])  # running processes using a model
        self.work_root = inventory.root / ".partial"
        self.log = log
        self._other = other_sources or {}
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, model_id: str, request: FetchRequest) -> tuple[DownloadInfo, bool]:
        """Start fetching `model_id`; (info, created). A running job for it is returned as is."""
        self.inventory.model_dir(model_id, must_exist=False)  # validates the id
        source, manifest = request.source, request.manifest
        following = isinstance(source, PeerSource) and source.follow
        if following and (manifest is not None or source.mirrors):
            raise DownloadError("a fetch that follows a peer's download takes no manifest and no mirrors: the "
                                "files are those the peer verifies", "invalid_field")
        if isinstance(source, PeerSource) and manifest is None and not following:
            raise DownloadError("a manifest is required to fetch from a peer", "manifest_required")
        label = source.kind + (f":{source.url}" if isinstance(source, PeerSource) else
                               f":{getattr(source, 'repo_id', '')}" if source.kind == "hf" else "")
        # What identifies the same download: the expected files (from whichever peer: a resume
        # may continue from another one), or the source when the files are not known yet (without
        # the ticket of a following copy: each fetch brings a fresh one, and a resume is the same copy).
        ident = [label, "follow", source.model_id] if following else [label, source.model_dump()]
        # Blocks left out: the same files, with or without their block digests, are the same request.
        key = json.dumps(manifest.model_dump(exclude={"files": {"__all__": {"blocks"}}}) if manifest else ident,
                         sort_keys=True)
        # Checked before taking the lock: hashing a large model must not block progress queries.
        present = manifest is not None and self._present(model_id, manifest)
        users = [] if present else self._users(model_id)
        if users and os.path.lexists(self.inventory.root / model_id):
            raise Conflict(f"model {model_id!r} is in use by {', '.join(users)}: stop them before replacing it",
                           "model_in_use")
        with self._lock:
            running = self._jobs.get(model_id)
            if running is not None and running.state == "running":
                if running.key != key:
                    raise Conflict(f"another download of {model_id!r} (from {running.source}) is running; "
                                   "cancel it first", "download_conflict")
                return running.info(), False
            job = Job(model_id, label, key, manifest)
            job.require_space = lambda needed: self._reserve(job, needed)
            if manifest is not None and present:
                job.files_total = job.files_done = len(manifest.files)
                job.completed_bytes = manifest.total_bytes
                job.finish("done")
                self._jobs[model_id] = job
                return job.info(), True
            if manifest is not None:  # before touching the disk: a refusal leaves nothing behind
                self._check_disk(max(0, manifest.total_bytes - self._partial_bytes(model_id, key)))
            work = self._prepare_work(model_id, key)
            job.files_dir = work / "files"
            self._jobs[model_id] = job
            job.thread = threading.Thread(target=self._run, args=(job, source, work), daemon=True,
                                          name=f"download-{model_id}")
            job.thread.start()
        self.log.info("download.started", model=model_id, source=label, bytes=job.total_bytes)
        return job.info(), True

    def _present(self, model_id: str, manifest: Manifest) -> bool:
        try:
            return self.inventory.check(model_id, manifest).status == "present"
        except ModelNotFound:
            return False

    def _same_request(self, model_id: str, key: str) -> bool:
        try:
            return (self.work_root / model_id / "request.json").read_text() == key
        except OSError:
            return False

    def _partial_bytes(self, model_id: str, key: str) -> int:
        """Bytes already in the work directory for this very request (0 for another one)."""
        files = self.work_root / model_id / "files"
        if not self._same_request(model_id, key):
            return 0
        return sum(p.stat().st_size for p in files.rglob("*") if p.is_file())

    def _prepare_work(self, model_id: str, key: str) -> Path:
        """The job's work directory; partial files of a different request are discarded."""
        work = self.work_root / model_id
        same = self._same_request(model_id, key)
        if not same:
            shutil.rmtree(work, ignore_errors=True)
        (work / "files").mkdir(parents=True, exist_ok=True)
        if not same:
            write_atomically(work / "request.json", key)
        return work

    def _check_disk(self, needed: int, exclude: Job | None = None) -> None:
        """DiskSpaceError unless `needed` bytes fit beside what running jobs have still to write.

        Called with the lock held, so two requests cannot both count the same free bytes.
        Conservative: files that could be linked from a local copy are counted as needed.
        """
        pending = sum(j.outstanding() for j in self._jobs.values() if j is not exclude)
        free = shutil.disk_usage(self.inventory.root).free
        if needed + pending + DISK_MARGIN > free:
            busy = f", downloads in progress will still write {format_bytes(pending)}" if pending else ""
            raise DiskSpaceError(f"not enough disk space in {self.inventory.root}: the download needs "
                                 f"{format_bytes(needed)} (+{format_bytes(DISK_MARGIN)} margin){busy}, "
                                 f"{format_bytes(free)} are free", "insufficient_disk_space")

    def _reserve(self, job: Job, needed: int) -> None:
        """For a source that learns its size while running: check it, and count it from now on."""
        with self._lock:
            self._check_disk(needed, exclude=job)
            with job.lock:
                job.reserved_bytes = needed

    def get(self, model_id: str) -> DownloadInfo:
        """The latest job of a model; LookupError when there is none."""
        with self._lock:
            job = self._jobs.get(model_id)
        if job is None:
            raise LookupError(f"no download of {model_id!r} since this agent started")
        return job.info()

    def running(self, model_id: str) -> bool:
        """Whether a download of the model runs now."""
        with self._lock:
            job = self._jobs.get(model_id)
        return job is not None and job.state == "running"

    def offered(self, model_id: str) -> OfferedFiles:
        """The files peers may copy: the model's manifest once it is here, the files a running download has
        verified so far while it runs (never a partial or unverified one). ModelNotFound when neither."""
        with self._lock:
            job = self._jobs.get(model_id)
        if job is not None and job.state == "running":
            with job.lock:
                files, total, count = dict(job.offered), job.total_bytes, job.files_total
            return OfferedFiles(model_id=model_id, state="running", complete=False, manifest=Manifest(files=files),
                                total_bytes=total, files_total=count)
        try:
            manifest = self.inventory.manifest(model_id)
            return OfferedFiles(model_id=model_id, state="present", complete=True, manifest=manifest,
                                total_bytes=manifest.total_bytes, files_total=len(manifest.files))
        except ModelNotFound:
            if job is None or job.state not in ("failed", "cancelled"):
                raise
        # A follower must stop (its source will not complete): nothing of the job is served.
        return OfferedFiles(model_id=model_id, state=job.state, complete=False, manifest=Manifest(files={}),
                            total_bytes=job.total_bytes, files_total=job.files_total)

    def offered_path(self, model_id: str, rel: str) -> Path | None:
        """Where a running download keeps a file it has verified (None when it offers no such file)."""
        with self._lock:
            job = self._jobs.get(model_id)
        if job is None or job.state != "running" or job.files_dir is None:
            return None
        with job.lock:
            offered = rel in job.offered
        return job.files_dir / rel if offered else None

    def list(self) -> list[DownloadInfo]:
        """Every model's latest job."""
        with self._lock:
            jobs = list(self._jobs.values())
        return [j.info() for j in jobs]

    def cancel(self, model_id: str, discard: bool = False, wait_s: float = 10.0) -> DownloadInfo:
        """Cancel a running job (idempotent); partial files are kept for a resume unless `discard`."""
        with self._lock:
            job = self._jobs.get(model_id)
        if job is None:
            raise LookupError(f"no download of {model_id!r} since this agent started")
        job.discard = discard
        job.cancel.set()
        if job.thread is not None:
            job.thread.join(wait_s)
        if discard and job.state != "running":
            shutil.rmtree(self.work_root / model_id, ignore_errors=True)
        return job.info()

    def remove(self, model_id: str) -> None:
        """Delete a model from this node; refused (Conflict) while a process uses it or it downloads.

        The directory is first renamed under the hidden work root, so the model disappears
        at once and a half-deleted directory is never listed.
        """
        path = self.inventory.model_dir(model_id)  # ModelNotFound -> 404
        users = self._users(model_id)
        if users:
            raise Conflict(f"model {model_id!r} is in use by {', '.join(users)}: stop the session first",
                           "model_in_use")
        with self._lock:
            job = self._jobs.get(model_id)
            if job is not None and job.state == "running":
                raise Conflict(f"model {model_id!r} is being downloaded: cancel the download first",
                               "download_conflict")
            self.work_root.mkdir(parents=True, exist_ok=True)
            trash = self.work_root / f".deleted-{model_id}-{time.monotonic_ns()}"
            os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        self.inventory.forget(model_id)
        self.log.info("model.deleted", model=model_id)

    def shutdown(self) -> None:
        """Cancel every running job, keeping partial files (a restarted agent resumes them)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(5.0)

    # --- the worker ----------------------------------------------------------------

    def _run(self, job: Job, source: object, work: Path) -> None:
        files_dir = work / "files"
        try:
            if isinstance(source, PeerSource):
                manifest = self._from_peer(job, source, files_dir)
            else:
                manifest = self._other[source.kind](job, source, files_dir)  # type: ignore[attr-defined]
            self._install(job.model_id, manifest, work)
            job.finish("done")
            self.log.info("download.done", model=job.model_id, bytes=job.total_bytes,
                          transferred=job.transferred_bytes, resumed=job.resumed_bytes, seconds=job.info().elapsed_s)
        except Cancelled:
            job.finish("cancelled")
            if job.discard:
                shutil.rmtree(work, ignore_errors=True)
            self.log.info("download.cancelled", model=job.model_id, kept_partial=not job.discard)
        except DownloadError as exc:
            if not exc.keep_partial:  # nothing a later fetch could resume: give the disk space back
                shutil.rmtree(work, ignore_errors=True)
            job.finish("failed", exc)
            self.log.error("download.failed", model=job.model_id, reason=exc, code=exc.code,
                           kept_partial=exc.keep_partial)
        except Exception as exc:  # a bug or an OS error (a full disk): report it on the job, never lose the thread
            shutil.rmtree(work, ignore_errors=True)
            self.log.error("download.failed", exc_info=True, model=job.model_id)
            job.finish("failed", DownloadError(f"{type(exc).__name__}: {exc}"))

    def _install(self, model_id: str, manifest: Manifest, work: Path) -> None:
        """Move the verified files into place atomically (an old copy is swapped out, then deleted)."""
        files_dir = work / "files"
        os.chmod(files_dir, 0o755)
        final = self.inventory.model_dir(model_id, must_exist=False)
        old = None
        if os.path.lexists(final):
            old = self.work_root / f".old-{model_id}-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(final, old)
        os.rename(files_dir, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        self.inventory.record(model_id, manifest)

    def _reuse_local(self, job: Job, files_dir: Path) -> set[str]:
        """Link files the node already holds with the right content (a mismatch usually differs in one)."""
        assert job.manifest is not None
        linked: set[str] = set()
        try:
            have = self.inventory.manifest(job.model_id).files
            base = self.inventory.model_dir(job.model_id)
        except ModelNotFound:
            return linked
        for rel, entry in job.manifest.files.items():
            target = files_dir / rel
            if have.get(rel) == entry and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(base / rel, target)
                except OSError:
                    shutil.copyfile(base / rel, target)
                linked.add(rel)
        return linked

    def _from_peer(self, job: Job, source: PeerSource, files_dir: Path) -> Manifest:
        if source.follow:
            return follow_peer(job, source, files_dir, self.log, deadline_s=self.follow_deadline_s)
        assert job.manifest is not None
        copy_from_peers(job, source, files_dir, self._reuse_local(job, files_dir), self.log)
        return job.manifest
