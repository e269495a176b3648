"""Editing one capture site of a transformers model in its forward passes: the hooks behind
`lmgeom ablate` (`lmgeom.stages.ablation`).

A site is placed as capture sites are (`lmgeom.encoders.sites`), with one difference for
`resid_post`: it is block l's output (the forward hook's output of block `l - 1` of the module tree,
layer 0 the input of the first block), so the last layer's `resid_post` is edited before the model's
final norm, not after it. An `Edit` says what to change in the site's tensor (batch, length, dim):

- `dims` with `select=None`: those dimensions at every position are set to `values` (0 or each
  dimension's mean);
- `select` (dimensions) with a `cutoff`: the entries of the selected dimensions whose |h| exceeds the
  cutoff (the massive activations, Sun et al. 2024) are found, and the entry of `dims` at the same
  position and in the same column order is set (`dims == select`: those entries themselves; other
  dimensions: the random-dimension control, the same number of entries at the same tokens).

`SiteHook` registers the hook while entered; with no edit it only records the tensor (`seen`), with
one it also counts the entries it changed (`n_edited`, over the positions of `mask` when one is set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmgeom.encoders.sites import find_blocks, resolve_sites
from lmgeom.errors import InputError
from lmgeom.sitespec import DEFAULT_SITE


@dataclass(frozen=True)
class Edit:
    """What an ablation changes in a site's tensor: `dims` set to `values` (one per dimension) at every
    position, or, with `select` and `cutoff`, only where the selected dimension's |h| exceeds `cutoff`."""

    dims: np.ndarray
    values: np.ndarray
    select: np.ndarray | None = None
    cutoff: float | None = None

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.values):
            raise InputError(f"an edit needs one value per dimension; got {len(self.dims)} dimensions and {len(self.values)} values",
                             param="dims")
        if (self.select is None) != (self.cutoff is None):
            raise InputError("an edit of entries needs both the dimensions to select on and the cutoff", param="cutoff")
        if self.select is not None and len(self.select) != len(self.dims):
            raise InputError(f"an edit of entries sets one dimension per selected one; got {len(self.dims)} and {len(self.select)}",
                             param="dims")

    def apply(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """`h` edited (a new tensor) and the number of entries changed (at positions of `mask`, when given)."""
        dims = torch.as_tensor(self.dims, dtype=torch.long, device=h.device)
        values = torch.as_tensor(self.values, dtype=h.dtype, device=h.device)
        out = h.clone()
        if self.select is None:
            out[..., dims] = values.expand(*h.shape[:-1], len(self.dims))
            n = (int(mask.sum()) if mask is not None else int(np.prod(h.shape[:-1]))) * len(self.dims)
            return out, n
        select = torch.as_tensor(self.select, dtype=torch.long, device=h.device)
        hit = h[..., select].abs() > float(self.cutoff)  # type: ignore[arg-type]
        out[..., dims] = torch.where(hit, values, h[..., dims])
        if mask is not None:
            hit = hit & mask[..., None].to(torch.bool)
        return out, int(hit.sum())


class SiteHook:
    """A hook on one site of one layer: records the site's tensor (`seen`) in each forward pass and,
    with an `edit`, replaces it by the edited one (`n_edited` counts the entries changed)."""

    def __init__(self, model: torch.nn.Module, site: str, layer: int, edit: Edit | None = None) -> None:
        self.model = model
        self.edit = edit
        self.mask: torch.Tensor | None = None  # (batch, length): the real positions of the next pass
        self.seen: torch.Tensor | None = None
        self.n_edited = 0
        config: Any = model.config
        n_blocks = int(config.num_hidden_layers)
        if not 0 <= layer <= n_blocks:
            raise InputError(f"`layers`: {layer} is not a layer of this model (0 = the embedding output ... {n_blocks})",
                             param="layers")
        if site == DEFAULT_SITE:
            blocks = find_blocks(model)
            self.module, self.take = ((f"{blocks}.0", "input") if layer == 0 else (f"{blocks}.{layer - 1}", "output"))
        else:
            if layer == 0:
                raise InputError(f"`layers`: site {site} exists at layers 1..{n_blocks}; layer 0 (the embedding output) "
                                 "holds resid_post only", param="layers")
            capture = resolve_sites(model, [site], [layer])[0]
            self.module, self.take = capture.module_at(layer), capture.take
        self._handle: Any = None

    def describe(self) -> str:
        return f"the {self.take} of `{self.module}`"

    def __enter__(self) -> SiteHook:
        module = self.model.get_submodule(self.module)
        if self.take == "input":
            self._handle = module.register_forward_pre_hook(self._pre_hook, with_kwargs=True, prepend=True)
        else:
            # first among the module's hooks: transformers records hidden states with a forward hook of its own,
            # which must see the edited output
            self._handle = module.register_forward_hook(self._hook, prepend=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _change(self, h: torch.Tensor) -> torch.Tensor:
        self.seen = h
        if self.edit is None:
            return h
        mask = self.mask if self.mask is not None and tuple(self.mask.shape) == tuple(h.shape[:-1]) else None
        edited, n = self.edit.apply(h, mask)
        self.n_edited += n
        return edited

    def _hook(self, _module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (self._change(output[0]), *output[1:])
        if isinstance(output, list):
            return [self._change(output[0]), *output[1:]]
        return self._change(output)

    def _pre_hook(self, _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (self._change(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": self._change(kwargs["hidden_states"])}
        raise InputError(f"the input of `{self.module}` is neither a positional argument nor `hidden_states`; give another site",
                         param="sites")
