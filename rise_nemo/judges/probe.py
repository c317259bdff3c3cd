"""Start-up probe of an HTTP judge's servers: a run never starts against a judge that is down.

Each ``base_urls`` entry gets one ``GET <url>/models`` (the OpenAI-compatible model list, which vLLM
serves), all in parallel, each bounded by ``RISE_JUDGE_PROBE_TIMEOUT`` seconds (default 10). Any HTTP
answer, even 401/404, shows the server is up; a refused connection, an unknown host or a timeout is a
``UserError`` naming every unreachable URL and its error. Standard library only (no aiohttp needed).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rise_nemo.errors import UserError

PROBE_TIMEOUT_ENV = "RISE_JUDGE_PROBE_TIMEOUT"


def probe_url(url: str, timeout_s: float) -> str | None:
    """None when a server answers at ``url``; else the error, in words."""
    target = url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="GET"), timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # it answered (maybe 401 without a key): the server is up
    except urllib.error.URLError as exc:
        reason = exc.reason
        return f"GET {target}: {getattr(reason, 'strerror', None) or reason}"
    except (TimeoutError, OSError) as exc:
        return f"GET {target}: {exc or type(exc).__name__} (timeout {timeout_s:g} s)"


def probe_urls(urls: Sequence[str], timeout_s: float | None = None) -> dict[str, str]:
    """url -> error for every URL that did not answer (empty when all are up)."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(PROBE_TIMEOUT_ENV, "10"))
    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        errors = list(pool.map(lambda u: probe_url(u, timeout_s), urls))
    return {u: e for u, e in zip(urls, errors) if e is not None}


def probe_judge_urls(judge_cfg: Mapping[str, Any], timeout_s: float | None = None) -> None:
    """Raise ``UserError`` unless every ``judge.base_urls`` server answers."""
    urls = [str(u) for u in (judge_cfg.get("base_urls") or [])]
    down = probe_urls(urls, timeout_s)
    if down:
        listed = "; ".join(f"{u} ({e})" for u, e in down.items())
        raise UserError(f"judge server(s) not reachable at start-up: {listed} — check judge.base_urls "
                        f"(RISE_JUDGE_URLS in the cluster recipes) and that the servers are running")
