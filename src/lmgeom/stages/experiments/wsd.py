"""`lmgeom experiment wsd`: Peters et al.'s (2018, Table 5) word sense disambiguation per layer.

For each of the five all-words test sets of Raganato et al.'s framework (Senseval-2, Senseval-3,
SemEval-2007, 2013, 2015) the sense vectors are the means of the tagged occurrences in the **other
four** (leave one dataset out: Peters et al. built them from SemCor, which the framework's public
copy here lacks, so this is a deviation). A test instance takes the nearest sense of its lemma and
POS; one whose lemma and POS the other four sets never tag is *not covered* and gets WordNet's first
sense. Reported per layer: F1 on each set and on ALL with the back-off, F1 on the covered instances
only, the two baselines without vectors on both (WordNet's first sense; the lemma's most frequent
sense in the other four sets), and exact McNemar tests on the same covered instances.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from lmgeom.errors import MissingInput
from lmgeom.layerspec import LayerSpec, select_layers
from lmgeom.evaluate.stats import holm
from lmgeom.evaluate.wsd import FirstSense, SenseVectors, WSDDataset, correct, mcnemar_exact, read_wsd_dataset, score
from lmgeom.progress import NoProgress, Progress
from lmgeom.stages.experiments.calibration import encoder_loader
from lmgeom.stages.experiments.features import FeatureCache
from lmgeom import rundir
from lmgeom.rundir import write_json, write_records_csv

DATASETS = ("senseval2", "senseval3", "semeval2007", "semeval2013", "semeval2015")
DEVIATION = ("sense vectors from the other four test sets (leave one dataset out); Peters et al. (2018) built them "
             "from SemCor, which is not available here")


def dataset_folder(data: Path, name: str) -> Path:
    """`data` may be the framework's folder, its Evaluation_Datasets folder or a folder of the five."""
    for folder in (data / "Evaluation_Datasets" / name, data / name):
        if (folder / f"{name}.data.xml").is_file():
            return folder
    raise MissingInput(f"`data` {str(data)!r} has no {name}/{name}.data.xml: give the WSD_Evaluation_Framework folder "
                       "(e.g. ../shared/data/WSD_Evaluation_Framework)", param="data")


def run_wsd(
    model: str,
    data: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    layers: LayerSpec = None,
    wordnet: str | os.PathLike[str] | None = None,
    device: str = "auto",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the experiment and write `out/results.json`; returns the document written. Word vectors
    are cached in `out/features` (a re-run encodes nothing); every answer is in `out/predictions.csv`."""
    out = Path(out)
    first_sense = FirstSense.load(wordnet)  # before the model: say what is missing first
    datasets = [read_wsd_dataset(dataset_folder(Path(data), name)) for name in DATASETS]
    cache = FeatureCache(out / "features", encoder_loader(model, device), model=model, progress=progress or NoProgress())
    vectors = [_instance_vectors(cache, dataset) for dataset in datasets]  # per set: (n_layers, n_instances, dim)
    n_layers = vectors[0].shape[0]
    chosen = select_layers(layers, range(n_layers), n_layers=n_layers)

    instances = [i for d in datasets for i in d.instances]
    gold = [d.gold[i.id] for d in datasets for i in d.instances]
    set_of = np.array([k for k, d in enumerate(datasets) for _ in d.instances])
    covered = np.zeros(len(instances), dtype=bool)
    nearest: dict[int, list[str | None]] = {layer: [] for layer in chosen}
    frequent: list[str | None] = []
    for k, dataset in enumerate(datasets):
        train = [j for j in range(len(datasets)) if j != k]
        train_instances = [i for j in train for i in datasets[j].instances]
        train_gold = {i.id: datasets[j].gold[i.id] for j in train for i in datasets[j].instances}
        for layer in chosen:
            senses = SenseVectors.fit(np.concatenate([vectors[j][layer] for j in train]), train_instances, train_gold)
            nearest[layer].extend(senses.predict(vectors[k][layer], dataset.instances))
        frequent.extend(senses.most_frequent(dataset.instances))
        covered[set_of == k] = [senses.covers(i) for i in dataset.instances]
    first = [first_sense.key(i.lemma, i.pos) for i in instances]
    systems: dict[str, list[str | None]] = {"WordNet first sense": first,
                                            "most frequent training sense": [m if m is not None else f for m, f in zip(frequent, first)]}
    for layer in chosen:
        systems[f"layer {layer}"] = [n if n is not None else f for n, f in zip(nearest[layer], first)]

    names = [d.name for d in datasets]
    subsets = {name: set_of == k for k, name in enumerate(names)} | {"ALL": np.ones(len(instances), dtype=bool)}
    scores = []
    for label, answers in systems.items():
        for restrict, suffix in ((None, ""), (covered, ", covered instances only")):
            f1 = {}
            for name, mask in subsets.items():
                rows = mask if restrict is None else mask & restrict
                ids = [instances[r].id + f"@{set_of[r]}" for r in np.flatnonzero(rows)]
                f1[name] = score(dict(zip(ids, (answers[r] for r in np.flatnonzero(rows)))),
                                 dict(zip(ids, (gold[r] for r in np.flatnonzero(rows))))).f1
            scores.append({"label": label + suffix, "system": label, "instances": "covered" if suffix else "all", "f1": f1})
    right = {label: correct(answers, gold) for label, answers in systems.items()}
    tests: list[dict[str, Any]] = []
    pairs = [(f"layer {a}", f"layer {b}") for a, b in itertools.combinations(chosen, 2)] + \
            [(f"layer {layer}", baseline) for layer in chosen for baseline in ("WordNet first sense", "most frequent training sense")]
    for one, other in pairs:
        # on the instances not covered both answer WordNet's first sense, so ALL has the same discordant instances
        result = mcnemar_exact(right[one][covered], right[other][covered])
        tests.append({"comparison": f"{one} vs {other}", "family": "layers" if other.startswith("layer ") else "baselines",
                      "subset": "ALL, covered", "n": result.n, "only_first": result.only_first,
                      "only_second": result.only_second, "p_value": result.p_value,
                      "test": "exact McNemar (two-sided binomial on the discordant instances)"})
    for family in ("layers", "baselines"):  # Holm within each family: layer against layer, layer against a baseline
        members = [t for t in tests if t["family"] == family]
        for test, adjusted in zip(members, holm([t["p_value"] for t in members])):
            test["p_holm"] = float(adjusted)
    coverage = {name: {"covered": int(np.sum(mask & covered)), "instances": int(np.sum(mask))} for name, mask in subsets.items()}
    settings = {"model": model, "data": str(data), "datasets": names, "layers": chosen, "wordnet": str(first_sense.directory),
                "protocol": "Peters et al. (2018): a sense's vector is the mean of its tagged occurrences; a test instance "
                            "takes the nearest (cosine) sense of its lemma and POS; not covered: WordNet's first sense",
                "deviations_from_peters": [DEVIATION],
                "scorer": "Raganato et al. (2017): P = earned / answered, R = earned / instances, F1 = 2PR / (P + R)"}
    document = {"settings": settings, "coverage": coverage, "scores": scores, "tests": tests}
    out.mkdir(parents=True, exist_ok=True)
    write_records_csv(rundir.WSD_PREDICTIONS.at(out), ({"dataset": names[set_of[r]], "id": i.id, "covered": bool(covered[r]),
                                                 "gold": " ".join(sorted(gold[r])),
                                                 **{label: answers[r] or "" for label, answers in systems.items()}}
                                                for r, i in enumerate(instances)))
    write_json(rundir.EXPERIMENT_JSON.at(out), "experiment-wsd", document, store_meta=cache.provenance())
    return document


def _instance_vectors(cache: FeatureCache, dataset: WSDDataset) -> np.ndarray:
    """(n_layers, n_instances, dim): each instance's word vector in its sentence."""
    words = cache.word_vectors(dataset.sentences)
    starts = np.cumsum([0] + [len(s) for s in dataset.sentences])
    rows = np.array([starts[i.sentence] + i.position for i in dataset.instances], dtype=np.int64)
    return words[:, rows]


__all__ = ["DATASETS", "run_wsd"]
