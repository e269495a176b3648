"""Capture sites (`lmgeom.sitespec`) on a transformers model: which module each named site is, per
model family (`FAMILIES`, the table docs/models.md shows), and the forward hooks that catch them.

Layers keep the store's numbering: layer 0 is the embedding output and holds `resid_post` only;
layer l >= 1 is block l, the block the model's module tree numbers l - 1 (`h.{i}` with i = l - 1).
`resid_post` is what Hugging Face returns as hidden state l (the last one after the final norm
where the model has one, unless the extraction asks for it before); every other site is caught by
a hook on a module: a forward hook for a module's output (its first element when it returns a
tuple), a forward pre-hook for its input (its first positional argument, or `hidden_states` when
passed by keyword).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import torch

from lmgeom.errors import InputError
from lmgeom.sitespec import BLOCK_INDEX, DEFAULT_SITE, INPUT_SUFFIX, NAMED_SITES, site_folder


@dataclass(frozen=True)
class Family:
    """Where a family of models keeps its blocks (`blocks`, a `ModuleList`) and which module of a
    block each named site is (`sites`: a path below the block, `""` for the block itself, ending
    in `:input` for the module's input). `rule` says which sums are exact, in site names."""

    name: str
    model_types: tuple[str, ...]
    blocks: str
    sites: Mapping[str, str]
    rule: str


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", ("gpt2",), "h",
           MappingProxyType({"resid_pre": INPUT_SUFFIX, "attn_out": "attn", "mlp_out": "mlp", "resid_mid": "ln_2" + INPUT_SUFFIX}),
           "pre-LN: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out = resid_pre + attn_out + mlp_out"),
    Family("llama", ("llama",), "layers",
           MappingProxyType({"resid_pre": INPUT_SUFFIX, "attn_out": "self_attn", "mlp_out": "mlp",
                             "resid_mid": "post_attention_layernorm" + INPUT_SUFFIX}),
           "pre-LN: resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out = resid_pre + attn_out + mlp_out"),
    Family("gemma3", ("gemma3_text",), "layers",
           MappingProxyType({"resid_pre": INPUT_SUFFIX, "attn_out": "post_attention_layernorm",
                             "mlp_out": "post_feedforward_layernorm", "resid_mid": "pre_feedforward_layernorm" + INPUT_SUFFIX}),
           "sandwich norms, attn_out and mlp_out taken after post_attention_layernorm and post_feedforward_layernorm: "
           "resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out = resid_pre + attn_out + mlp_out"),
    Family("bert", ("bert",), "encoder.layer",
           MappingProxyType({"resid_pre": INPUT_SUFFIX, "attn_out": "attention.output.dense", "mlp_out": "output.dense",
                             "resid_mid": "attention.output.LayerNorm"}),
           "post-LN: resid_mid = LN1(resid_pre + attn_out), resid_post = LN2(resid_mid + mlp_out); the sums are exact "
           "at the norms' inputs (encoder.layer.{i}.attention.output.LayerNorm:input = resid_pre + attn_out, "
           "encoder.layer.{i}.output.LayerNorm:input = resid_mid + mlp_out), not after the norms"),
)
"""The named sites of each model family, by `config.model_type` (SmolLM2 is a Llama, MiniLM a BERT)."""


def family_of(model: torch.nn.Module) -> Family | None:
    """The family of `model` (by its `config.model_type`), or None when no row of `FAMILIES` has it."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return next((family for family in FAMILIES if model_type in family.model_types), None)


@dataclass(frozen=True)
class SiteCapture:
    """A site resolved on a model: the module (`module`, with `{i}` for the block index; "" for
    `resid_post`, the model's hidden states), what is taken (`output`, `input` or `hidden_states`)
    and the store layers it fills."""

    site: str
    module: str
    take: str
    layers: tuple[int, ...]

    def module_at(self, layer: int) -> str:
        """The module path of this site in store layer `layer` (block `layer - 1` of the module tree)."""
        return self.module.replace(BLOCK_INDEX, str(layer - 1))

    def settings(self) -> dict[str, Any]:
        """What a store records of this site (its meta.json's `sites`)."""
        return {"folder": site_folder(self.site), "layers": list(self.layers), "module": self.module or "hidden_states",
                "take": self.take}


def find_blocks(model: torch.nn.Module) -> str:
    """The path of the model's blocks: its family's (`FAMILIES`), else the first `ModuleList` of as
    many modules as the config has hidden layers."""
    family = family_of(model)
    if family is not None:
        return family.blocks
    n_blocks = int(getattr(model.config, "num_hidden_layers", -1))
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_blocks:
            return name
    raise InputError(f"{type(model).__name__}: no list of {n_blocks} blocks found, so no site but resid_post can be "
                     "placed in a layer; leave `sites` out", param="sites")


def resolve_sites(model: torch.nn.Module, sites: Sequence[str], layers: Iterable[int]) -> list[SiteCapture]:
    """The sites (`lmgeom.sitespec.parse_sites`' output) on `model`, each with the store layers it
    fills among `layers` (the stored layers): `resid_post` all of them, a site of every block those
    from 1, a module path without `{i}` the layer of its block.

    Parameters
    ----------
    model : torch.nn.Module
        The loaded `AutoModel`.
    sites : sequence of str
        Named sites or module paths, `resid_post` among them.
    layers : iterable of int
        The layers the store holds, in its numbering (0 = the embedding output).

    Returns
    -------
    list of SiteCapture
        One per site, in the order given.

    Raises
    ------
    InputError
        A named site on a model family without a row in `FAMILIES`, a module path that is not in
        the model, a site with no layer among `layers`, or two sites stored in one folder.
    """
    layers = sorted(int(layer) for layer in layers)
    config: Any = model.config
    n_blocks = int(config.num_hidden_layers)
    family = family_of(model)
    names = dict(model.named_modules())
    captures: list[SiteCapture] = []
    folders: dict[str, str] = {}
    for site in sites:
        if site == DEFAULT_SITE:
            captures.append(SiteCapture(site, "", "hidden_states", tuple(layers)))
            continue
        if site in NAMED_SITES:
            if family is None:
                known = ", ".join(t for f in FAMILIES for t in f.model_types)
                raise InputError(f"`sites`: {site} is tabled for the model types {known}, not for "
                                 f"{getattr(config, 'model_type', type(model).__name__)!r}; give the module as a path "
                                 f"instead (e.g. '{find_blocks(model)}.{{i}}.mlp')", param="sites")
            below = family.sites[site]
            path = f"{family.blocks}.{BLOCK_INDEX}" + ("" if below.startswith(":") else ".") + below
        else:
            path = site
        module, take = (path[: -len(INPUT_SUFFIX)], "input") if path.endswith(INPUT_SUFFIX) else (path, "output")
        if BLOCK_INDEX in module:
            site_layers = [layer for layer in layers if layer >= 1]
        else:
            site_layers = [_block_layer(model, module, site)]
            if site_layers[0] not in layers:
                raise InputError(f"`sites`: {site} is in layer {site_layers[0]}, which is not among the stored layers "
                                 f"{layers}; store it (`store_layers`) or give another site", param=("sites", "store_layers"))
        if not site_layers:
            raise InputError(f"`sites`: {site} exists at layers 1..{n_blocks} (layer 0, the embedding output, holds "
                             f"resid_post only), and none of those is stored ({layers}); store some (`store_layers`)",
                             param=("sites", "store_layers"))
        for layer in site_layers:
            at = module.replace(BLOCK_INDEX, str(layer - 1))
            if at not in names:
                parent = at.rsplit(".", 1)[0] if "." in at else ""
                children = sorted(name.rsplit(".", 1)[-1] for name in names if name.startswith(parent + ".")
                                  and name.count(".") == parent.count(".") + 1) if parent in names else []
                hint = f"; `{parent}` holds {', '.join(children)}" if children else ""
                raise InputError(f"`sites`: {site} names the module `{at}`, which {type(model).__name__} does not "
                                 f"have{hint}", param="sites")
        folder = site_folder(site)
        if folder in folders:
            raise InputError(f"`sites`: {site} and {folders[folder]} would be stored in one folder ({folder}); "
                             "give one of them", param="sites")
        folders[folder] = site
        captures.append(SiteCapture(site, module, take, tuple(site_layers)))
    return captures


def _block_layer(model: torch.nn.Module, module: str, site: str) -> int:
    """The store layer of a module path without `{i}`: its block's index + 1."""
    blocks = find_blocks(model)
    rest = module[len(blocks) + 1:] if module.startswith(blocks + ".") else ""
    index = rest.split(".", 1)[0]
    if not index.isdigit():
        raise InputError(f"`sites`: {site} is not inside one of the blocks ({blocks}.N...), so it has no layer; write "
                         f"a module of every block with {BLOCK_INDEX} ('{blocks}.{BLOCK_INDEX}.mlp') or one of a block "
                         f"('{blocks}.0.mlp')", param="sites")
    return int(index) + 1


def site_settings(model: torch.nn.Module, captures: Sequence[SiteCapture], last_layer: Mapping[str, Any]) -> dict[str, Any]:
    """What a store records about its sites: `sites` (each site's folder, layers, module and what is
    taken), `site_family` and `site_rule` (the family's row of `FAMILIES`, where it has one) and
    `site_last_layer`, which tensor the last layer's `resid_post` is."""
    family = family_of(model)
    config: Any = model.config
    n_layers = int(config.num_hidden_layers) + 1
    last = n_layers - 1
    position = last_layer.get("position")
    if position == "after final norm":
        note = (f"layer {last}'s resid_post is the model's last hidden state, after the final norm "
                f"`{last_layer.get('final_norm')}`, not block {last}'s output: the sums of `site_rule` hold at layers "
                f"1..{last - 1} (extract with `before_final_norm` to store block {last}'s output)")
    else:
        note = f"layer {last}'s resid_post is block {last}'s output ({position})"
    return {
        "sites": {capture.site: capture.settings() for capture in captures},
        "site_family": family.name if family else None,
        "site_rule": family.rule if family else None,
        "site_last_layer": note,
    }


class Capture:
    """Forward hooks (and pre-hooks, for inputs) catching every site but `resid_post` in each forward
    pass, while entered (`with Capture(model, captures) as caught:`); `pop()` hands the last pass's
    tensors, by (site, layer), and forgets them."""

    def __init__(self, model: torch.nn.Module, captures: Sequence[SiteCapture]) -> None:
        self.model = model
        self.captures = [capture for capture in captures if capture.site != DEFAULT_SITE]
        self._seen: dict[tuple[str, int], Any] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> Capture:
        for capture in self.captures:
            for layer in capture.layers:
                module = self.model.get_submodule(capture.module_at(layer))
                key = (capture.site, layer)
                if capture.take == "input":
                    self._handles.append(module.register_forward_pre_hook(self._input_hook(key), with_kwargs=True))
                else:
                    self._handles.append(module.register_forward_hook(self._output_hook(key)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._seen.clear()

    def _output_hook(self, key: tuple[str, int]) -> Any:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            self._seen[key] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def _input_hook(self, key: tuple[str, int]) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._seen[key] = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
        return hook

    def pop(self, shape: tuple[int, ...]) -> dict[tuple[str, int], Any]:
        """The tensors the last forward pass gave, each checked to be of `shape` (batch, length, dim)."""
        seen, self._seen = self._seen, {}
        for capture in self.captures:
            for layer in capture.layers:
                tensor = seen.get((capture.site, layer))
                where = f"site {capture.site} ({capture.take} of `{capture.module_at(layer)}`, layer {layer})"
                if tensor is None:
                    raise InputError(f"{where} was not reached in the forward pass; give another site", param="sites")
                if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape):
                    found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                    raise InputError(f"{where} gives {found}, not one vector of the model's width per position {tuple(shape)}; "
                                     "give a module whose output (or input) is the residual stream's shape", param="sites")
        return seen
