"""Paired sets: the cells of one comparison, measured together on one machine in one job,
their repeats interleaved (llmbench.launch.run_set), so that what differs between two
machines (a host-bound batch-1 cell moves by tens of percent between lent machines) falls
on both sides of a comparison alike.

A training or serve block names its set with ``paired: <name>`` (kebab-case). Every cell
that blocks naming the same set expand to on one platform belongs to the paired set
``<name>-<platform>``, in the order the blocks expand them; a set holds training cells or
serving cells, never both. Its repeats run in rounds: round r runs repeat r of every cell
that still needs one, in the round's order (``paired_order``: ``shuffle``, a shuffle seeded
with the protocol seed + r, the default; or ``rotate``: A B C, B C A, C A B, ...).

A serving cell has no repeats: the independent runs of one serving point are cells of their
own whose loads are named ``<point>-1``, ``<point>-2``, ... with identical load specs
(llmbench.serve.runs pools them). In a set, the runs of one point are that point's repeats:
round r runs run r+1 of every point that has one, the points in the round's order (a point's
runs in the order of their numbers; a cell that is no run of a point is a point of one run).
Two engines under ``burst-1..3`` are so: burst-1 of each, then burst-2 of each, ... A cell's
path, record and target stay its own; the workflow runs a set as one job whose outputs are
its records (workflow/rules/training.smk, workflow/rules/serving.smk).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cells import Cell, ServeCell
from ..config import ConfigError, schema_properties

#: How a set's cells are ordered within each round (the config schema's enum)
ORDERS = tuple(schema_properties("")["paired_order"]["enum"])
#: Where the records of an incomplete set go before it is measured again (Incomplete)
SUPERSEDED = "superseded"
#: A serving load named as one run of a point: ``<point>-<run>`` (llmbench.serve.runs too)
RUN_NAME = re.compile(r"^(?P<point>.+)-(?P<run>\d+)$")


def seed_of(cell: Cell | ServeCell) -> int:
    """The seed a set's shuffle starts from, its first cell's: the protocol seed (a serving
    cell carries the config's protocol seed as its own)."""
    return cell.seed if isinstance(cell, ServeCell) else cell.protocol.seed


def serving_points(cells: Iterable[ServeCell]) -> list[list[int]]:
    """The serving points of ``cells`` (indices into it), each its runs in the order of their
    numbers: cells whose loads are ``<point>-<k>`` with one ``<point>``, whose load specs
    and other fields are identical, are the runs of one point (as llmbench.serve.runs pools
    them); any other cell is a point of one run. Points in the order of their first cell."""
    points: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(cells):
        m = RUN_NAME.match(c.load)
        point, run = (m["point"], int(m["run"])) if m else (c.load, 0)
        same = json.dumps({**c.to_dict(), "load": point}, sort_keys=True) if m else f"{i}"
        points.setdefault(same, []).append((run, i))
    return [[i for _, i in sorted(runs)] for runs in points.values()]


def engine_sessions(to_run: Iterable[int], cells: Sequence[ServeCell], share: bool) -> list[list[int]]:
    """The engine starts of a serving set's round: its runs (cell indices, in the round's order)
    in groups that one engine serves, the consecutive runs of one launch
    (ServeCell.launch_key) where the set shares engines (llmbench.serve.bench.EngineSession),
    else one run each."""
    groups: list[list[int]] = []
    for i in to_run:
        if share and groups and cells[groups[-1][-1]].launch_key == cells[i].launch_key:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def round_order(n: int, r: int, how: str, seed: int) -> list[int]:
    """The order of a set's ``n`` cells (their indices) in round ``r``: ``shuffle``, a
    shuffle seeded with ``seed + r`` (the same on every machine and Python: random.Random
    of an int); ``rotate``, the set's order started at cell r mod n."""
    if how == "shuffle":
        return random.Random(seed + r).sample(range(n), n)
    if how == "rotate":
        return [(r + k) % n for k in range(n)]
    raise ValueError(f"paired_order {how!r}: one of {', '.join(ORDERS)}")


@dataclass(kw_only=True, slots=True, frozen=True)
class PairedSet:
    """The cells of one comparison on one platform, measured in one job."""

    name: str
    """The set's name as the blocks give it (``paired``)."""
    platform: str
    """The platform every cell of the set runs on."""
    cells: tuple[Cell, ...] | tuple[ServeCell, ...]
    """Its cells, in the order the blocks expand them (the set's order)."""
    order: str = "shuffle"
    """How each round orders the cells (ORDERS)."""
    seed: int = 0
    """The shuffle's seed before the round is added: the protocol seed of the set's first cell."""
    share_engine: bool = False
    """A serving set's runs of one engine launch in a round are served by one engine
    (llmbench.serve.bench.EngineSession): the round orders its launches, each launch's points
    run one after the other in the set's order (serve blocks' ``share_engine``)."""

    def __post_init__(self) -> None:
        if not self.cells or any(c.platform != self.platform for c in self.cells):
            raise ConfigError(f"paired set {self.id}: its cells must run on platform {self.platform!r}")
        if len({isinstance(c, ServeCell) for c in self.cells}) > 1:
            raise ConfigError(f"paired set {self.id}: its cells must all be serving cells or all training cells")
        if self.order not in ORDERS:
            raise ConfigError(f"paired set {self.id}: paired_order {self.order!r}; one of {', '.join(ORDERS)}")
        if self.share_engine and not self.serving:
            raise ConfigError(f"paired set {self.id}: share_engine applies to serving sets only")

    @property
    def id(self) -> str:
        """``<name>-<platform>``: what the records and the workflow's rule call it."""
        return f"{self.name}-{self.platform}"

    @property
    def rule_name(self) -> str:
        """The name of the workflow's rule that runs it (an identifier)."""
        return "run_paired_set_" + self.id.replace("-", "_").replace(".", "_")

    @property
    def serving(self) -> bool:
        """Whether its cells are serving cells (workflow/rules/serving.smk runs it)."""
        return isinstance(self.cells[0], ServeCell)

    @property
    def rounds(self) -> int:
        """Rounds of repeats: the most repeats any cell of the set has (a serving set: the
        most runs any of its points has, serving_points)."""
        if self.serving:
            return max(len(p) for p in serving_points(self.cells))
        return max(c.protocol.repeats for c in self.cells)

    @property
    def gpus(self) -> int:
        """GPUs the set's job holds: its largest cell's."""
        return max(c.gpus for c in self.cells)

    def record_paths(self, results_dir: str = "results") -> list[str]:
        """Its cells' records, in the set's order."""
        return [c.record_path(results_dir) for c in self.cells]

    def plan(self) -> dict[str, Any]:
        """What the launcher needs besides the cells' specs (llmbench.launch.run_set,
        llmbench.serve.paired.run_set): the id, each cell's record path relative to the results
        folder, the order of every round (the cells' indices; a training set's rounds list all
        its cells and run those that still need a repeat, a serving set's round r lists run
        r+1 of each of its points, the points in the round's order), the rule and the seed."""
        if self.serving:
            points = serving_points(self.cells)
            # the units a round orders: each point, or where engines are shared the points of
            # one launch (in the set's order), which run one after the other on one engine
            units = [[p] for p in range(len(points))]
            if self.share_engine:
                launches: dict[str, list[int]] = {}
                for p, runs in enumerate(points):
                    launches.setdefault(self.cells[runs[0]].launch_key, []).append(p)
                units = list(launches.values())
            rounds = [[points[p][r] for u in round_order(len(units), r, self.order, self.seed) for p in units[u]
                       if r < len(points[p])] for r in range(self.rounds)]
        else:
            rounds = [round_order(len(self.cells), r, self.order, self.seed) for r in range(self.rounds)]
        return {"id": self.id, "cells": [c.pattern.format(**c.key) for c in self.cells], "rounds": rounds,
                "ordering": self.order, "seed": self.seed if self.order == "shuffle" else None,
                **({"share_engine": True} if self.share_engine else {})}


def check_block(block: dict[str, Any], where: str) -> None:
    """A training or serve block's ``paired`` and ``paired_order`` keys against the rest of
    the block (errors name the key): a set's cells are fixed cells of one node."""
    name = block.get("paired")
    if name is None:
        if block.get("paired_order") is not None:
            raise ConfigError(f"{where}.paired_order: only with paired (the block names no paired set)")
        if block.get("share_engine"):
            raise ConfigError(f"{where}.share_engine: only with paired (engines are shared within a paired set's "
                              "job; name one with the block's paired key)")
        return
    if block.get("max_batch") is not None:
        raise ConfigError(f"{where}.paired: a paired set measures fixed cells, and max_batch is a search whose "
                          "cells are known only once it ran; give batch_sizes (e.g. the batch a search found)")
    if block.get("nodes", 1) > 1:
        raise ConfigError(f"{where}.paired: a paired set runs on one machine, and nodes: {block['nodes']} spans "
                          "several; measure cells over nodes alone")


class Membership:
    """The sets that a grid's blocks name, collected while the grid expands (a Builder
    holds one): each cell in at most one set, the sets' ids unique, one order per set."""

    def __init__(self, default_order: str) -> None:
        self.default_order = default_order
        self.cells: dict[tuple[str, str], dict[str, Cell | ServeCell]] = {}
        self.where: dict[tuple[str, str], str] = {}
        self.orders: dict[str, tuple[str, str]] = {}
        self.sharing: dict[str, tuple[bool, str]] = {}
        self.kinds: dict[str, tuple[bool, str]] = {}
        self.owner: dict[str, tuple[str, str]] = {}

    def add(self, block: dict[str, Any], where: str, cell: Cell | ServeCell, results_dir: str) -> None:
        """Put ``cell`` (of the block at ``where``) into the block's set, if it names one."""
        name = block.get("paired")
        if name is None:
            return
        order = block.get("paired_order") or self.default_order
        first = self.orders.setdefault(name, (order, where))
        if first[0] != order:
            raise ConfigError(f"{where}.paired_order: {order!r}, but {first[1]} orders paired set {name!r} "
                              f"{first[0]!r}; give every block of the set the same paired_order")
        share = bool(block.get("share_engine"))
        first_share = self.sharing.setdefault(name, (share, where))
        if first_share[0] != share:
            raise ConfigError(f"{where}.share_engine: {share}, but {first_share[1]} says {first_share[0]} for paired "
                              f"set {name!r}; give every block of the set the same share_engine")
        serving = isinstance(cell, ServeCell)
        kind = self.kinds.setdefault(name, (serving, where))
        if kind[0] != serving:
            raise ConfigError(f"{where}.paired: paired set {name!r} is named by {kind[1]} too; a set holds "
                              "serving cells or training cells, not both (give one of them another name)")
        key, path = (name, cell.platform), cell.record_path(results_dir)
        if self.owner.setdefault(path, key) != key:
            other = self.owner[path]
            raise ConfigError(f"{where}.paired: cell {path} is already in paired set {other[0]!r} "
                              f"({self.where[other]}); a cell belongs to one set")
        self.where.setdefault(key, where)
        self.cells.setdefault(key, {})[path] = cell

    def sets(self, seed_of: Callable[[Cell | ServeCell], int] = seed_of) -> tuple[PairedSet, ...]:
        """The sets, in the order the blocks first name them; two whose ids collide (a name
        ending in another set's platform) are an error."""
        out: dict[str, PairedSet] = {}
        for (name, platform), cells in self.cells.items():
            cells_ = tuple(cells.values())
            s = PairedSet(name=name, platform=platform, cells=cells_, order=self.orders[name][0],
                          seed=seed_of(cells_[0]), share_engine=self.sharing.get(name, (False,))[0])
            if s.id in out:
                raise ConfigError(f"{self.where[(name, platform)]}.paired: paired set id {s.id!r} is also "
                                  f"set {out[s.id].name!r} on platform {out[s.id].platform!r}; rename one")
            out[s.id] = s
        return tuple(out.values())


@dataclass(kw_only=True, slots=True, frozen=True)
class Incomplete:
    """A paired set some of whose records are present and some missing."""

    set: PairedSet
    present: tuple[str, ...]
    missing: tuple[str, ...]

    def message(self, results_dir: str) -> str:
        """What is wrong, and how to measure the set again without losing what is there."""
        aside = [f"  mkdir -p {Path(results_dir, SUPERSEDED, rel(p, results_dir)).parent} && "
                 f"mv {p} {Path(results_dir, SUPERSEDED, rel(p, results_dir))}" for p in self.present]
        return (f"paired set {self.set.id}: {len(self.present)} of its {len(self.set.cells)} records are present, "
                f"{len(self.missing)} missing.\n"
                + "".join(f"  missing: {p}\n" for p in self.missing)
                + "".join(f"  present: {p}\n" for p in self.present)
                + "Its cells are measured together, in one job whose outputs are all of its records, and "
                "Snakemake deletes a job's present outputs before it runs it. To measure the set again, move the "
                f"present records aside first ({results_dir}/{SUPERSEDED}/ keeps them out of the grid):\n"
                + "\n".join(aside)
                + "\nor take the missing cells out of the set (their block's paired key).")


def rel(path: str, results_dir: str) -> str:
    """``path`` relative to ``results_dir`` (as a set's records name its cells)."""
    return Path(path).relative_to(results_dir).as_posix()


def incomplete(sets: Iterable[PairedSet], results_dir: str,
               exists: Callable[[str], bool] = lambda p: Path(p).exists()) -> list[Incomplete]:
    """The sets (a grid's) with some records under ``results_dir`` present and some missing:
    the workflow would delete the present ones to run the set (Incomplete.message)."""
    out = []
    for s in sets:
        paths = s.record_paths(results_dir)
        present = tuple(p for p in paths if exists(p))
        if present and len(present) < len(paths):
            out.append(Incomplete(set=s, present=present, missing=tuple(p for p in paths if p not in present)))
    return out

