"""`lmgeom experiment calibration|layers`: downstream experiments with seeds and paired tests.

Option names follow the CLI's convention: plural for lists (`--methods`, `--seeds`, `--heads`,
`--tasks`), singular for one value (`--task`, `--seed` elsewhere); `--num-workers` for worker processes
and `--bootstrap` for bootstrap resamples, as in every command."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from lmgeom.cli.common import (DATA_DIR_HELP, LAYERS_HELP, RichProgress, above, console, old_spellings, print_grouped, split_list,
                               user_errors, url_form)
from lmgeom.errors import InputError

experiment_app = typer.Typer(help="Downstream experiments: isotropy calibration (Ding et al. 2022), layers and WSD (Peters et al. 2018), static baselines (Ethayarajh 2019).",
                             no_args_is_help=True)


def parse_seed_option(text: str) -> int | tuple[int, ...]:
    """`3` means seeds 0, 1, 2; `0,4,7` names them."""
    items = split_list(text)
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise InputError(f"--seeds takes a count (3) or a comma list of seeds (0,4,7), got {text!r}") from None
    if len(values) == 1 and "," not in text:
        return values[0]
    return tuple(values)


def print_summaries(summaries: list[dict[str, Any]], varying: str, title: str,
                    trivial: list[dict[str, Any]] | None = None) -> None:
    """Mean ± std over seeds per configuration, its Holm-corrected p against the baseline and its test
    against the trivial baselines, which follow the table (split into parts, each with the configuration's
    columns, where the terminal is too narrow for the whole)."""
    from lmgeom.stages.experiments.core import trivial_lines, trivial_verdict

    header = ["split", "head", varying, "metric", "mean ± std", "seeds", "Δ", "p (Holm)", "vs trivial"]
    rows = []
    for s in summaries:
        p = "" if s.get("p_holm") is None else f"{s['p_holm']:.3g}{' *' if s.get('significant') else ''}"
        if s.get("holm_duplicate_of"):
            p = f"= {s['holm_duplicate_of']}"
        delta = "degenerate" if s.get("degenerate") else ("" if s.get("difference") is None else f"{s['difference']:+.4f}")
        rows.append([str(s["split"]), str(s.get("head", "")), str(s[varying]), str(s["metric"]),
                     f"{s['mean']:.4f} ± {s['std']:.4f}", str(s["n_seeds"]), delta, p, trivial_verdict(s)])
    # the configuration's columns repeat in each part, so that no cell is cut at any width
    print_grouped(title, header, rows, labels=4, left=(0, 1, 2, 3, 8))
    for line in trivial_lines(trivial or []):
        console.print(f"trivial baseline: {line}")


def parse_mix_l2(text: str) -> list[float | None]:
    """`none` (no lambda term) or numbers >= 0, comma-separated."""
    values: list[float | None] = []
    for item in split_list(text):
        try:
            values.append(None if item.lower() == "none" else float(item))
        except ValueError:
            raise InputError(f"--mix-l2 takes a comma list of numbers >= 0 or none (e.g. 1,0.001), got {item!r}") from None
    return values


def parse_on_off(text: str, option: str) -> list[bool]:
    choices = {"off": False, "on": True}
    unknown = [item for item in split_list(text) if item.lower() not in choices]
    if unknown:
        raise InputError(f"{option} takes a comma list of off and on (e.g. off,on), got {unknown[0]!r}")
    return [choices[item.lower()] for item in split_list(text)]


FINETUNE_PANEL, REFIT_PANEL = "Fine-tuning regime", "Fine-tuning regime: the calibrator's last re-fit"
LAYER_PANEL = "Fine-tuning regime: keeping the calibration layer fitted"


@experiment_app.command("calibration", cls=old_spellings(
    {"--method": "--methods", "--seed": "--seeds", "--head": "--heads", "--workers": "--num-workers"}))
def calibration_command(
    model: str = typer.Option(..., "--model", help="a named model (minilm, smollm2, elmo-brown, tiny-bert, ...) or a folder"),
    task: str = typer.Option(..., "--task", help="cola, sst2, mrpc, rte, stsb, pos or brown"),
    data: Path = typer.Option(..., "--data", help="the task's folder, e.g. ../shared/data/GLUE/CoLA"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="experiment folder: results.json, results.md, figures, feature cache, finished cells"),
    methods: str = typer.Option("none,abtt,cie,whitening,flow", "--methods", help="comma list: none and calibrators; isobn/istar run only in fine-tuning"),
    seeds: str = typer.Option("3", "--seeds", help="a count (3 = seeds 0,1,2) or a comma list"),
    regime: str = typer.Option("frozen", "--regime", help="frozen, finetune or both"),
    features: str = typer.Option("top", "--features", help="frozen features: top, static (layer 0), layer:N or mix"),
    heads: str = typer.Option("logreg,mlp", "--heads", help="frozen heads: logreg (ridge for regression), mlp"),
    pooling: str = typer.Option("mean", "--pooling", help="sentence vector: mean of pieces, last piece, or cls (first position; fine-tuning regime)"),
    max_train: Optional[int] = typer.Option(None, "--max-train", min=1, help="seeded subsample of N training examples (per seed; fine-tuning: one subsample for all seeds)"),
    max_eval: Optional[int] = typer.Option(None, "--max-eval", min=1, help="seeded subsample of N evaluation examples (the same for every seed)"),
    epochs: int = typer.Option(3, "--epochs", min=1, metavar="<int>", help="epochs", rich_help_panel=FINETUNE_PANEL),
    batch_size: int = typer.Option(32, "--batch-size", min=1, metavar="<int>", help="sentences per step", rich_help_panel=FINETUNE_PANEL),
    learning_rate: float = typer.Option(2e-5, "--learning-rate", callback=above(0), help="AdamW learning rate", rich_help_panel=FINETUNE_PANEL),
    warmup_fraction: float = typer.Option(0.06, "--warmup-fraction", help="share of the steps with linear warm-up", rich_help_panel=FINETUNE_PANEL),
    max_length: int = typer.Option(128, "--max-length", min=2, metavar="<int>", help="tokens per input (truncated)", rich_help_panel=FINETUNE_PANEL),
    recalibrate_every: int = typer.Option(100, "--recalibrate-every", min=1, metavar="<int>", help="steps between re-fits of a calibrator", rich_help_panel=FINETUNE_PANEL),
    refit_after_last: bool = typer.Option(True, "--refit-after-last/--no-refit-after-last", show_default=False, help="re-fit once more after the last step (default)", rich_help_panel=REFIT_PANEL),
    calibration_options: str = typer.Option("", "--calibration-options", metavar="<k=v,...>",
                                            help="how a calibrator's layer is kept fitted (CalibrationOptions, docs/finetune.md): "
                                                 "refit_on=subset|batch, batch_momentum, flow_training=refit|joint, flow_nll_weight, "
                                                 "flow_nll_into_encoder, flow_learning_rate, guard_isoscore, guard_every, guard_inputs, "
                                                 "variance_penalty, check_every", rich_help_panel=LAYER_PANEL),
    validation_fraction: Optional[float] = typer.Option(None, "--validation-fraction", help="share of the training data held out as the `validation` split (0.1, or the pre-check's)", rich_help_panel=FINETUNE_PANEL),
    num_workers: int = typer.Option(2, "--num-workers", min=1, metavar="<int>", help="single-thread worker processes, one cell each", rich_help_panel=FINETUNE_PANEL),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, metavar="<int>", help="stop every run after N steps (smoke tests)", rich_help_panel=FINETUNE_PANEL),
    precheck: Optional[Path] = typer.Option(None, "--precheck", help="take the learning rate and epochs chosen for the task in this pre-check folder's precheck.json", rich_help_panel=FINETUNE_PANEL),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N"),
) -> None:
    """Does isotropy calibration help the task? Writes OUT/results.json (records + summaries), results.md and figures."""
    from lmgeom.stages.experiments import ExperimentOptions, run_calibration

    options: dict[str, Any] = {"epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
                               "warmup_fraction": warmup_fraction, "max_length": max_length,
                               "recalibrate_every": recalibrate_every, "refit_after_last": refit_after_last}
    if max_steps is not None:
        options["max_steps"] = max_steps
    with user_errors(), RichProgress() as progress:
        if calibration_options:
            from lmgeom.finetune.calibration import CalibrationOptions

            changed = CalibrationOptions.parse(calibration_options).changed()
            if changed:
                options["calibration"] = changed
        if precheck is not None:
            from lmgeom.stages.experiments.finetuning import chosen_setting

            chosen = chosen_setting(precheck, task)
            for name, given in (("max_train", max_train), ("validation_fraction", validation_fraction)):
                if given is not None and chosen[name] is not None and given != chosen[name]:
                    flag = "--" + name.replace("_", "-")
                    raise InputError(f"{flag} {given} differs from the {chosen[name]} that --precheck {precheck} chose "
                                     f"its settings on; leave {flag} out to take the pre-check's", param=flag)
            max_train = chosen.pop("max_train") if max_train is None else max_train
            validation_fraction = chosen.pop("validation_fraction")
            chosen.pop("max_train", None)
            options.update(chosen)
        experiment = ExperimentOptions(seeds=parse_seed_option(seeds), pooling=pooling, max_train=max_train, max_eval=max_eval,
                                       device=device)
        result = run_calibration(model, task, data, out=out, options=experiment, methods=split_list(methods),
                                 regime=regime, features=features, heads=split_list(heads), progress=progress,
                                 finetune_options=options, workers=num_workers,
                                 validation_fraction=0.1 if validation_fraction is None else validation_fraction)
    print_summaries(result.summaries, "method", f"{model} on {task}: calibration ({regime}, {features})",
                    result.trivial_baselines)
    for note in result.notes:
        console.print(f"note: {note}")
    from lmgeom import rundir

    console.print(f"wrote {rundir.EXPERIMENT_JSON.at(out)}, {rundir.EXPERIMENT_TABLE.at(out)} and {len(result.paths) - 2} figures")


def parse_floats(text: str, option: str) -> list[float]:
    try:
        return [float(item) for item in split_list(text)]
    except ValueError:
        raise InputError(f"{option} takes a comma list of numbers (e.g. 3e-5,5e-5,1e-4), got {text!r}") from None


def parse_task_values(text: str, option: str, convert: Any, example: str) -> dict[str, list[Any]]:
    """`mrpc=3/5,rte=3/5`: values to try per task."""
    result: dict[str, list[Any]] = {}
    for item in split_list(text):
        name, sep, values = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(item)
            result[name.strip().lower()] = [convert(v) for v in values.split("/")]
        except ValueError:
            raise InputError(f"{option} takes task=V/V pairs (e.g. {example}), got {item!r}", param=option) from None
    return result


def parse_task_epochs(text: str) -> dict[str, list[int]]:
    """`mrpc=3/5,rte=3/5`: epochs to try per task."""
    return parse_task_values(text, "--epochs", int, "cola=3,mrpc=3/5")


def parse_task_rates(text: str) -> dict[str, list[float]]:
    """`cola=3e-5/1e-4/2e-4`: learning rates to try per task."""
    return parse_task_values(text, "--task-learning-rates", float, "cola=5e-5/1e-4/2e-4")


@experiment_app.command("finetune-precheck", cls=old_spellings({"--task": "--tasks", "--workers": "--num-workers"}))
def finetune_precheck_command(
    model: str = typer.Option("minilm", "--model", help="a transformers model name or folder"),
    data: Path = typer.Option(..., "--data", help="the GLUE folder (with CoLA/, SST-2/, MRPC/, RTE/; SICK-E is read from SICK/ beside it), e.g. ../shared/data/GLUE"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="pre-check folder: precheck.json, precheck.md, finished cells"),
    tasks: str = typer.Option("cola,rte,mrpc,sst2,sicke", "--tasks", help="comma list, run in this order"),
    learning_rates: str = typer.Option("3e-5,5e-5,1e-4", "--learning-rates", help="comma list of AdamW learning rates"),
    task_learning_rates: str = typer.Option("cola=3e-5/5e-5/1e-4/2e-4", "--task-learning-rates",
                                            help="per task, replacing --learning-rates: task=R/R/...,..."),
    epochs: str = typer.Option("cola=3,sst2=3,mrpc=3/5,rte=3/5", "--epochs", help="epochs to try per task: task=N/M,..."),
    validation_fraction: float = typer.Option(0.1, "--validation-fraction", help="share of the training data held out to choose on"),
    num_workers: int = typer.Option(2, "--num-workers", min=1, help="single-thread worker processes, one cell each"),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="sentences per step"),
    max_length: int = typer.Option(128, "--max-length", min=2, help="tokens per input (truncated)"),
    warmup_fraction: float = typer.Option(0.06, "--warmup-fraction", help="share of the steps with linear warm-up"),
    pooling: str = typer.Option("mean", "--pooling", help="mean (of the pieces) or cls (the first position, Ding et al.'s and IsoBN's)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="stop every cell after N steps (smoke tests)"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N"),
) -> None:
    """Choose the fine-tuning settings per task: `none` over learning rates and epochs, on a validation split."""
    from lmgeom.stages.experiments.finetuning import PRECHECK_EPOCHS, run_precheck

    options: dict[str, Any] = {"batch_size": batch_size, "max_length": max_length, "warmup_fraction": warmup_fraction,
                               "pooling": pooling, "device": device}
    if max_steps is not None:
        options["max_steps"] = max_steps
    with user_errors(), RichProgress() as progress:
        summary = run_precheck(model, data, out=out, tasks=split_list(tasks),
                               learning_rates=parse_floats(learning_rates, "--learning-rates"),
                               task_learning_rates=parse_task_rates(task_learning_rates),
                               epochs={**PRECHECK_EPOCHS, **parse_task_epochs(epochs)},
                               validation_fraction=validation_fraction, options=options, workers=num_workers,
                               progress=progress)
    for name, entry in summary["tasks"].items():
        chosen = entry.get("chosen")
        console.print(f"{name}: " + ("no setting finished" if not chosen else
                                     f"lr {chosen['learning_rate']:g}, {chosen['epochs']} epochs, validation "
                                     f"{chosen['validation']:.4f}, {'informative' if chosen['informative'] else 'UNINFORMATIVE'}"))
    console.print(f"wrote {out / 'precheck.json'} and {out / 'precheck.md'}")


@experiment_app.command("thesis", cls=old_spellings({"--resamples": "--bootstrap"}))
def thesis_command(
    results: list[Path] = typer.Argument(..., help="calibration experiments' results.json files (frozen and fine-tuning)"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="folder for thesis.json and thesis.png"),
    keep_unverified: bool = typer.Option(False, "--keep-unverified",
                                         help="also keep configurations whose results.json carries no trivial-baseline "
                                              "verdict (listed as unverified); by default they are dropped"),
    bootstrap: int = typer.Option(2000, "--bootstrap", min=100, help="cluster-bootstrap resamples"),
    permutations: int = typer.Option(10000, "--permutations", min=100,
                                     help="permutations of the cluster permutation test (all of them when fewer)"),
    seed: int = typer.Option(0, "--seed", help="seed of the bootstrap and of the random permutations"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a thesis.json or thesis.png in --out that lmgeom "
                                                              "did not write"),
) -> None:
    """Ding et al.'s local-isotropy thesis, per regime, on informative configurations only: Spearman of
    standardised Δ task score against standardised Δ global and Δ local isotropy (cluster bootstrap,
    cluster permutation p), and of the standardised mean Δ score against none's local isotropy level."""
    from lmgeom import rundir
    from lmgeom.stages.experiments.thesis import run_thesis

    with user_errors():
        document = run_thesis(results, out, keep_unverified=keep_unverified, n_resamples=bootstrap,
                              n_permutations=permutations, seed=seed, overwrite=overwrite)
    console.print(f"{document['n_pairs_formed']} pairs formed, {document['n_pairs_kept']} kept")
    for drop in document["dropped"]:
        where = f" ({drop['n_configurations']} configurations)" if "n_configurations" in drop else ""
        console.print(f"dropped {drop['n_pairs']} pairs{where}: {drop['reason']}")
    for test in document["tests"] + document["level_tests"]:
        if test["rho"] is None:
            rho = "n/a"
        else:
            rho = f"{test['rho']:+.3f} [{test['low']:+.3f}, {test['high']:+.3f}], p={test['p_value']:.3g}"
        label = "level" if test in document["level_tests"] else test["measure"]
        console.print(f"{test['regime']} {label}: Spearman {rho} over {test['n_pairs']} pairs, "
                      f"{test.get('n_configurations', 0)} configurations, {test.get('n_clusters', 0)} clusters")
    console.print(f"wrote {rundir.THESIS.at(out)}" + (f" and {document['figure']}" if document["figure"] else ""))


@experiment_app.command("layers", cls=old_spellings({"--seed": "--seeds"}))
def layers_command(
    model: str = typer.Option(..., "--model", help="a named model (minilm, smollm2, elmo-brown, tiny-bert, ...) or a folder"),
    task: str = typer.Option(..., "--task", help="pos, brown, cola, sst2, mrpc, rte or stsb"),
    data: Path = typer.Option(..., "--data", help="the task's folder, e.g. ../shared/data/UD_English-EWT"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="experiment folder"),
    features: str = typer.Option("layer:all,top,mix,static", "--features", help="comma list: layer:all, layer:N, top, mix, static"),
    seeds: str = typer.Option("3", "--seeds", help="a count (3 = seeds 0,1,2) or a comma list"),
    pooling: str = typer.Option("mean", "--pooling", help="sentence vector for sentence tasks: mean of pieces, or last piece"),
    max_train: Optional[int] = typer.Option(None, "--max-train", min=1, help="seeded subsample of N training sentences (per seed)"),
    max_eval: Optional[int] = typer.Option(None, "--max-eval", min=1, help="seeded subsample of N evaluation sentences"),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N"),
    mix_l2: str = typer.Option("none", "--mix-l2", help="comma list of lambdas for the mix: lambda * sum w^2 on its weights (bilm-tf); none = only the probe's weight decay; each value is one mix"),
    mix_layer_norm: str = typer.Option("off", "--mix-layer-norm", help="comma list of off, on: layer-normalise each layer before mixing; off,on runs both"),
    standardize: bool = typer.Option(True, "--standardize/--raw", help="z-score every layer with training statistics (default; a deviation from Peters et al.) or feed raw layers"),
) -> None:
    """Which layer, or learned mix of layers, serves the task? A linear probe per feature set."""
    from lmgeom.stages.experiments import ExperimentOptions, run_layers

    with user_errors(), RichProgress() as progress:
        options = ExperimentOptions(seeds=parse_seed_option(seeds), pooling=pooling, max_train=max_train, max_eval=max_eval,
                                    device=device)
        result = run_layers(model, task, data, out=out, options=options, features=split_list(features),
                            mix_l2=parse_mix_l2(mix_l2), mix_layer_norm=parse_on_off(mix_layer_norm, "--mix-layer-norm"),
                            standardize=standardize, progress=progress)
    print_summaries(result.summaries, "features", f"{model} on {task}: layers (linear probe)", result.trivial_baselines)
    from lmgeom import rundir

    console.print(f"wrote {rundir.EXPERIMENT_JSON.at(out)}, {rundir.EXPERIMENT_TABLE.at(out)} and {len(result.paths) - 2} figures")


@experiment_app.command("wsd")
def wsd_command(
    model: str = typer.Option(..., "--model", help="a named model (elmo-brown, minilm, ...) or a folder"),
    data: Path = typer.Option(..., "--data", help="the WSD evaluation framework, e.g. ../shared/data/WSD_Evaluation_Framework"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="experiment folder: results.json, predictions.csv, feature cache"),
    layers: str = typer.Option("all", "--layers", help=LAYERS_HELP),
    wordnet: Optional[Path] = typer.Option(None, "--wordnet", help="WordNet 3.0's database folder (default $WNSEARCHDIR, then Debian's wordnet-base)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N"),
) -> None:
    """Word sense disambiguation per layer (Peters et al. 2018, Table 5): nearest sense vector, WordNet's first sense as back-off."""
    from lmgeom.stages.experiments import run_wsd

    with user_errors(), RichProgress() as progress:
        document = run_wsd(model, data, out=out, layers=layers, wordnet=wordnet, device=device, progress=progress)
    table = Table(title=f"{model}: WSD F1 (x 100), leave one dataset out")
    names = [*document["settings"]["datasets"], "ALL"]
    for column in ("system", *names):
        table.add_column(column, justify="left" if column == "system" else "right")
    coverage = document["coverage"]
    table.add_row("covered", *[f"{coverage[n]['covered']}/{coverage[n]['instances']}" for n in names])
    for row in document["scores"]:
        table.add_row(row["label"], *[f"{100 * row['f1'][n]:.1f}" for n in names])
    console.print(table)
    for test in document["tests"]:
        console.print(f"{test['comparison']} ({test['subset']}): {test['only_first']} vs {test['only_second']} "
                      f"instances only one gets right, exact McNemar p {test['p_value']:.3g}")
    from lmgeom import rundir

    console.print(f"wrote {rundir.EXPERIMENT_JSON.at(out)} and {rundir.WSD_PREDICTIONS.at(out)}")


@experiment_app.command("static-baselines", cls=old_spellings({"--method": "--methods"}))
def static_baselines_command(
    corpus: str = typer.Option(..., "--corpus", help="lee, brown or brown:DIR, or any corpus spec `lmgeom extract` takes"),
    out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="experiment folder: results.json, results.md, vectors/<method>.bin"),
    methods: str = typer.Option("word2vec,fasttext", "--methods", help="comma list: word2vec, fasttext (both skip-gram)"),
    dim: int = typer.Option(300, "--dim", min=1, help="vector dimensions"),
    window: int = typer.Option(5, "--window", min=1, help="context window (words each side)"),
    min_count: Optional[int] = typer.Option(None, "--min-count", min=1, help="keep words with at least N occurrences (default 1 on lee, else 5)"),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="passes over the corpus (default 20 on lee, else 5)"),
    seed: int = typer.Option(0, "--seed", help="gensim's seed (training runs on one worker: deterministic)"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=f"{DATA_DIR_HELP}: the word benchmarks"),
) -> None:
    """Stand-ins for GloVe / FastText (Ethayarajh 2019, Table 1): word2vec and fastText trained on a corpus, scored as static-embeddings scores a layer."""
    from lmgeom.stages.experiments.standins import covered_score, default_settings, run_static_baselines

    with user_errors(), RichProgress() as progress:
        settings = default_settings(corpus, dim=dim, window=window, min_count=min_count, epochs=epochs, seed=seed)
        result = run_static_baselines(corpus, out=out, settings=settings, methods=split_list(methods), data_dir=data_dir,
                                      progress=progress)
    table = Table(title=f"static baselines trained on {corpus} (all items, OOV = mean / covered items only)")
    for column in ("vectors", "benchmark", "all items", "covered only", "coverage"):
        table.add_column(column, justify="left" if column in ("vectors", "benchmark") else "right")
    for record in result.document["records"]:
        oov_mean = "n/a" if record["score_oov_mean"] is None or record["score_oov_mean"] != record["score_oov_mean"] \
            else f"{record['score_oov_mean']:.3f}"
        table.add_row(record["vectors"], record["benchmark"], oov_mean, covered_score(record),
                      f"{record['covered']:,}/{record['total']:,}")
    console.print(table)
    from lmgeom import rundir

    console.print(f"wrote {rundir.EXPERIMENT_JSON.at(out)} and {rundir.EXPERIMENT_TABLE.at(out)}")


def register(app: typer.Typer) -> None:
    app.add_typer(experiment_app, name="experiment")
