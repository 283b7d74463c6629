"""The DeepSpeed config a cell trains with (llmbench.train.deepspeed_worker.ds_config), read by
DeepSpeed's own config parser."""

import pytest

from llmbench import techniques
from llmbench.train.deepspeed_worker import ds_config


@pytest.mark.parametrize("technique", ["Naive", "Z2+O", "Z3", "Q", "L", "QL+Z2"])
@pytest.mark.parametrize("accelerator", ["cuda", "cpu"])
def test_deepspeeds_throughput_timer_is_off(monkeypatch, technique, accelerator):
    """On by default, it synchronises the device twice a step inside the timed window."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.config import get_timers_config

    assert get_timers_config({}).enabled is True  # DeepSpeed's default, which the cells turn off
    config = ds_config(techniques.parse(technique), 2, accelerator, bf16=accelerator == "cuda")
    assert get_timers_config(config).enabled is False
