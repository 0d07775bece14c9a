"""Pushing shards to a Hub dataset repo in the background (`ShardPusher`), and one-line Hub errors."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import httpx2
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationCopy,
    CommitOperationDelete,
    HfApi,
    RepoFile,
    constants,
    get_token,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from .files import file_sha256

logger = logging.getLogger(__name__)

DATA_DIR = "data"
CARD_FILE = "README.md"
# Where shards the run's manifest does not list are moved in the repo: outside `data/`, so the card's `configs:`
# (`data/*.parquet`) and `load_dataset` never read them, yet kept in the repo, as `seeds/superseded/` keeps them on disk.
SUPERSEDED_DIR = "superseded"
# The Hub is busy, down or behind a proxy that timed out: worth trying again. Other 4xx answers (bad token, no write
# access, invalid repo) fail the same way on every attempt, so they end the retries at once.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
PATHS_PER_REQUEST = 100  # paths asked about in one `get_paths_info` call when comparing a backlog with the repo


class ShardPusher:
    """Uploads shards to a Hub dataset repo from a background thread, so that training never waits on the network.

    The thread is this class's own rather than huggingface_hub's: `HfApi.run_as_future` runs uploads on an executor
    thread that the interpreter joins at exit, so a stalled upload would hold the end of a run until the request ends;
    `CommitScheduler` creates the repo in its constructor (a run with no network would stop before training) and
    pushes again, blocking, at exit. A daemon thread with retries and a bounded `close` keeps both promises.

    Each `submit` becomes one commit that adds `data/<shard name>` and refreshes `README.md` (the dataset card, whose
    `configs:` block lets `datasets.load_dataset(repo_id)` read every shard). A failed push is retried with exponential
    back-off; one that still fails is logged, counted and kept to be retried at the next `submit` and at `close`. The
    local shards stay the source of truth: a shard that never reached the Hub is still on disk and listed by `close`.
    Pushing a shard again is harmless: unchanged files are skipped, and a shard keeps its name, so the repo never holds
    two copies of it.

    What a pusher kept to retry dies with its process. `submit_backlog` is the way back at the next start: it hands over
    every shard the run's manifest lists, and the worker, before any later push, asks the repo which of them it holds
    and pushes the others; it then moves the repo's `data/*.parquet` files the manifest does not list (an abandoned
    branch's, an earlier run's) to `superseded/<time>/`, in one commit.

    Args:
        repo_id: the dataset repo, `"org/name"`; created (as a dataset repo) on the first push if it does not exist.
        token: a Hub token with write access; defaults to the logged-in one (`hf auth login` or `HF_TOKEN`).
        private: visibility of the repo if the pusher creates it (None: the account's default). An existing repo's
            visibility is never changed: with `private=True`, a repo that exists and is public is refused, by
            `check_visibility` before training and again before the first upload, so that private rollouts are never
            published by accident.
        max_retries: attempts after the first one before a push counts as failed.
        backoff: seconds before the first retry; doubled at each retry, up to `max_backoff`.
        max_backoff: the longest wait between two attempts, in seconds.
        endpoint: the Hub URL; defaults to `HF_ENDPOINT` (https://huggingface.co).

    The card pushed with a shard is the last `card_text` handed over (the seed store renders it); while none was, the
    shard goes alone.
    """

    def __init__(
        self,
        repo_id: str,
        token: str | None = None,
        private: bool | None = None,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        endpoint: str | None = None,
    ):
        try:
            validate_repo_id(repo_id)
        except HFValidationError as error:
            raise ValueError(
                f"{type(self).__name__} got an invalid repo_id {repo_id!r}: {error} Use 'org/name'."
            ) from None
        if max_retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError(
                f"{type(self).__name__} needs max_retries, backoff and max_backoff >= 0, got {max_retries}, {backoff}, "
                f"{max_backoff}."
            )
        self.repo_id, self.private = repo_id, private
        self.max_retries, self.backoff, self.max_backoff = max_retries, backoff, max_backoff
        self._api = HfApi(endpoint=endpoint, token=token)
        # Kept only to scrub it from messages: the client's errors should never hold it, but a log line must not rely
        # on that.
        self._secret = token if isinstance(token, str) else get_token()
        self._card_text: str | None = None
        self._repo_ready = False

        self._lock = threading.Condition()
        self._queue: deque[Path] = deque()
        self._in_flight: Path | None = None
        self._pending: dict[Path, None] = {}  # pushes that failed every attempt, oldest first
        self._pushed: dict[str, Path] = {}
        # Shards handed over by `submit_backlog` whose presence in the repo is not known yet (path -> SHA-256 or None),
        # whether a comparison is due (the worker takes it before any push) and whether one is under way.
        self._backlog: dict[Path, str | None] = {}
        self._listed: set[str] = set()  # names of every shard the run's manifest lists (its damaged ones included)
        self._backlog_due = False
        self._comparing = False
        self._compare_failed = False  # a comparison failed every attempt once already
        self._failed_attempts = 0
        self._failed_pushes = 0
        self._last_error: str | None = None
        self._closing = False
        self._abort = threading.Event()
        self._worker: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(repo_id={self.repo_id!r}, endpoint={self._api.endpoint!r})"

    def __enter__(self) -> ShardPusher:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def check_visibility(self, strict: bool = False) -> None:
        """Raises `ValueError` when `private=True` and the repo exists and is public; the only call that may block.

        Meant for start-up, so that a run fails before training rather than after; when the Hub cannot be reached
        (offline, down), it returns and the worker checks again before its first upload, with `strict=True`: there
        a failed check is an error like any other, retried, and nothing is uploaded until it passes.
        """
        if not self.private:
            return
        try:
            info = self._api.repo_info(self.repo_id, repo_type="dataset")
        except RepositoryNotFoundError:
            return  # the pusher creates it, private
        except Exception as error:  # noqa: BLE001 - unreachable now; `_push` checks again before uploading
            if strict:
                raise
            logger.info("Could not check the visibility of %s now (%s); checked before the first push.", self, error)
            return
        if not info.private:
            raise PublicRepoError(
                f"The seed dataset repo {self.repo_id!r} exists and is public, but this run is private "
                "(hub_private_repo=True): its rollouts hold the training prompts and the model's outputs. Make the "
                "repo private on the Hub, set another hub_seed_dataset_id, or pass hub_seeds_private=False to publish "
                "the seeds anyway."
            )

    # -- the trainer's side: never blocks on the network --------------------------------------------------------
    def submit(self, shard_path: str | Path, card_text: str | None = None) -> None:
        """Queues `shard_path` for upload and returns at once; shards whose earlier push failed are queued again first.

        `card_text` replaces the dataset card from this push on; while none was ever given, the shard goes alone.
        """
        shard = Path(shard_path).resolve()
        if not shard.is_file():
            raise FileNotFoundError(
                f"{type(self).__name__}.submit got {shard}, which is not a file; pass a written seed shard."
            )
        with self._lock:
            if self._closing:
                raise RuntimeError(f"{self!r} is closed; create a new {type(self).__name__} to push more shards.")
            if card_text is not None:
                self._card_text = card_text
            self._retry_failed()
            self._enqueue(shard)
            self._start_worker()
            self._lock.notify_all()

    def submit_backlog(
        self,
        shards: Mapping[str | Path, str | None],
        card_text: str | None = None,
        listed: Iterable[str] | None = None,
    ) -> None:
        """Queues a comparison of `shards` (path -> SHA-256, None when unknown) with the repo and returns at once; the
        worker then pushes, before any later shard, those the repo does not hold, with one log line naming them.

        Meant for the start of a run, with every shard its manifest lists: pushes that failed before a crash (or a
        `kill -9`) are otherwise lost with the process that kept them. The repo holds a shard when it has
        `data/<shard name>` with the same content: the SHA-256 the Hub reports for a file stored in LFS (or Xet), else
        git's blob id. When the repo cannot be asked (offline, down), one line says so and the comparison is tried again
        at the next `submit` and at `close`; only the given shards are ever pushed.

        Once the comparison succeeded, the repo's `data/*.parquet` files that are neither in `shards` nor in `listed`
        (the names of every shard the manifest lists, those not handed over for lack of a good local copy included)
        nor pushed by this pusher are moved to `superseded/<time>/<name>` in one commit, with one warning naming them:
        `load_dataset(repo_id)` reads only `data/`, and nothing is deleted (the files stay in the repo and its history).
        Nothing outside `data/` is touched. A failed listing or move is one log line; the run's next start tries again.
        With no `shards` and `listed` given (a fresh run's empty manifest), only that move is done.
        """
        backlog = {}
        for path, sha256 in shards.items():
            shard = Path(path).resolve()
            if not shard.is_file():
                raise FileNotFoundError(
                    f"{type(self).__name__}.submit_backlog got {shard}, which is not a file; pass the written seed shards."
                )
            backlog[shard] = sha256
        with self._lock:
            if self._closing:
                raise RuntimeError(f"{self!r} is closed; create a new {type(self).__name__} to push more shards.")
            if card_text is not None:
                self._card_text = card_text
            self._backlog.update(backlog)
            self._listed.update(listed or ())
            if self._backlog or listed is not None:
                self._backlog_due = True
                self._start_worker()
            self._lock.notify_all()

    def status(self) -> dict:
        """Counts for the trainer's metrics: shards pushed, not (yet) on the Hub, failed attempts and the last error."""
        with self._lock:
            return {
                "pushed": len(self._pushed),
                # A backlog shard not compared yet counts: it is not known to be on the Hub.
                "pending": len(self._queue) + (self._in_flight is not None) + len(self._pending) + len(self._backlog),
                "failed_attempts": self._failed_attempts,
                "failed_pushes": self._failed_pushes,
                "last_error": self._last_error,
            }

    def close(self, timeout: float | None = None) -> list[Path]:
        """Pushes what is queued or failed before, waiting up to `timeout` seconds; returns the shards not pushed,
        backlog shards that could not be compared with the repo included."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._retry_failed()
            self._lock.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
            if worker.is_alive():
                # Stop between attempts; a request already sent is left to finish in the (daemon) thread.
                self._abort.set()
        with self._lock:
            not_pushed = list(
                dict.fromkeys([*self._pending, *self._queue, *([self._in_flight] if self._in_flight else [])])
            )
            unknown = [shard for shard in self._backlog if shard not in not_pushed]
        if unknown:
            logger.warning(
                "%d seed shard(s) listed by the run's manifest could not be compared with the Hub dataset %s (last "
                "error: %s), so those it lacks were not pushed; the run's next start compares them again: %s.",
                len(unknown),
                self.repo_id,
                self._last_error,
                ", ".join(str(path) for path in unknown),
            )
        if not_pushed:
            logger.warning(
                "%d seed shard(s) were not pushed to the Hub dataset %s (last error: %s). They are on disk: %s. "
                "Upload them later with `hf upload %s <shard> data/<shard name> --repo-type dataset`.",
                len(not_pushed),
                self.repo_id,
                self._last_error,
                ", ".join(str(path) for path in not_pushed),
                self.repo_id,
            )
        return not_pushed + unknown

    # -- the worker's side ------------------------------------------------------------------------------------
    def _enqueue(self, shard: Path) -> None:
        if shard not in self._queue and shard != self._in_flight:
            self._queue.append(shard)

    def _retry_failed(self) -> None:
        """Queues again what failed every attempt: the pushes, and a comparison of the backlog (lock held)."""
        for retry in list(self._pending):
            self._enqueue(retry)
        self._pending.clear()
        if self._backlog and not self._comparing:
            self._backlog_due = True

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name=f"seed-hub-pusher:{self.repo_id}", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._backlog_due and not self._closing:
                    self._lock.wait()
                if self._abort.is_set() or not (self._queue or self._backlog_due):
                    return
                backlog = None
                if self._backlog_due:  # first: what it finds missing goes ahead of the queue
                    self._backlog_due, self._comparing = False, True
                    backlog = dict(self._backlog)
                else:
                    shard = self._in_flight = self._queue.popleft()
            if backlog is not None:
                self._compare_backlog(backlog)
                continue
            pushed = self._push_with_retries(shard)
            with self._lock:
                self._in_flight = None
                if pushed:
                    self._pushed[shard.name] = shard
                else:
                    self._pending[shard] = None
                self._lock.notify_all()

    def _compare_backlog(self, backlog: dict[Path, str | None]) -> None:
        """Queues, ahead of the rest, the backlog shards the repo does not hold; keeps them all when it cannot tell."""
        missing, attempts = None, 0
        try:
            missing, attempts = self._with_retries(
                lambda: self._missing(backlog), f"comparison of {len(backlog)} shards with"
            )
        finally:
            with self._lock:
                self._comparing = False
                if missing is not None:
                    for shard in backlog:
                        self._backlog.pop(shard, None)
                    for shard in reversed(missing):
                        if shard not in self._queue and shard != self._in_flight:
                            self._queue.appendleft(shard)
                self._lock.notify_all()
        if missing is None and not self._abort.is_set():  # (an aborted one is reported by `close`)
            # A warning the first time; the later tries (one at each push while the Hub stays away) at info level.
            level, self._compare_failed = logging.INFO if self._compare_failed else logging.WARNING, True
            logger.log(
                level,
                "Could not compare the %d seed shard(s) of the run's manifest with the Hub dataset %s after %d "
                "attempt(s) (%s); training goes on, and the comparison is tried again at the next push, at the end of "
                "training and at the run's next start.",
                len(backlog),
                self.repo_id,
                attempts,
                self._last_error,
            )
        elif missing:
            logger.warning(
                "Pushing %d seed shard(s) the Hub dataset %s does not hold yet (their pushes failed or never ran "
                "before the run stopped): %s.",
                len(missing),
                self.repo_id,
                ", ".join(shard.name for shard in missing),
            )
        elif backlog:
            logger.info(
                "The Hub dataset %s holds all %d seed shards of the run's manifest.", self.repo_id, len(backlog)
            )
        if missing is not None and not self._abort.is_set():
            self._set_aside_unlisted(backlog)

    def _set_aside_unlisted(self, backlog: dict[Path, str | None]) -> None:
        """Moves the repo's `data/*.parquet` files that are not this run's shards to `superseded/<time>/`, in one
        commit (a copy and a delete each: the content stays in the repo). Tried once: it runs right after the repo
        answered, and the client may retry a request on its own; a failure is one line, and the next start tries again.
        """
        with self._lock:
            ours = {shard.name for shard in [*backlog, *self._queue, *self._pending, *self._pushed.values()]}
            ours |= self._listed | ({self._in_flight.name} if self._in_flight else set())
        try:
            stray = sorted(
                entry.path.removeprefix(f"{DATA_DIR}/")
                for entry in self._api.list_repo_tree(self.repo_id, path_in_repo=DATA_DIR, repo_type="dataset")
                if isinstance(entry, RepoFile) and entry.path.endswith(".parquet")
            )
            stray = [name for name in stray if "/" not in name and name not in ours]
            if not stray:
                return
            target = f"{SUPERSEDED_DIR}/{self._free_stamp()}"
            copies = [CommitOperationCopy(f"{DATA_DIR}/{name}", f"{target}/{name}") for name in stray]
            deletes = [CommitOperationDelete(f"{DATA_DIR}/{name}") for name in stray]
            self._api.create_commit(
                self.repo_id,
                [*copies, *deletes],
                commit_message=f"Move {len(stray)} shard(s) the run's manifest does not list to {target}/",
                repo_type="dataset",
            )
        except (RepositoryNotFoundError, EntryNotFoundError):
            return  # no repo, or no data/ folder yet: nothing to set aside
        except Exception as error:  # noqa: BLE001 - tidying the repo must never reach the training loop
            logger.warning(
                "Could not move the files the run's manifest does not list out of %s/ in the Hub dataset %s (%s); "
                "load_dataset reads them with the run's shards until the run's next start moves them.",
                DATA_DIR,
                self.repo_id,
                self._redact(" ".join(f"{type(error).__name__}: {error}".split())),
            )
            return
        logger.warning(
            "The Hub dataset %s held %d shard(s) under %s/ that the run's manifest does not list (an abandoned "
            "branch's or an earlier run's); moved to %s/ so that load_dataset does not read them: %s.",
            self.repo_id,
            len(stray),
            DATA_DIR,
            target,
            ", ".join(stray),
        )

    def _free_stamp(self) -> str:
        """A folder name under `superseded/` by the time to the second, suffixed `-2`, `-3`... when the repo has it."""
        try:
            taken = {
                entry.path.removeprefix(f"{SUPERSEDED_DIR}/")
                for entry in self._api.list_repo_tree(self.repo_id, path_in_repo=SUPERSEDED_DIR, repo_type="dataset")
            }
        except EntryNotFoundError:
            taken = set()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return next(
            name for n in range(1, len(taken) + 2) if (name := stamp if n == 1 else f"{stamp}-{n}") not in taken
        )

    def _missing(self, backlog: dict[Path, str | None]) -> list[Path]:
        """The backlog shards the repo lacks, or holds with other content (those are replaced), in backlog order."""
        paths = [f"{DATA_DIR}/{shard.name}" for shard in backlog]
        held = {}
        try:
            for start in range(0, len(paths), PATHS_PER_REQUEST):
                chunk = paths[start : start + PATHS_PER_REQUEST]
                infos = self._api.get_paths_info(self.repo_id, chunk, repo_type="dataset")
                held.update((info.path, info) for info in infos if isinstance(info, RepoFile))
        except RepositoryNotFoundError:
            return list(backlog)  # no repo yet: the first push creates it
        return [
            shard
            for shard, sha256 in backlog.items()
            if not _same_file(held.get(f"{DATA_DIR}/{shard.name}"), shard, sha256)
        ]

    def _push_with_retries(self, shard: Path) -> bool:
        pushed, attempts = self._with_retries(lambda: self._push(shard) or True, f"push of {shard.name} to")
        if pushed:
            return True
        with self._lock:
            self._failed_pushes += 1
        logger.warning(
            "Could not push seed shard %s to the Hub dataset %s after %d attempt(s): %s. The shard stays on disk and "
            "the push is retried at the next submit and at close.",
            shard.name,
            self.repo_id,
            attempts,
            self._last_error,
        )
        return False

    def _with_retries(self, action: Callable, what: str) -> tuple:
        """`(action's result, attempts)`, retrying with back-off while the error may pass; `(None, attempts)` when
        it failed every attempt (the last error is recorded)."""
        attempts = 0
        while not self._abort.is_set():
            attempts += 1
            try:
                return action(), attempts
            except Exception as error:  # noqa: BLE001 - a failed upload must never reach the training loop
                # One line, so that it reads well as a metric and in a log line.
                message = self._redact(" ".join(f"{type(error).__name__}: {error}".split()))
                with self._lock:
                    self._failed_attempts += 1
                    self._last_error = message
                if attempts > self.max_retries or not _is_retryable(error):
                    break
                delay = min(self.backoff * 2 ** (attempts - 1), self.max_backoff)
                logger.info("The %s %s failed (%s); retrying in %.1fs.", what, self.repo_id, message, delay)
                if self._abort.wait(delay):
                    break
        return None, attempts

    def _push(self, shard: Path) -> None:
        if not self._repo_ready:
            self._api.create_repo(self.repo_id, repo_type="dataset", private=self.private, exist_ok=True)
            self.check_visibility(
                strict=True
            )  # the repo may have existed (and been public) before: never upload into it
            self._repo_ready = True
        with self._lock:
            card_text = self._card_text
        operations = [CommitOperationAdd(path_in_repo=f"{DATA_DIR}/{shard.name}", path_or_fileobj=str(shard))]
        if card_text is not None:
            operations.append(CommitOperationAdd(path_in_repo=CARD_FILE, path_or_fileobj=card_text.encode()))
        self._api.create_commit(
            self.repo_id, operations, commit_message=f"Add seed shard {shard.name}", repo_type="dataset"
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "<token>") if self._secret else text


class HubUnreachableError(ConnectionError):
    """The Hub could not be reached or refused a model-repo operation; its message is one line that says what to do."""


@contextlib.contextmanager
def one_line_hub_errors(action: str, fix: str):
    """Turns a network or Hub failure inside the block into a `HubUnreachableError` of one line: what could not be
    done (`action`), where, why, and `fix`. The client's own traceback (some 80 lines ending in a `ConnectError`)
    is left out: it says nothing a user can act on beyond its last line, which the message keeps."""
    try:
        yield
    except (HfHubHTTPError, httpx2.TransportError, ConnectionError, TimeoutError) as error:
        if isinstance(error, HubUnreachableError):
            raise
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise HubUnreachableError(f"Could not {action} on the Hub at {hub_endpoint()} ({reason}). {fix}") from None


class PublicRepoError(ValueError):
    """A private run was about to push its seeds into an existing public repo; not retried."""


def _same_file(held: RepoFile | None, shard: Path, sha256: str | None) -> bool:
    """Whether the repo's file `held` has the content of the local `shard` (whose SHA-256 may be known already)."""
    if held is None:
        return False
    if held.lfs is not None:  # the Hub reports the SHA-256 of the content of LFS (and Xet) files
        return held.lfs.sha256 == (sha256 or file_sha256(shard))
    if held.xet_hash is not None:  # no digest to compare with here; the size has to do
        return held.size == shard.stat().st_size
    content = shard.read_bytes()  # a small file committed inline: git's blob id
    return held.blob_id == hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _is_retryable(error: Exception) -> bool:
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return error.response.status_code in RETRYABLE_STATUS
    # Connection refused or reset, timeouts: the network or the Hub may come back. A local file error or a bug will not.
    if isinstance(error, (FileNotFoundError, PermissionError)):
        return False
    return isinstance(error, (httpx2.TransportError, ConnectionError, TimeoutError, OSError))


def hub_endpoint() -> str:
    return constants.ENDPOINT
