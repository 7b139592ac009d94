"""Bounded retries for transient failures: exponential backoff with full jitter."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog
import urllib3
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

T = TypeVar("T")
log = structlog.get_logger("calico_gc.retry")
# What became of one try of a call, for a caller that counts them (a `tries` list): UNANSWERED
# where it may have reached the server and no answer came that says what was done. A write with
# such a try may have been done at it, its answer lost.
ANSWERED, UNANSWERED = 0, 1


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning(
        "retrying",
        call=getattr(state.fn, "__qualname__", str(state.fn)),
        attempt=state.attempt_number,
        wait_s=round(state.upcoming_sleep, 3),
        error=describe_error(error),
    )


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def one_line(text: str, limit: int = 200) -> str:
    """Whitespace folded, cut at `limit`: error text from a server may span lines or pages."""
    return " ".join(text.split())[:limit]


def network_reason(error: object) -> str:
    """`Connection refused`, `timed out`, `Name or service not known`: the part a person needs
    of a client library's connection error, which wraps it in pool and retry detail."""
    if isinstance(error, TimeoutError) or "timed out" in str(error).lower():
        return "timed out"
    found = _ERRNO.search(str(error))
    return found.group(1).strip() if found else one_line(str(error), 160) or type(error).__name__


def never_sent(error: BaseException) -> bool:
    """Whether an HTTP call failed before a connection was made (refused, unresolved, or not in
    time): nothing reached the server. urllib3 raises ConnectTimeoutError (NewConnectionError
    among them); requests wraps it as the reason of a MaxRetryError."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(error, urllib3.exceptions.ConnectTimeoutError) or isinstance(
        reason, urllib3.exceptions.ConnectTimeoutError
    )


def describe_error(error: BaseException | None) -> str:
    """A one-line text for any error, including those whose str() is empty."""
    if error is None:
        return ""
    detail = getattr(error, "detail_text", None) or str(error) or ""
    return f"{type(error).__name__}: {detail}".strip().rstrip(":")[:500]


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    timeout_s: float = 60.0
    max_wait_s: float = 5.0
    multiplier: float = 0.2
    sleep: Callable[[float], None] = time.sleep
    before_sleep: tuple[Callable[[RetryCallState], None], ...] = field(default=())

    def call(self, fn: Callable[[], T], is_transient: Callable[[BaseException], bool]) -> T:
        """Run `fn`, retrying only errors `is_transient` accepts; re-raise the last one."""
        hooks = (_log_retry, *self.before_sleep)

        def before_sleep(state: RetryCallState) -> None:
            for hook in hooks:
                hook(state)

        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_random_exponential(multiplier=self.multiplier, max=self.max_wait_s),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.timeout_s),
            before_sleep=before_sleep,
            sleep=self.sleep,
            reraise=True,
        )
        return retrying(fn)
