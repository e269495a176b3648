"""`lmgeom elmo train`: train an ELMo biLM here (the work is `lmgeom.elmo.train`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lmgeom.cli.common import RichProgress, above, below, console, old_spellings, user_errors, url_form


def register(app: typer.Typer) -> None:
    elmo_app = typer.Typer(help="ELMo biLMs: train one here; extract any with `lmgeom extract`.", no_args_is_help=True)
    app.add_typer(elmo_app, name="elmo")

    @elmo_app.command("train", cls=old_spellings({"--no-overwrite": ""}))
    def train_command(
        out: Path = typer.Option(..., "--out", "-o", callback=url_form, help="folder for checkpoint.pt, options.json, weights.hdf5, training.json"),
        corpus: str = typer.Option("brown", "--corpus", "-c", help="brown[:DIR] (fixed file split) or any corpus spec (every tenth sentence held out)"),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
        epochs: int = typer.Option(2, min=1, help="passes over the training sentences"),
        batch_tokens: int = typer.Option(2000, min=1, help="padded tokens per batch"),
        learning_rate: float = typer.Option(2e-3, callback=above(0), help="Adam learning rate"),
        vocab_size: int = typer.Option(20000, min=4, help="softmax classes including <S>, </S>, <UNK>"),
        negative_samples: int = typer.Option(0, min=0, help="sampled softmax candidates per batch (0: full softmax)"),
        lstm_dim: int = typer.Option(512, min=1, help="LSTM cell size"),
        projection_dim: int = typer.Option(128, min=1, help="LSTM projection (each direction's output) size"),
        n_layers: int = typer.Option(2, min=1, help="LSTM layers per direction"),
        dropout: float = typer.Option(0.1, min=0.0, callback=below(1), help="dropout on LSTM inputs and the softmax input"),
        seed: int = typer.Option(0, min=0, help="seed for initialisation, batch order and dropout"),
        max_steps: Optional[int] = typer.Option(None, min=1, help="stop after this many steps in all (checkpointed; re-run to continue)"),
        checkpoint_every: int = typer.Option(200, min=1, help="steps between checkpoints"),
        threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch (default: torch's choice)"),
        overwrite: bool = typer.Option(False, "--overwrite", help="discard a run with other settings in --out"),
    ) -> None:
        """Train a biLM (resumes from --out's checkpoint), then report held-out perplexity."""
        from lmgeom.elmo.train import TrainConfig, train

        with user_errors():
            config = TrainConfig(
                epochs=epochs, batch_tokens=batch_tokens, learning_rate=learning_rate, vocab_size=vocab_size,
                n_negative_samples=negative_samples, lstm_dim=lstm_dim, projection_dim=projection_dim,
                n_layers=n_layers, dropout=dropout, seed=seed,
            )
            with RichProgress() as progress:
                result = train(out, corpus=corpus, config=config, device=device, overwrite=overwrite,
                               max_steps=max_steps, checkpoint_every=checkpoint_every, threads=threads,
                               progress=progress)
            ppl = result.perplexity
            state = "finished" if result.complete else f"stopped at step {result.steps} (re-run to continue)"
            console.print(
                f"[bold]{result.out}[/]: {state}; held-out perplexity forward {ppl.forward:.1f}, backward "
                f"{ppl.backward:.1f}, average {ppl.average:.1f} over {ppl.n_predictions:,} predictions per direction "
                f"(unknown words scored as <UNK>: {100 * ppl.oov_rate:.1f} % of held-out words); "
                f"{result.words_per_second:,.0f} words/s"
            )
