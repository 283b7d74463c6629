"""The training scenario (llmbench.train.scenario) driven by a fake backend: no worker process."""

import resource

import pytest
import torch

from llmbench.protocol import Protocol, Window
from llmbench.train import scenario


class FakeBackend:
    """Counts what the scenario asks of it; its 'loss' is the sum of the ids it was given."""

    def __init__(self, data_rank: int = 0, data_parallel: int = 1) -> None:
        self.layout = scenario.Layout(data_rank=data_rank, data_parallel=data_parallel)
        self.events: list[str] = []
        self.seen: list[torch.Tensor] = []
        self.weights: torch.Tensor | None = None

    def build(self) -> scenario.Layout:
        self.events.append("build")
        self.weights = torch.randn(4)  # drawn from the global generator the scenario seeded
        return self.layout

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        self.events.append("step")
        self.seen.append(ids)
        return ids.sum().float()

    def synchronize(self) -> None:
        self.events.append("sync")


PROTO = Protocol(warmup_steps=3, measured_steps=5, repeats=1, seq_len=16, timeout_s=10, seed=7)


def run(backend, proto=PROTO, batch_size=2, vocab_size=50, **kw):
    return scenario.run(backend, proto, batch_size=batch_size, vocab_size=vocab_size, accelerator="cpu",
                        device="cpu", **kw)


def test_builds_once_then_warmup_then_timed_steps_between_synchronizes():
    fake = FakeBackend()
    result = run(fake)
    assert fake.events == ["build"] + ["step"] * 3 + ["sync"] + ["step"] * 5 + ["sync"]
    assert result.window.steps == 5 and len(result.window.step_times_s) == 5
    assert result.world_size == 1


def test_after_window_steps_run_after_the_window_and_are_not_timed():
    fake = FakeBackend()

    def traced(step):
        for _ in range(4):
            step()

    result = run(fake, after_window=traced)
    assert fake.events == ["build"] + ["step"] * 3 + ["sync"] + ["step"] * 5 + ["sync"] + ["step"] * 4
    assert result.window.steps == 5


def test_tokens_per_step_count_data_parallel_replicas_and_the_payload_keys():
    result = run(FakeBackend(data_parallel=3), batch_size=2)
    assert result.global_batch_tokens == 2 * 16 * 3
    payload = result.payload()
    assert payload["tokens_per_s"] == pytest.approx(2 * 16 * 3 * 5 / payload["elapsed_s"])
    assert payload["step_time_s"] == pytest.approx(payload["elapsed_s"] / 5)
    # the keys llmbench.aggregate.build_record reads from every training worker's result
    assert {"world_size", "elapsed_s", "steps", "step_times_s", "tokens_per_s", "step_time_s", "global_batch_tokens",
            "peak_mem_allocated_gib", "peak_mem_reserved_gib", "peak_rss_gib", "loss_last"} == set(payload)


def test_synthetic_ids_in_range_one_batch_for_every_step_and_seeded():
    fake = FakeBackend()
    run(fake, vocab_size=50)
    ids = fake.seen[0]
    assert ids.shape == (2, 16) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < 50
    assert all(s is ids for s in fake.seen)  # made once, outside the timed window
    again = FakeBackend()
    run(again, vocab_size=50)
    assert torch.equal(again.seen[0], ids)
    assert torch.equal(again.weights, fake.weights)  # the weights' generator is seeded too


def test_ids_differ_between_data_parallel_replicas_and_seeds():
    a = scenario.synthetic_ids(32000, 2, 64, 0, 0, "cpu")
    b = scenario.synthetic_ids(32000, 2, 64, 0, 1, "cpu")
    c = scenario.synthetic_ids(32000, 2, 64, 1, 0, "cpu")
    assert not torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, scenario.synthetic_ids(32000, 2, 64, 0, 0, "cpu"))


def test_ids_do_not_consume_the_weights_generator():
    torch.manual_seed(3)
    expected = torch.randn(3)
    torch.manual_seed(3)
    scenario.synthetic_ids(100, 1, 8, 3, 0, "cpu")
    assert torch.equal(torch.randn(3), expected)


def test_last_loss_read_after_the_window_and_none_without_one():
    fake = FakeBackend()
    result = run(fake)
    assert result.loss_last == pytest.approx(float(fake.seen[-1].sum()))

    class NoLoss(FakeBackend):  # a pipeline stage that is not the last
        def step(self, ids):
            super().step(ids)
            return None

    assert run(NoLoss()).loss_last is None


def test_peak_memory_on_cpu_is_host_rss_only():
    result = run(FakeBackend())
    assert result.peak.allocated_gib is None and result.peak.reserved_gib is None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    assert 0 < result.peak.rss_gib <= rss
    payload = result.payload()
    assert payload["peak_rss_gib"] == result.peak.rss_gib and payload["peak_mem_allocated_gib"] is None


def test_peak_memory_reads_the_cuda_allocator_peaks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    peak = scenario.peak_memory("cpu", "cuda")  # the tensor stays on the CPU: only the readings are faked
    assert (peak.allocated_gib, peak.reserved_gib) == (3.0, 4.0) and peak.rss_gib > 0


def test_peak_memory_of_one_rank_calls_no_collective_and_several_free_the_cache_first(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: calls.append("all_reduce") or t.mul_(2))
    # one rank: its own peaks; a collective there could be NCCL's first, needing GPU memory
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    peak = scenario.peak_memory("cpu", "cuda")
    assert calls == [] and (peak.allocated_gib, peak.reserved_gib) == (3.0, 4.0)
    # several: the max over the ranks, after the cached blocks went back
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    peak = scenario.peak_memory("cpu", "cuda")
    assert calls == ["empty_cache", "all_reduce"] and (peak.allocated_gib, peak.reserved_gib) == (6.0, 8.0)


def test_peak_memory_counters_reset_after_the_build_before_the_steps(monkeypatch):
    order = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: order.append("reset"))
    monkeypatch.setattr(scenario, "peak_memory", lambda device, acc: order.append("read") or scenario.PeakMemory(
        allocated_gib=1.0, reserved_gib=2.0, rss_gib=0.5))

    class Recording(FakeBackend):
        def build(self):
            order.append("build")
            return super().build()

        def step(self, ids):
            order.append("step")
            return super().step(ids)

    result = scenario.run(Recording(), PROTO, batch_size=1, vocab_size=10, accelerator="cuda", device="cpu")
    assert order == ["build", "reset"] + ["step"] * 8 + ["read"]
    assert result.peak.allocated_gib == 1.0


def test_repeat_result_validates():
    window = Window(steps=1, elapsed_s=0.0, step_times_s=(0.0,))
    peak = scenario.PeakMemory(allocated_gib=None, reserved_gib=None, rss_gib=1.0)
    with pytest.raises(ValueError, match="window.elapsed_s"):
        scenario.RepeatResult(world_size=1, window=window, global_batch_tokens=1, peak=peak, loss_last=None)
