"""Fine-tuning with isotropy calibration in the forward pass, IsoBN or the I-STAR regulariser.

`finetune(model, train_inputs=..., train_labels=..., eval_inputs=..., n_outputs=..., method=...)`
trains a linear head on the pooled sentence vector together with the encoder and returns
predictions, sentence vectors before / after fine-tuning (and after the calibration layer), seconds
per epoch and the hyper-parameters used. The layers are usable on their own: `CalibrationLayer`
(a fitted `lmgeom.calibrate` calibrator as a differentiable torch module; how it is kept fitted
during training: `CalibrationOptions`), `IsoBN`, `IStar`.
Method notes: docs/finetune.md.
"""

from __future__ import annotations

from lmgeom.finetune.calibration import CalibrationLayer, CalibrationOptions, torch_calibration
from lmgeom.finetune.isobn import IsoBN
from lmgeom.finetune.istar import IStar
from lmgeom.finetune.train import METHODS, FineTuneOptions, FineTuneResult, finetune

__all__ = ["METHODS", "CalibrationLayer", "CalibrationOptions", "FineTuneOptions", "FineTuneResult", "IStar", "IsoBN", "finetune", "torch_calibration"]
