"""Predicted step time and tokens/s of a training cell (DeepSpeed; Megatron-LM as data parallel).

Terms on the host's side and the GPU's, which overlap (model), constants fitted on our own H100/H200 records only (calibrate), and a
score against the paper's Tables II, III, IV and IX, which never enter the fit (score); a
prediction with its interval and a note for each way a cell lies outside what the
calibration records cover (interval.predict).
The paper's numbers stay out of calibration by construction: calibrate reads only the
combined view's tidy table of our runs, filtered to our platforms (CALIBRATION_PLATFORMS),
and never imports llmbench.report.paper_frame or config/reference; a unit test holds it so.
See docs/throughput-model.md.
"""

from .calibrate import CALIBRATION_PLATFORMS, fit
from .interval import Prediction, predict
from .model import (CALIBRATED, OVERLAP, SIDES, TERMS, Hardware, TrainCell, hardware, sides, step_time_s, terms,
                    tokens_per_s)
