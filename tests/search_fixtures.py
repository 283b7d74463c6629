"""Fixtures that tests of more than one tier share: a config whose searched cell
llmbench.offline estimates, and a probe record with what the estimate reads (a module of its
own: ``conftest`` names a different file in each tier's folder)."""

import json

#: a config whose searched cell offline-batch and llmbench.offline estimate (3 + 10 steps, 2 repeats)
ESTIMATE_CONFIG = """
protocol: {warmup_steps: 3, measured_steps: 10, repeats: 2, seq_len: 350}
finetune:
  - platforms: [h100]
    models: [llama2-7b]
    techniques: [L+R]
    gpus: 1
    max_batch: {max: 512, probe: {warmup_steps: 1, measured_steps: 2}}
"""


def probe_record(wall_s: float, window_s: float, status: str = "ok") -> str:
    """A probe record's JSON with what an estimate reads: its protocol (1 + 2 steps), timed
    window and wall time."""
    return json.dumps({"status": status, "cell": {"protocol": {"warmup_steps": 1, "measured_steps": 2}},
                       "summary": {"phase_window_s": window_s},
                       "provenance": {"started": "2026-11-26T06:00:00+00:00",
                                      "finished": f"2026-11-26T06:{int(wall_s) // 60:02d}:{int(wall_s) % 60:02d}+00:00"}})
