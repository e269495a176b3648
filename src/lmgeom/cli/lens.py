"""`lmgeom lens`: the logit lens of a decoder, per layer and token (entropy, KL to the last layer, rank
of the actual next token)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmgeom.cli.common import RichProgress, console, grid_table, user_errors


def register(app: typer.Typer) -> None:
    @app.command("lens")
    def lens_command(
        model: str = typer.Argument(..., help="a decoder: tiny-gpt2, tiny-llama (needs its LM head), smollm2, gemma3, a Hugging Face id or a folder"),
        corpus: str = typer.Option("lee", "--corpus", help="the corpus: lee, brown, a file, ..."),
        limit: Optional[int] = typer.Option(None, "--limit", min=1, help="keep the corpus's first N sentences (the lens reads the whole vocabulary at every layer and position: keep N small for large vocabularies)"),
        out: Path = typer.Option(..., "--out", "-o", help="the run directory: writes lens.parquet (per token and layer) and lens.json (per layer, with the settings)"),
        batch_sentences: int = typer.Option(16, "--batch-sentences", min=1, help="sentences per forward pass"),
        max_chunk_mb: int = typer.Option(256, "--max-chunk-mb", min=1, help="memory bound of one vocabulary chunk's logits over every layer"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    ) -> None:
        """Read every layer out through the final norm and the unembedding: the next-token distribution's entropy, its KL to the last layer and the rank of the actual next token."""
        from lmgeom.stages.lens import LensOptions, run_lens

        with user_errors({"batch_sentences": "--batch-sentences", "max_chunk_mb": "--max-chunk-mb"}):
            options = LensOptions(limit=limit, batch_sentences=batch_sentences, max_chunk_mb=max_chunk_mb, device=device)
            with RichProgress() as progress:
                result = run_lens(model, corpus, out, options, progress=progress)
        console.print(f"{result.model_id}: logit lens over {result.counts['n_sentences']} sentences, "
                      f"{result.counts['n_positions']:,} positions with a next token, {result.seconds:.1f} s "
                      "(layer 0 = embedding output; entropy and KL in nats; rank 0 = the top token)", highlight=False)
        header = ["layer", "entropy mean", "entropy median", "KL mean", "KL median", "rank median", "top-1"]
        rows = [[str(r["layer"]), f"{r['entropy_mean']:.3f}", f"{r['entropy_median']:.3f}", f"{r['kl_mean']:.3f}",
                 f"{r['kl_median']:.3f}", f"{r['rank_median']:.0f}", f"{r['top1']:.3f}"] for r in result.layers]
        console.print(grid_table(header, rows))
        console.print("written: " + ", ".join(str(path) for path in result.paths))

    @app.command("lens-join")
    def lens_join_command(
        run: Path = typer.Argument(..., help="a run holding its store, contextuality_words.csv (lmgeom analyze) and the lens computed with the store present"),
        geometry: Optional[Path] = typer.Option(None, "--geometry", help="a geometry.json to take each layer's TwoNN dimension from when the run has none"),
        bootstrap: int = typer.Option(1000, "--bootstrap", min=0, help="bootstrap resamples (over sentences; over layers for the across-layer correlation)"),
        seed: int = typer.Option(0, min=0, help="seed of the bootstrap"),
    ) -> None:
        """Per layer, Spearman's rho of each word occurrence's lens entropy and next-token rank with its word's self-similarity; across layers, of the mean entropy with the TwoNN dimension."""
        from lmgeom.stages.lens import join_lens

        with user_errors({"n_boot": "--bootstrap"}):
            result = join_lens(run, geometry=geometry, n_boot=bootstrap, seed=seed)

        def cell(entry: dict) -> str:
            return f"{entry['rho']:+.3f} [{entry['low']:+.3f}, {entry['high']:+.3f}]"

        console.print(f"Spearman's rho with self-similarity, per layer ({result['by_layer'][0]['entropy']['n'] if result['by_layer'] else 0:,} word occurrences a layer in "
                      f"{result['counts']['sentences']} sentences; 95% bootstrap over sentences)", highlight=False)
        rows = [[str(r["layer"]), str(r["entropy"]["n"]), cell(r["entropy"]), cell(r["rank"])] for r in result["by_layer"]]
        console.print(grid_table(["layer", "n", "entropy vs self-sim", "rank vs self-sim"], rows))
        across = result["across_layers"]
        if across is None:
            console.print("no geometry.json: the across-layer correlation with the intrinsic dimension was left out (pass --geometry)")
        else:
            console.print(f"layer-mean entropy vs TwoNN dimension: rho {cell(across)} ({across['note']})", highlight=False)
