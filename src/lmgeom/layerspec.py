"""The one grammar of a set of layers, for every command and function that takes one.

A spec is a comma-separated list of items, in the model's numbering (layer 0 = the embedding output,
layer L = the output of the last block):

- ``N``: layer N; ``-N``: the N-th layer from the end (``-1`` is the last);
- ``A-B``: layers A to B, both included (``0-3``; A and B not negative);
- ``first``, ``last``; ``all``: every layer;
- ``every:K``: every K-th layer from 0, and the last;
- ``default``, where the command offers one: the first, the middle and the last layer.

A sequence of layer numbers is taken as the list of its items (negative ones counting from the end).
The layers are resolved against those `available` (a store's stored layers, or every layer of the
model before an extraction): the result is ascending and without repeats, and a layer that is not
available is refused, naming the ones that are.
"""

from __future__ import annotations

from typing import Sequence, Union

from lmgeom.errors import InputError, OutOfRange

LayerSpec = Union[str, Sequence[int], None]

GRAMMAR = ("'all', 'first', 'last', layer numbers (negative from the end: -1 is the last), ranges ('0-3') "
           "and 'every:K', comma-separated (e.g. '0,6,-1' or '0-3,last')")


def select_layers(spec: LayerSpec, available: Sequence[int], *, n_layers: int | None = None, param: str = "layers",
                  default: LayerSpec = "all") -> list[int]:
    """The layers of `spec` (None: `default`, itself a spec) among `available` (ascending layer numbers of
    the model's numbering; `n_layers`, the model's layer count, sets where negative numbers and 'last'
    count from: by default one past the last available layer). 'default' names the first available
    layer, the available layer nearest the middle (L // 2, the smaller on a tie) and the last."""
    available = sorted(int(layer) for layer in available)
    if not available:
        raise InputError(f"`{param}`: there are no layers to choose from", param=param)
    total = available[-1] + 1 if n_layers is None else int(n_layers)
    last = total - 1
    if spec is None:
        spec = default if default is not None else "all"
    items: list[str | int] = ([item.strip() for item in spec.split(",")] if isinstance(spec, str)
                              else [int(item) for item in spec])
    chosen: set[int] = set()
    try:
        for item in items:
            if isinstance(item, int):
                chosen.add(item + total if item < 0 else item)
            elif item in ("all", "every:1"):
                chosen.update(available)
            elif item == "first":
                chosen.add(available[0])
            elif item == "last":
                chosen.add(last)
            elif item == "default":
                middle = min(available, key=lambda layer: (abs(layer - last // 2), layer))
                chosen.update({available[0], middle, available[-1]})
            elif item.startswith("every:"):
                step = int(item.removeprefix("every:"))
                if step < 1:
                    raise ValueError(item)
                chosen.update([*(layer for layer in range(0, total, step) if layer in available), available[-1]])
            elif "-" in item[1:]:
                low, high = (int(end) for end in item.split("-", 1))
                if low < 0 or low > high:
                    raise ValueError(item)
                chosen.update(range(low, high + 1))
            else:
                number = int(item)
                chosen.add(number + total if number < 0 else number)
    except ValueError:
        raise InputError(f"`{param}` takes {GRAMMAR}; got {spec!r}", param=param) from None
    missing = sorted(layer for layer in chosen if layer not in available)
    if missing or not chosen:
        named = (f"layer{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} {'are' if len(missing) > 1 else 'is'}"
                 if missing else "no layer is")
        among = (f"the model's layers 0..{last}" if available == list(range(total))
                 else f"the stored layers {', '.join(map(str, available))} of the model's 0..{last}")
        raise OutOfRange(f"`{param}` {spec!r}: {named} not among {among} (0 = embedding output)", param=param)
    return sorted(chosen)
