"""One name per concept across the commands: each old spelling still works, warns on standard error
naming the current one and parses to the same options; every command's help at 80 columns shows every
option name whole; a wide result table is split into parts rather than cut."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import typer
from typer.testing import CliRunner

from lmgeom.cli.common import OldSpellings, respell
from lmgeom.cli.main import app

COMMAND = typer.main.get_command(app)


def leaves(command: Any = COMMAND, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of `lmgeom` (subcommands of groups included) with the words that invoke it."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from leaves(sub, (*path, name))
    else:
        yield path, command


COMMANDS = dict(leaves())


def option_names(command: Any) -> list[str]:
    return [name for param in command.params if param.param_type_name == "option" and not param.hidden
            for name in (*param.opts, *param.secondary_opts)]


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_name_is_whole_in_the_help_at_80_columns(path: tuple[str, ...]) -> None:
    outcome = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert outcome.exit_code == 0, outcome.output
    assert max(len(line) for line in outcome.output.splitlines()) <= 80
    for name in option_names(COMMANDS[path]):
        assert re.search(re.escape(name) + r"(?![\w-])", outcome.output), f"{' '.join(path)}: {name} cut or missing"
    old = getattr(COMMANDS[path], "old_spellings", {})
    for name in old:  # hidden: an old spelling is not offered
        assert not re.search(re.escape(name) + r"(?![\w-])", outcome.output), f"{' '.join(path)}: {name} shown"


def test_every_old_spelling_names_an_option_of_its_command() -> None:
    seen = 0
    for path, command in COMMANDS.items():
        if isinstance(command, OldSpellings):
            names = {name for param in command.params if param.param_type_name == "option"
                     for name in (*param.opts, *param.secondary_opts)}
            for old, new in command.old_spellings.items():
                seen += 1
                assert old not in names, f"{' '.join(path)}: {old} is still a current spelling"
                assert not new or new in names, f"{' '.join(path)}: {old} -> {new}, which it lacks"
    assert seen >= 25


class Recorder:
    """A stage function's stand-in: records its arguments and ends the command (exit 0)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        raise typer.Exit(0)


def _store(path: Any) -> str:
    return f"opened {path}"


STORE_OPEN = ("lmgeom.store.RepresentationStore.open", _store)

# (command words, stage function the command calls, old arguments, current arguments, what both must parse to)
Case = tuple[str, str, list[str], list[str], Callable[[tuple[Any, ...], dict[str, Any]], Any], Any]
CASES: list[Case] = [
    ("calibrate", "lmgeom.stages.calibrate_store", ["calibrate", "S", "--layer", "0", "--layer", "3", "--method", "abtt"],
     ["calibrate", "S", "--layers", "0,3", "--methods", "abtt"], lambda a, k: (a[1].layers, a[1].methods), ("0,3", ("abtt",))),
    ("calibrate", "lmgeom.stages.calibrate_store", ["calibrate", "S", "-l", "1", "-l2", "--layer=-1"],
     ["calibrate", "S", "--layers", "1,2,-1"], lambda a, k: a[1].layers, "1,2,-1"),
    ("calibrate", "lmgeom.stages.calibrate_store", ["calibrate", "S", "--no-include-punct", "--no-include-special"],
     ["calibrate", "S"], lambda a, k: (a[1].include_punct, a[1].include_special, a[1].methods),
     (False, False, ("whitening", "abtt"))),
    ("run", "lmgeom.pipeline.run", ["run", "--method", "whitening"], ["run", "--methods", "whitening"],
     lambda a, k: k["methods"], ("whitening",)),
    ("analyze", "lmgeom.stages.analysis.analyze_store", ["analyze", "S", "--samples", "10"], ["analyze", "S", "--rows", "10"],
     lambda a, k: (a[0], a[1].n_samples), ("opened S", 10)),
    ("geometry", "lmgeom.stages.geometry.measure_geometry", ["geometry", "S", "--points", "300", "--boot", "10"],
     ["geometry", "S", "--rows", "300", "--bootstrap", "10"],
     lambda a, k: (a[1].analysis.geometry_rows, a[1].n_boot), (300, 10)),
    ("similarity", "lmgeom.stages.similarity.similarity_matrix",
     ["similarity", "S", "--measure", "cka", "--sample", "30", "--no-include-punct", "--no-exclude-first-word"],
     ["similarity", "S", "--measures", "cka", "--rows", "30"],
     lambda a, k: (a[2].measures, a[2].sample, a[2].include_punct, a[2].exclude_first_word), (("cka",), 30, False, False)),
    ("extract", "lmgeom.stages.extract_model",
     ["extract", "tiny-bert", "--out", "O", "--keep-special", "--dtype", "float16", "--no-overwrite", "--no-pretokenized"],
     ["extract", "tiny-bert", "--out", "O", "--include-special", "--storage-dtype", "float16"],
     lambda a, k: (a[0], k["encoder"].keep_special, k["options"].storage_dtype, k["options"].pretokenized, k["overwrite"]),
     ("tiny-bert", True, "float16", False, False)),
    ("extract", "lmgeom.stages.extract_model", ["extract", "tiny-bert", "--out", "O", "--no-special"],
     ["extract", "--model", "tiny-bert", "--out", "O"], lambda a, k: (a[0], k["encoder"].keep_special), ("tiny-bert", False)),
    ("sts", "lmgeom.stages.sts.run_sts", ["sts", "tiny-bert", "--data", "D", "--method", "abtt", "--no-special"],
     ["sts", "--model", "tiny-bert", "--data-dir", "D", "--methods", "abtt", "--exclude-special"],
     lambda a, k: (a[0], a[1], k["methods"], k["include_special"]), ("tiny-bert", Path("D"), ["abtt"], False)),
    ("sts", "lmgeom.stages.sts.run_sts", ["sts", "tiny-bert", "--data", "D", "--special"],
     ["sts", "tiny-bert", "--data-dir", "D", "--include-special"], lambda a, k: k["include_special"], True),
    ("experiment calibration", "lmgeom.stages.experiments.run_calibration",
     ["experiment", "calibration", "--model", "tiny-bert", "--task", "cola", "--data", "D", "--out", "O",
      "--method", "none,abtt", "--seed", "0,3", "--head", "logreg", "--workers", "1"],
     ["experiment", "calibration", "--model", "tiny-bert", "--task", "cola", "--data", "D", "--out", "O",
      "--methods", "none,abtt", "--seeds", "0,3", "--heads", "logreg", "--num-workers", "1"],
     lambda a, k: (k["methods"], k["options"].seeds, k["heads"], k["workers"]), (["none", "abtt"], (0, 3), ["logreg"], 1)),
    ("experiment layers", "lmgeom.stages.experiments.run_layers",
     ["experiment", "layers", "--model", "tiny-bert", "--task", "pos", "--data", "D", "--out", "O", "--seed", "0,4"],
     ["experiment", "layers", "--model", "tiny-bert", "--task", "pos", "--data", "D", "--out", "O", "--seeds", "0,4"],
     lambda a, k: k["options"].seeds, (0, 4)),
    ("experiment finetune-precheck", "lmgeom.stages.experiments.finetuning.run_precheck",
     ["experiment", "finetune-precheck", "--data", "D", "--out", "O", "--task", "cola", "--workers", "1"],
     ["experiment", "finetune-precheck", "--data", "D", "--out", "O", "--tasks", "cola", "--num-workers", "1"],
     lambda a, k: (k["tasks"], k["workers"]), (["cola"], 1)),
    ("experiment thesis", "lmgeom.stages.experiments.thesis.run_thesis",
     ["experiment", "thesis", "R.json", "--out", "O", "--resamples", "200"],
     ["experiment", "thesis", "R.json", "--out", "O", "--bootstrap", "200"], lambda a, k: k["n_resamples"], 200),
    ("experiment static-baselines", "lmgeom.stages.experiments.standins.run_static_baselines",
     ["experiment", "static-baselines", "--corpus", "lee", "--out", "O", "--method", "word2vec"],
     ["experiment", "static-baselines", "--corpus", "lee", "--out", "O", "--methods", "word2vec"],
     lambda a, k: k["methods"], ["word2vec"]),
    ("export sentence-transformers", "lmgeom.stages.export.export_sentence_transformer",
     ["export", "sentence-transformers", "minilm", "--method", "abtt", "--out", "O", "--no-overwrite"],
     ["export", "sentence-transformers", "--model", "minilm", "--method", "abtt", "--out", "O"],
     lambda a, k: (a[0], k["method"], k["overwrite"]), ("minilm", "abtt", False)),
    ("elmo train", "lmgeom.elmo.train.train", ["elmo", "train", "--out", "O", "--no-overwrite"], ["elmo", "train", "--out", "O"],
     lambda a, k: k["overwrite"], False),
]


def settled(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's arguments as text, without the progress object (its own in each call)."""
    def keep(value: Any) -> bool:
        return type(value).__name__ != "RichProgress"

    return repr(([a for a in args if keep(a)], {k: v for k, v in kwargs.items() if keep(v)}))


def invoke_recorded(monkeypatch: pytest.MonkeyPatch, target: str, arguments: list[str]) -> tuple[Any, Recorder]:
    recorder = Recorder()
    module_name, _, name = target.rpartition(".")
    import importlib

    monkeypatch.setattr(importlib.import_module(module_name), name, recorder, raising=False)
    monkeypatch.setattr(*STORE_OPEN)
    with monkeypatch.context() as inner:
        inner.chdir(Path(__file__).parent)  # relative names (S, O, D) are never written: the stage is a stand-in
        outcome = CliRunner().invoke(app, arguments, env={"COLUMNS": "200"})
    return outcome, recorder


@pytest.mark.parametrize("command, target, old, new, parsed, expected", CASES,
                         ids=[f"{case[0]}: {' '.join(a for a in case[2] if a.startswith('-'))}" for case in CASES])
def test_an_old_spelling_warns_and_parses_as_the_current_one(monkeypatch: pytest.MonkeyPatch, command: str, target: str,
                                                            old: list[str], new: list[str], parsed: Any, expected: Any) -> None:
    old_outcome, old_calls = invoke_recorded(monkeypatch, target, old)
    new_outcome, new_calls = invoke_recorded(monkeypatch, target, new)
    assert old_outcome.exit_code == 0 and len(old_calls.calls) == 1, old_outcome.output
    assert new_outcome.exit_code == 0 and len(new_calls.calls) == 1, new_outcome.output
    assert parsed(*old_calls.calls[0]) == expected
    assert parsed(*new_calls.calls[0]) == expected
    # the whole call, not only the checked values: nothing else differs (but the progress bars' object)
    assert settled(*old_calls.calls[0]) == settled(*new_calls.calls[0])
    assert "warning" not in new_outcome.stderr
    spellings = COMMANDS[tuple(command.split())].old_spellings  # type: ignore[attr-defined]
    for word in (a.partition("=")[0] for a in old if a.startswith("-")):
        old_name = word if word in spellings else word[:2]
        if old_name in spellings:
            current = spellings[old_name]
            assert f"warning: {old_name} " in old_outcome.stderr, old_outcome.stderr
            assert (f"write {current}" in old_outcome.stderr or f"leave it out" in old_outcome.stderr
                    or f"read as {current}" in old_outcome.stderr)
    assert "warning" not in old_outcome.stdout


def test_joined_old_values_say_what_they_were_read_as(monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, calls = invoke_recorded(monkeypatch, "lmgeom.stages.calibrate_store",
                                     ["calibrate", "S", "--layer", "0", "--layer", "3"])
    assert outcome.exit_code == 0 and calls.calls[0][0][1].layers == "0,3"
    assert "--layer is the old spelling of --layers" in outcome.stderr
    assert "read as --layers 0,3" in " ".join(outcome.stderr.split())


def test_an_option_given_under_both_spellings_is_refused() -> None:
    outcome = CliRunner().invoke(app, ["geometry", "S", "--rows", "10", "--points", "20"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 2
    assert "give --rows only: --points is its old spelling" in " ".join(outcome.output.split())
    outcome = CliRunner().invoke(app, ["calibrate", "S", "--layers", "0", "--layer", "1"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 2 and "give --layers only" in outcome.output
    outcome = CliRunner().invoke(app, ["similarity", "S", "--include-punct", "--no-include-punct"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 2
    assert "give --include-punct or leave it out: --no-include-punct is the old spelling of leaving it out" in " ".join(
        outcome.output.split())


def test_respell_rewrites_options_only() -> None:
    geometry = COMMANDS[("geometry",)]
    spellings = {"--points": "--rows", "--boot": "--bootstrap"}
    # an option's value that reads like an old spelling is a value; after `--` nothing is an option
    assert respell(geometry, ["S", "--out", "--points"], spellings) == ["S", "--out", "--points"]
    assert respell(geometry, ["S", "--", "--boot"], spellings) == ["S", "--", "--boot"]
    assert respell(geometry, ["S", "--boot=5", "--points", "7"], spellings) == ["S", "--bootstrap", "5", "--rows", "7"]
    calibrate = COMMANDS[("calibrate",)]
    layers = {"--layer": "--layers", "-l": "--layers"}
    assert respell(calibrate, ["S", "-l0", "--layer=-1", "-m", "abtt"], layers, ["--layers"]) == [
        "S", "--layers", "0,-1", "-m", "abtt"]
    assert respell(calibrate, ["S", "--layer", "2"], layers) == ["S", "--layers", "2"]


def test_the_model_as_argument_or_option() -> None:
    both = CliRunner().invoke(app, ["extract", "tiny-bert", "--model", "tiny-gpt2", "--out", "O"], env={"COLUMNS": "200"})
    assert both.exit_code == 2 and "give the model once" in " ".join(both.output.split())
    neither = CliRunner().invoke(app, ["sts", "--data-dir", "D"], env={"COLUMNS": "200"})
    assert neither.exit_code == 2 and "give a model: lmgeom sts MODEL, or lmgeom sts --model MODEL" in " ".join(neither.output.split())


def test_calibrate_and_run_fit_the_same_methods_by_default() -> None:
    from lmgeom.calibrate import DEFAULT_METHODS, METHOD_NAMES
    from lmgeom.cli.calibrate import parse_methods
    from lmgeom.stages.calibration import CalibrationOptions

    defaults = {path: next(p.default for p in COMMANDS[path].params if p.name in ("method", "methods"))
                for path in (("calibrate",), ("run",))}
    assert defaults == {("calibrate",): "whitening,abtt", ("run",): "whitening,abtt"}
    assert CalibrationOptions().methods == DEFAULT_METHODS == ("whitening", "abtt")
    assert parse_methods("all") == METHOD_NAMES and parse_methods("cie, flow") == ("cie", "flow")


def test_a_wide_experiment_table_is_split_into_parts_at_80_columns(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from lmgeom.cli import common
    from lmgeom.cli.experiment import print_summaries

    monkeypatch.setattr(common.console, "_width", 80)
    summaries = [{"split": "validation", "head": "logreg", "method": method, "metric": "matthews_corrcoef", "mean": 0.41234,
                  "std": 0.01234, "n_seeds": 3, "difference": 0.0123, "p_holm": 0.0123, "significant": True,
                  "trivial": {"p_value": 0.00123}, "uninformative": False} for method in ("none", "whitening", "conceptor")]
    print_summaries(summaries, "method", "tiny-bert on cola: calibration (frozen, top)")
    text = capsys.readouterr().out
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for cell in ("matthews_corrcoef", "whitening", "conceptor", "0.4123 ± 0.0123", "+0.0123", "0.0123 *", "p=0.00123 beats"):
        assert cell in text
    assert "(1 of " in text
