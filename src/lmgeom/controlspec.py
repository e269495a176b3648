"""The controls of an extraction: what a store holds instead of a trained model on its corpus.

A control run is the same run with one thing taken away, so that a number of the model can be read
against what it would be without it:

- ``random-init``: the model's own configuration and tokenizer with seeded random weights (every
  parameter, the embeddings included, drawn again by the model's own initialisation;
  `lmgeom.encoders.registry.random_init_model`): what the architecture gives before training;
- ``shuffled``: the trained model on the corpus with each sentence's words shuffled, seeded
  (`lmgeom.corpus.Corpus.shuffle_words`): what the words give without their order.

A store of a control records it in its settings (`control_settings`: meta.json's ``control``), every
result document written from it carries it (`lmgeom.rundir.header_fields`) and every label of it
says it (`control_label`: "control: random-init (seed 0)"). This module is the one grammar of the
names and imports only the errors.
"""

from __future__ import annotations

from typing import Any, Mapping

from lmgeom.errors import InputError

CONTROLS = {
    "random-init": "the model's configuration and tokenizer with seeded random weights (every parameter, the embeddings "
                   "included, drawn by the model's own initialisation)",
    "shuffled": "the trained model on the corpus with the words of each sentence shuffled (seeded), before tokenisation",
}
"""Each control's name and what it is."""


def check_control(control: str | None, *, param: str = "control") -> str | None:
    """`control` when it is None or a known control (`CONTROLS`), else an `InputError` naming `param`
    and the choices.

    Parameters
    ----------
    control : str or None
        A control's name, or None for no control (the model itself).
    param : str, default "control"
        The parameter named in errors.

    Returns
    -------
    str or None
        `control`, unchanged.

    Raises
    ------
    InputError
        A name that is not in `CONTROLS`.
    """
    if control is None or control in CONTROLS:
        return control
    raise InputError(f"unknown `{param}` {control!r}; choose one of {', '.join(CONTROLS)} (or leave it out for the model "
                     "itself)", param=param)


def check_control_seed(seed: Any, *, param: str = "control_seed") -> int:
    """`seed` as an int when it is a whole number of at least 0, else an `InputError` naming `param`."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"`{param}` must be a whole number of at least 0; got {seed!r}", param=param)
    return int(seed)


def control_settings(control: str, seed: int) -> dict[str, Any]:
    """What a store records of its control (meta.json's ``control``): its name, seed and what it is.

    Parameters
    ----------
    control : str
        A name in `CONTROLS`.
    seed : int
        The control's seed (the random weights', or the shuffles').

    Returns
    -------
    dict
        ``{"name": control, "seed": seed, "what": CONTROLS[control]}``.
    """
    check_control(control)
    return {"name": control, "seed": check_control_seed(seed), "what": CONTROLS[control]}


def control_label(control: Mapping[str, Any] | None) -> str:
    """"control: random-init (seed 0)" for a store's recorded control (`control_settings`), "" for none.

    Parameters
    ----------
    control : mapping or None
        A store's or a result document's ``control`` entry.

    Returns
    -------
    str
        The label every output of a control run carries, or "" for a run of the model itself.
    """
    if not control:
        return ""
    return f"control: {control.get('name')} (seed {control.get('seed')})"
