"""`torch.flagos.memory_summary`: the allocator's statistics as a table.

The same statistics `memory_stats` returns (the layout of PyTorch's device
allocator statistics), one row per measure and pool, one column per kind of
figure. A plugin whose memory is a native device's pool may give its native
summary instead (the CUDA plugin gives torch.cuda's)."""

_ROWS = (
    # (label, stats key prefix, figures are bytes)
    ("allocated memory", "allocated_bytes", True),
    ("active memory", "active_bytes", True),
    ("requested memory", "requested_bytes", True),
    ("reserved memory", "reserved_bytes", True),
    ("allocations", "allocation", False),
    ("active allocations", "active", False),
    ("segments", "segment", False),
)
_COLUMNS = ("current", "peak", "allocated", "freed")
_POOLS = ("all", "large_pool", "small_pool")


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_summary(stats, title, abbreviated=False):
    """A table of `stats` (a memory_stats dict) under `title`. Abbreviated: the
    totals over all pools only."""
    pools = _POOLS[:1] if abbreviated else _POOLS
    header = f"{'':28s}" + "".join(f"{c:>14s}" for c in _COLUMNS)
    lines = [title, header]
    for label, prefix, in_bytes in _ROWS:
        for pool in pools:
            if f"{prefix}.{pool}.current" not in stats:
                continue
            name = label if pool == "all" else f"  {pool.replace('_', ' ')}"
            cells = (stats.get(f"{prefix}.{pool}.{c}", 0) for c in _COLUMNS)
            lines.append(f"{name:28s}" + "".join(f"{_size(v) if in_bytes else v:>14}" for v in cells))
    lines.append(f"out-of-memory errors: {stats.get('num_ooms', 0)}, "
                 f"allocation retries: {stats.get('num_alloc_retries', 0)}")
    rule = "=" * len(header)
    return "\n".join([rule, *lines, rule]) + "\n"
