"""Short MiniLM fine-tuning runs of the flow inside the forward pass: is its output degenerate, and why?"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from lmgeom.evaluate.tasks import load_task, matthews
from lmgeom.finetune import FineTuneOptions, finetune
from lmgeom.stages.experiments.core import geometry, subsample
from lmgeom.stages.experiments.finetuning import degenerate_reasons

# "stale" / "refit": fresh flow re-fits, without / with the re-fit after the last step;
# "continued-stale" / "continued": re-fits that continue the previous flow (the default)
variant = sys.argv[1]
task = load_task("cola", "../shared/data/GLUE/CoLA")
rows = subsample(len(task.splits["train"].inputs), 1000, 0)
dev_rows = subsample(len(task.splits["dev"].inputs), 400, 0)
train_inputs = [task.splits["train"].inputs[r] for r in rows]
labels = task.splits["train"].labels[rows]
# the layer is also applied to the first 400 training inputs (inside its fit distribution)
evals = {"dev": [task.splits["dev"].inputs[r] for r in dev_rows], "train400": train_inputs[:400]}
options = FineTuneOptions(epochs=2, batch_size=32, learning_rate=1e-4, recalibrate_every=50, seed=0, device="cpu",
                          refit_after_last=not variant.endswith("stale"), method_params={"recalibration_inputs": 1000,
                                                                  "continue_refits": variant.startswith("continued")})
started = time.perf_counter()
result = finetune("minilm", train_inputs=train_inputs, train_labels=labels, eval_inputs=evals, n_outputs=2,
                  method="flow", options=options)
out = {"variant": variant, "seconds": time.perf_counter() - started, "notes": result.notes,
       "mcc_dev": matthews(task.splits["dev"].labels[dev_rows], result.predictions["dev"])}
for split in evals:
    for state in ("after", "calibrated"):
        X = result.sentence_vectors[state][split].astype(np.float64)
        g = geometry(X)
        out[f"{state}_{split}"] = {**g, "degenerate": degenerate_reasons(X, g), "max_abs": float(np.abs(X).max()),
                                   "median_norm": float(np.median(np.linalg.norm(X, axis=1))),
                                   "max_norm": float(np.linalg.norm(X, axis=1).max()),
                                   "std_min": float(X.std(0).min()), "std_max": float(X.std(0).max())}
print(json.dumps(out, indent=1, default=float))
