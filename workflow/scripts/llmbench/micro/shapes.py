"""What a microbenchmark cell measures, without torch: GEMM shapes of a curve and the
powers-of-two sizes of copies and collectives. The grid expands configs with these at
parse time; the workers run them."""

from __future__ import annotations


def sweep(
    n: int, k: int, m_start: int, m_stop: int, m_step: int, m_offset: int = 0
) -> list[tuple[int, int, int]]:
    """Shapes (m, n, k) with m from m_start+m_offset to m_stop+m_offset inclusive, step m_step."""
    for name, value in (("n", n), ("k", k), ("m_start", m_start), ("m_step", m_step)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if m_stop < m_start:
        raise ValueError(f"m_stop ({m_stop}) must be >= m_start ({m_start})")
    if m_start + m_offset < 1:
        raise ValueError(f"m_start + m_offset must be >= 1, got {m_start + m_offset}")
    return [(m, n, k) for m in range(m_start + m_offset, m_stop + m_offset + 1, m_step)]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from the first >= min_bytes up to the last <= max_bytes."""
    if min_bytes < 1:
        raise ValueError(f"min_bytes must be >= 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes ({max_bytes}) must be >= min_bytes ({min_bytes})")
    size = 1 << (min_bytes - 1).bit_length()
    out = []
    while size <= max_bytes:
        out.append(size)
        size <<= 1
    return out
