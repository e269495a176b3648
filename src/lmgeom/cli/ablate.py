"""`lmgeom ablate`: set a model's rogue dimensions or massive activations to zero or their mean at a
site and layer, and measure what changes, against as many random dimensions."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from lmgeom.cli.common import RichProgress, console, grid_table, split_list, user_errors


def _interval(effect: dict, key: str) -> str:
    value, low, high = effect.get(key), effect.get(f"{key}_low"), effect.get(f"{key}_high")
    if value is None:
        return "—"
    return f"{value:+.3f}" + (f" [{low:+.3f}, {high:+.3f}]" if low is not None else "")


def register(app: typer.Typer) -> None:
    @app.command("ablate")
    def ablate_command(
        model: str = typer.Argument(..., help="a model: smollm2, gemma3, minilm, tiny-gpt2, a Hugging Face id or a folder"),
        corpus: str = typer.Option("lee", "--corpus", help="the corpus the dimensions, the loss and the attention are measured on"),
        limit: Optional[int] = typer.Option(300, "--limit", min=2, help="keep the corpus's first N sentences"),
        out: Path = typer.Option(..., "--out", "-o", help="the run directory: writes ablation.json and ablation.csv"),
        layers: str = typer.Option("default", "--layers", help="layers to ablate, one at a time (0 = embedding output; 6,12 / last / default)"),
        sites: str = typer.Option("resid_post", "--sites", help="sites to ablate at (resid_post = the block's output; attn_out, mlp_out, resid_mid, resid_pre, a module path)"),
        dims: List[str] = typer.Option(["rogue", "massive"], "--dims", help="what to ablate, repeatable: rogue, outlier, massive, or dimension numbers (507,247)"),
        how: str = typer.Option("zero,mean", "--how", help="zero and/or mean (the dimension's mean over the ablated entries)"),
        measures: Optional[str] = typer.Option(None, "--measures", help="loss, attention, sts, pos (default: loss,attention for a decoder; sts,pos,attention for an encoder)"),
        random_draws: int = typer.Option(3, "--random-draws", min=0, help="random-dimension controls per ablation"),
        geometry: Optional[Path] = typer.Option(None, "--geometry", help="a run's geometry.json to take the rogue dimensions from (else found on the corpus)"),
        sts_pairs: int = typer.Option(500, "--sts-pairs", min=1, help="STS-B test pairs (a seeded sample)"),
        pos_sentences: int = typer.Option(300, "--pos-sentences", min=1, help="UD English-EWT sentences to train the probe on (dev) and to test it on (test), each"),
        bootstrap: int = typer.Option(1000, "--bootstrap", min=0, help="bootstrap resamples of every interval"),
        seed: int = typer.Option(0, min=0, help="seed of the random dimensions, the samples and the bootstrap"),
        data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="the data folder (default ../shared/data or LMGEOM_DATA)"),
        batch_sentences: int = typer.Option(16, "--batch-sentences", min=1, help="sentences per forward pass"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    ) -> None:
        """Ablate rogue dimensions or massive activations at a layer and measure the effect (next-token loss, attention to the first token, STS, a POS probe) against random dimensions, with bootstrap intervals."""
        from lmgeom.stages.ablation import AblationOptions, run_ablation

        with user_errors({"random_draws": "--random-draws", "n_boot": "--bootstrap", "sts_pairs": "--sts-pairs",
                          "pos_train": "--pos-sentences", "pos_test": "--pos-sentences", "data_dir": "--data-dir",
                          "batch_sentences": "--batch-sentences"}):
            options = AblationOptions(layers=layers, sites=sites, dims=tuple(dims), how=tuple(split_list(how)),
                                      measures=tuple(split_list(measures)) if measures else None, limit=limit,
                                      sts_pairs=sts_pairs, pos_train=pos_sentences, pos_test=pos_sentences,
                                      random_draws=random_draws, n_boot=bootstrap, seed=seed,
                                      geometry=str(geometry) if geometry else None,
                                      data_dir=str(data_dir) if data_dir else None, batch_sentences=batch_sentences,
                                      device=device)
            with RichProgress() as progress:
                result = run_ablation(model, corpus, out, options, progress=progress)
        document = result.document
        console.print(f"{result.model_id}: {len(document['configs'])} ablations with {options.random_draws} random controls each, "
                      f"{document['counts']['n_sentences']} sentences, {result.seconds:.0f} s (layer 0 = embedding output)",
                      highlight=False)
        for site in document["sites"]:
            console.print(f"{site['site']} layer {site['layer']}: rogue {site['dimensions']['rogue']}, outlier "
                          f"{site['dimensions']['outlier']}, massive {site['dimensions']['massive']} "
                          f"({site['massive_entries']} entries above {site['massive_cutoff']:.4g}; max |h| {site['max_abs']:.4g})",
                          highlight=False)
        rows = []
        for config in document["configs"]:
            for name, effect in config["effects"].items():
                if "delta" not in effect:
                    continue
                rows.append([f"{config['layer']} {config['site']}", f"{config['dims_kind']} {config['how']}", name,
                             f"{effect['base']:.3f} → {effect['ablated']:.3f}", _interval(effect, "delta"),
                             "—" if effect.get("random_delta_mean") is None else f"{effect['random_delta_mean']:+.3f}"])
        console.print(grid_table(["layer site", "ablation", "measure", "unablated → ablated", "Δ [95% CI]", "random Δ"], rows))
        for line in document["notes"]:
            console.print(line, highlight=False)
        console.print("written: " + ", ".join(str(path) for path in result.paths))
