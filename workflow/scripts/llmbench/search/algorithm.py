"""The max-batch search's choice of the next batch: pure (no files, no processes).

How the next batch is chosen (``next_probe``), with ``lo`` the largest batch known to fit
(0 before any) and ``hi`` the smallest known to be too large (``max + 1`` before any):

1. doubling from ``start`` while nothing has been too large, then bisection of (lo, hi):
   the classic search, exact, no model needed;
2. steered by a memory model where the capacity is known (the cell's host-RSS cap on
   CPU, the GPU's memory on a GPU): once two batches fit, the line through the peak
   memory of the two largest fitting batches predicts the largest batch ``p`` under the
   capacity. While nothing has been too large the search probes ``p + 1`` (expecting an
   OOM, which bounds the search: ``max`` where ``p`` is past it), then ``p`` clamped into
   (lo, hi). Each new fit moves the line to the newest pair, so the model follows memory
   that grows faster than linearly, as the allocator's reserved memory does (on an H200
   pair Megatron-LM TP2's batches 4 and 8 pointed at 50 where 38 was the limit: a
   least-squares line through all fits spent the whole bound there). Where the smallest
   batch too large ran (tight: its peak is known), a second line runs from the largest
   fitting batch to it, across the interval the answer lies in, and the larger batch of
   the two lines below it is probed (``ALGORITHM`` 2; version 1 drew only the first, and
   bisected where it pointed at or past the tight batch). Reserved memory moves in steps, so
   two nearby fits can show a flat or falling line: it gives way to the hint's slope where
   one is known (``ALGORITHM`` 3; version 2 dropped the model and, with nothing too large
   yet, doubled). A prediction at or past a known failure is dropped for bisection. A
   right model ends the search in four probes (start, 2x, p + 1, p);
3. a ``hint`` (optional, unused unless a caller gives one): a predicted largest batch
   that fits, e.g. from a memory model that needs no probe at all. It is probed first
   (in place of ``start``), then ``hint + 1`` if it fit; a right hint ends the search in
   two probes. With the hint comes, optionally, the model's slope (``hint_slope_gib``,
   GiB each further batch element adds): then one fitting batch and the slope make the
   line of rule 2, and a hint that was too large is followed by ``HINT_BACKOFF`` below
   the smallest batch too large, while nothing has fit; a hint that ran tight (its peak
   over the capacity, known) by the batch its peak and the slope put under the capacity
   (``ALGORITHM`` 2), then the back-off if that too was too large. A hint a little over
   ends the search in about three probes (it, the back-off or the slope's batch, the
   line's batch) where bisection from 1 took six or seven. A wrong hint falls back to
   rules 1 and 2;
4. never more than ``floor(log2(max)) + 3`` probes (``bound``): a probe is accepted only
   if plain bisection could still finish within the probes left whatever its outcome;
   otherwise the midpoint of (lo, hi) is probed, which always keeps that promise;
5. a ``step`` (default 1): only multiples of it are probed, the answer is one, and the
   rules above run on the batch counted in steps (batch // step; the hint rounded down to
   a step, its slope times the step), within ``floor(log2(max // step)) + 3`` probes. An
   FP8 cell needs it: a rank's micro-batch tokens must be a multiple of 16
   (llmbench.fp8), which at sequence 350 only multiples of 8 sequences are.

Memory is assumed monotone in the batch size: if b fits, every smaller batch fits; if b
is too large, every larger one is. A probe that ends neither fitting nor too large
(timeout, error) stops the search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

#: a probe's outcomes that bound the search (anything else stops it); tight: it ran, but
#: its peak memory left less than the search's headroom free (it counts as too large)
BOUNDING = ("ok", "oom", "tight")
TOO_LARGE = ("oom", "tight")
#: fitting batch sizes (with a peak) the memory model needs (one where the hint's slope is known)
MODEL_POINTS = 2
#: after a hint too large, and while nothing fits, probe this fraction below the smallest
#: batch too large (the memory model's 90th-percentile error is 6.5%, plus the headroom)
HINT_BACKOFF = 0.1
#: the version of next_probe's rules a search records (search.json ``algorithm``; absent: 1),
#: so that a replay reproduces the probes it made; 2 reads the peak of a probe that ran tight
#: (rule 2's line across the interval, rule 3's tight hint); 3 puts the hint's slope in
#: place of a line through two fits that does not rise
ALGORITHM = 3


def bound(max_batch: int) -> int:
    """Most probes the search makes for a search space of 1..max_batch."""
    return int(math.floor(math.log2(max_batch))) + 3


@dataclass(kw_only=True, slots=True)
class Probe:
    """One probed batch size and what it showed."""

    batch_size: int
    status: str
    """ok | oom | tight | timeout | error: what the batch showed (for a probe answered from
    the frontier, what it showed when it ran; its record then says skipped)."""
    peak_gib: float | None = None
    """Peak memory per rank of the probe (the metric the capacity is compared with)."""
    wall_s: float = 0.0
    """Wall-clock seconds the probe took (about 0 for one answered from the frontier)."""
    source: str = "run"
    """run: the probe ran; resumed: it ran in an earlier, stopped run of this search (its
    record put back, its wall_s the record's); frontier: answered from the frontier file
    without running (a skipped record)."""
    chosen_by: str = "doubling"
    """doubling | bisection | model | hint | safeguard: why this batch was probed."""
    reason: str = ""
    """Why the status is what it is (empty for a plain fit)."""


@dataclass(kw_only=True, slots=True)
class State:
    """What the search knows: its settings and its probes, in order."""

    start: int
    """First batch probed (without a hint): the config's max_batch.start."""
    max_batch: int
    """Largest batch the search may probe (its space is 1..max_batch)."""
    capacity_gib: float | None = None
    """The peak memory a fitting batch may reach (capacity less headroom); None: unknown."""
    hint: int | None = None
    """A predicted largest batch that fits (0: none; clamped into 1..max_batch): probed
    first, then its neighbour above if it fit. None (the default): the search starts at
    ``start``."""
    hint_slope_gib: float | None = None
    """The hint's predicted GiB per further batch element (None: unknown): with it one
    fitting batch is enough for the line of ``predict``."""
    algorithm: int = ALGORITHM
    """Which version of the rules next_probe follows (``ALGORITHM``; a replay of a search
    passes the one it recorded)."""
    step: int = 1
    """The batches probed are multiples of it (rule 5); start and max_batch too."""
    probes: list[Probe] = field(default_factory=list)
    """The probes made so far, in order."""

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ValueError(f"step must be >= 1, got {self.step}")
        if self.start % self.step or self.max_batch % self.step:
            raise ValueError(f"start ({self.start}) and max_batch ({self.max_batch}) must be multiples of step "
                             f"({self.step})")
        if not 1 <= self.start <= self.max_batch:
            raise ValueError(f"start must be in 1..max_batch ({self.max_batch}), got {self.start}")
        if self.hint is not None and self.hint < 0:
            raise ValueError(f"hint must be >= 0 or None, got {self.hint}")

    @property
    def lo(self) -> int:
        """The largest batch known to fit (0: none yet)."""
        return max((p.batch_size for p in self.probes if p.status == "ok"), default=0)

    @property
    def hi(self) -> int:
        """The smallest batch known to be too large (max_batch + step: none yet)."""
        return min((p.batch_size for p in self.probes if p.status in TOO_LARGE), default=self.max_batch + self.step)

    @property
    def done(self) -> bool:
        """Whether the answer is known (hi = lo + step) or a probe stopped the search."""
        stopped = any(p.status not in BOUNDING for p in self.probes)
        return stopped or self.hi - self.lo <= self.step

    @property
    def bound(self) -> int:
        """Most probes this search makes (``bound`` of its space counted in steps)."""
        return bound(self.max_batch // self.step)

    def in_steps(self) -> State:
        """The same search with batches counted in steps (rule 5): what next_probe decides on."""
        if self.step == 1:
            return self
        k = self.step
        return State(start=self.start // k, max_batch=self.max_batch // k, capacity_gib=self.capacity_gib,
                     hint=None if self.hint is None else self.hint // k,
                     hint_slope_gib=None if self.hint_slope_gib is None else self.hint_slope_gib * k,
                     algorithm=self.algorithm, probes=[replace(p, batch_size=p.batch_size // k) for p in self.probes])


def predict(probes: list[Probe], capacity_gib: float | None, slope_gib: float | None = None,
            algorithm: int = ALGORITHM) -> int | None:
    """The largest batch the line through the peak memory of the two largest fitting
    batches keeps under the capacity; with one fitting batch, the line through it with
    ``slope_gib`` (a memory model's GiB per batch element). From ``algorithm`` 2, where the
    smallest batch too large ran tight (its peak known, above the largest fit's), also the
    line through the largest fit and it, and the larger of the two batches below the tight
    one (reserved memory grows in steps: either line can fall a batch short); with no fit
    and the tight batch the only one too large, the line through it with ``slope_gib``.
    None without a capacity, enough points, or a rising line."""
    pts = sorted({p.batch_size: p.peak_gib for p in probes if p.status == "ok" and p.peak_gib is not None}.items())
    if capacity_gib is None:
        return None
    line = _line(pts, capacity_gib, slope_gib, algorithm)
    over = _tight_bound(probes) if algorithm >= 2 else None
    if over is None:
        return line
    if pts and over[1] > pts[-1][1]:
        (b0, m0), (b1, m1) = pts[-1], over
        across = int(math.floor(b0 + (capacity_gib - m0) * (b1 - b0) / (m1 - m0)))
        return across if line is None or line >= over[0] else max(line, across)
    if not pts and slope_gib and slope_gib > 0 and sum(p.status in TOO_LARGE for p in probes) == 1:
        return int(math.floor(over[0] + (capacity_gib - over[1]) / slope_gib))
    return line


def _line(pts: list[tuple[int, float]], capacity_gib: float, slope_gib: float | None,
          algorithm: int = ALGORITHM) -> int | None:
    """Rule 2's line through the two largest fits (or the largest and ``slope_gib``, and from
    ``algorithm`` 3 where the two fits' line does not rise): the largest batch it keeps under
    the capacity, or None."""
    if not pts:
        return None
    if len(pts) >= MODEL_POINTS:
        (b0, m0), (b1, m1) = pts[-2], pts[-1]
        slope = (m1 - m0) / (b1 - b0)
        if slope <= 0 and algorithm >= 3 and slope_gib is not None:
            slope = slope_gib
    elif slope_gib is not None:
        (b1, m1), slope = pts[-1], slope_gib
    else:
        return None
    if slope <= 0:
        return None
    return int(math.floor(b1 + (capacity_gib - m1) / slope))


def _tight_bound(probes: list[Probe]) -> tuple[int, float] | None:
    """(batch, peak) of the smallest batch too large where it ran tight (has a peak) and lies
    above every fitting batch; None otherwise (an OOM shows no peak)."""
    over = [p for p in probes if p.status in TOO_LARGE]
    if not over:
        return None
    smallest = min(over, key=lambda p: p.batch_size)
    fits = [p.batch_size for p in probes if p.status == "ok"]
    if smallest.status != "tight" or smallest.peak_gib is None or smallest.batch_size <= max(fits, default=0):
        return None
    return smallest.batch_size, smallest.peak_gib


def _keeps_bound(c: int, lo: int, hi: int, left: int) -> bool:
    """After probing c (whatever it shows), can bisection finish in ``left - 1`` probes?"""
    if not lo < c < hi:
        return False
    worst = max(c - lo, hi - c)
    return math.ceil(math.log2(worst)) <= left - 1 if worst > 1 else left >= 1


def next_probe(state: State) -> tuple[int, str] | None:
    """The next batch to probe and why, or None when the search is over."""
    if state.step > 1:
        nxt = next_probe(state.in_steps())
        return None if nxt is None else (nxt[0] * state.step, nxt[1])
    if state.done:
        return None
    lo, hi = state.lo, state.hi
    left = bound(state.max_batch) - len(state.probes)
    if not state.probes:
        if state.hint is not None:
            return min(max(state.hint, 1), state.max_batch), "hint"
        return state.start, "doubling"
    candidates: list[tuple[int, str]] = []
    first = state.probes[0] if state.hint is not None and state.probes[0].chosen_by == "hint" else None
    pred = predict(state.probes, state.capacity_gib, state.hint_slope_gib, state.algorithm)
    if first is not None and first.status == "ok" and (pred is None or pred <= first.batch_size):
        candidates.append((first.batch_size + 1, "hint"))  # the hint fit: is it the largest?
    # the hint over, nothing fits yet: just below it; after the model's batch where a tight
    # hint's own peak gave one (ALGORITHM 2)
    over_hint = first is not None and first.status in TOO_LARGE and lo == 0
    backoff = (max(1, math.floor(hi * (1 - HINT_BACKOFF))), "hint")
    backoff_first = over_hint and not (state.algorithm >= 2 and pred is not None)
    if backoff_first:
        candidates.append(backoff)
    if pred is not None:
        if hi > state.max_batch:  # nothing too large yet: the model's OOM side sets hi
            candidates.append((min(max(pred + 1, lo + 1), state.max_batch), "model"))
        elif pred < hi:  # then its fitting side
            candidates.append((min(max(pred, lo + 1), hi - 1), "model"))
        # else: the model points at or past a known failure; bisection below
    if over_hint and not backoff_first:
        candidates.append(backoff)
    if hi > state.max_batch and not any(p.status in TOO_LARGE for p in state.probes):
        candidates.append((min(2 * lo, state.max_batch), "doubling"))
    candidates.append(((lo + hi) // 2, "bisection"))
    probed = {p.batch_size for p in state.probes}
    for c, why in candidates:
        if c in probed:
            continue
        if _keeps_bound(c, lo, hi, left):
            return c, why
    return (lo + hi) // 2, "safeguard"
