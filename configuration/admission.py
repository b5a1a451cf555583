"""Admission from the KV cache, and the bounds that keep an upgrade from cutting an answer (entrypoint/glm5.toml
[gateway], [deployment]). One arithmetic for the gateway (gateway/launch), KEDA's threshold (ci/render) and the
benchmark's report (ci/bench)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def kv_requests(max_total_num_tokens: float, context_tokens: int) -> int:
    """Requests of `context_tokens` (prompt and answer) that a KV pool of `max_total_num_tokens` holds at once."""
    if context_tokens < 1:
        raise ValueError(f"context_tokens = {context_tokens}: use 1 or more")
    return int(max_total_num_tokens) // context_tokens


def per_replica(decode_capacity: int, max_total_num_tokens: float, context_tokens: int) -> int:
    """What the gateway admits to one replica: what its pool holds, at most its largest captured decode batch."""
    return max(1, min(decode_capacity, kv_requests(max_total_num_tokens, context_tokens)))


def drift(cfg: Mapping[str, Any], pool: int) -> list[str]:
    """Bounds that must agree so that no answer the gateway admits is cut by a replacement (of a replica: its drain;
    of a gateway: smg's own), and a pool that holds a request; each with the fix. `pool`: a replica's KV pool at the
    defaults (configuration/layout.py default_pool)."""
    gw, deployment = cfg["gateway"], cfg["deployment"]
    longest = gw["request_timeout_seconds"]
    found = []
    if deployment["drain_seconds"] < longest:
        found.append(
            f"[deployment] drain_seconds = {deployment['drain_seconds']} is under [gateway] request_timeout_seconds = "
            f"{longest}: a replacement would cut answers the gateway still lets run; raise drain_seconds or lower "
            "request_timeout_seconds"
        )
    if gw["shutdown_grace_seconds"] < longest:
        found.append(
            f"[gateway] shutdown_grace_seconds = {gw['shutdown_grace_seconds']} is under request_timeout_seconds = "
            f"{longest}: a gateway restart would cut answers in flight; raise shutdown_grace_seconds"
        )
    if gw["context_tokens"] < 1 or pool < gw["context_tokens"]:
        found.append(
            f"[gateway] context_tokens = {gw['context_tokens']}: 1 <= context_tokens <= {pool:,}, a replica's KV pool "
            "at the defaults by configuration/layout.py's estimate (a replica's pool holds at least one request)"
        )
    return found
