"""The one grammar of capture sites: where in each block a store's vectors are taken.

A site is one of the named sites (`NAMED_SITES`) or a module path relative to the loaded model:

- ``resid_post`` (the default): the residual stream after block l, what a store has always held
  (layer 0 = the embedding output; layer L = the model's last hidden state);
- ``resid_pre``: block l's input (layer l - 1's ``resid_post`` before the last layer's final norm);
- ``attn_out``, ``mlp_out``: what the attention and the MLP of block l add to the residual stream;
- ``resid_mid``: the residual stream between them;
- ``PATH``, ``PATH:input``: the output (its first element when it returns a tuple) or the first
  input of the module at ``PATH``, with ``{i}`` standing for the block index as the model numbers its
  blocks from 0 (``h.{i}.mlp``, ``layers.{i}.post_attention_layernorm:input``): block ``i`` is stored as
  layer ``i + 1``. A path without ``{i}`` names one module inside one block (``h.3.mlp``: layer 4).

Which module each named site is, per model family, is the table `lmgeom.encoders.sites.FAMILIES`
(docs/models.md, "Capture sites"). Sites other than ``resid_post`` exist at layers 1..L only.
"""

from __future__ import annotations

import re
from typing import Sequence, Union

from lmgeom.errors import InputError

DEFAULT_SITE = "resid_post"
NAMED_SITES = ("resid_post", "resid_pre", "attn_out", "mlp_out", "resid_mid")
SITES_FOLDER = "sites"
"""The store folder holding the arrays of every site but `resid_post` (which stays in `layers/`)."""
INPUT_SUFFIX = ":input"
BLOCK_INDEX = "{i}"

SiteSpec = Union[str, Sequence[str], None]

# a module path: dotted names, numbers and {i}; at least one dot, since a site lies inside a block
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+|\{i\}))+(:input)?$")
GRAMMAR = (f"{', '.join(NAMED_SITES)}, or a module path of the model with {{i}} for the block index "
           "('h.{i}.mlp', 'layers.{i}.post_attention_layernorm:input' for a module's input), comma-separated")


def parse_sites(spec: SiteSpec, *, param: str = "sites") -> tuple[str, ...]:
    """The sites of `spec` (a comma-separated string or a sequence of names; None: the default), in
    the order given without repeats, `resid_post` always first (every store holds it: the analyses
    read it unless told another site).

    Parameters
    ----------
    spec : str or sequence of str or None
        Site names (`NAMED_SITES`) or module paths (see the module docstring).
    param : str, default "sites"
        The parameter named in errors.

    Returns
    -------
    tuple of str
        The sites, `resid_post` first.

    Raises
    ------
    InputError
        An empty name, or one that is neither a named site nor a module path, naming the choices.
    """
    if spec is None:
        return (DEFAULT_SITE,)
    names = [name.strip() for name in (spec.split(",") if isinstance(spec, str) else spec)]
    sites = [DEFAULT_SITE]
    for name in names:
        check_site(name, param=param)
        if name not in sites:
            sites.append(name)
    return tuple(sites)


def check_site(name: str, *, param: str = "site") -> str:
    """`name` when it is a named site or a module path, else an `InputError` naming `param` and the choices."""
    if name in NAMED_SITES or (name and _PATH.match(name)):
        return name
    raise InputError(f"unknown `{param}` {name!r}: a site is {GRAMMAR}", param=param)


def is_module_path(site: str) -> bool:
    """Whether `site` is a module path rather than a named site."""
    return site not in NAMED_SITES


def site_name(site: str) -> str:
    """A site's name as a folder name: every character but letters, digits, `.`, `_` and `-` written
    `_` (`h._i_.mlp` for `h.{i}.mlp`); the last part of `site_folder`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", site)


def site_folder(site: str) -> str:
    """The folder, below a store, holding a site's layer arrays: `layers` for `resid_post`, else
    `sites/<name>` with every character but letters, digits, `.`, `_` and `-` written `_`
    (`sites/h._i_.mlp` for `h.{i}.mlp`)."""
    if site == DEFAULT_SITE:
        return "layers"
    return f"{SITES_FOLDER}/{site_name(site)}"
